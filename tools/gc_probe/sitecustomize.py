"""Garbage-collection probe for sglang servers (a diagnostic, not part of the package).

Put this folder first on a server's ``PYTHONPATH`` and set ``GCPROBE_DIR``; every Python process
of the server (HTTP and tokenizer, scheduler, detokenizer) then appends one line per collection
of generation 2, and per collection of any generation over ``SLOW_MS``, to
``$GCPROBE_DIR/gc-<pid>.txt``:

    wall time at the end, pid, generation, milliseconds, objects collected,
    objects tracked in generation 2 after it (-1 for younger generations), frozen objects, argv

With the benchmark: ``--server-env PYTHONPATH=$PWD/tools/gc_probe:$PYTHONPATH --server-env
GCPROBE_DIR=$PWD/DIR``; ``gc_runs.py`` lists what fell inside the measured runs. sglang's own
``SGLANG_LOG_GC=1`` logs every collection of the scheduler only. Counting generation 2's
objects after a full collection adds to that pause (about 16 ms at 0.9 million objects on a
development CPU), which the logged milliseconds leave out. A ``sitecustomize`` later on the path
is still imported.
"""

import gc
import importlib.machinery
import importlib.util
import os
import sys
import time

SLOW_MS = 2.0
_dir = os.path.abspath(os.environ["GCPROBE_DIR"]) if os.environ.get("GCPROBE_DIR") else None


def _write(generation: int, ms: float, collected) -> None:
    tracked = len(gc.get_objects(2)) if generation == 2 else -1
    line = (f"{time.time():.3f} {os.getpid()} {generation} {ms:.2f} {collected} {tracked} "
            f"{gc.get_freeze_count()} {' '.join(sys.argv[:3])[:120]}\n")
    with open(os.path.join(_dir, f"gc-{os.getpid()}.txt"), "a") as out:
        out.write(line)


def _callback(phase: str, info: dict, _started: dict = {}) -> None:  # noqa: B006 (state)
    generation = info.get("generation")
    if phase == "start":
        _started[generation] = time.perf_counter()
        return
    ms = 1000 * (time.perf_counter() - _started.get(generation, time.perf_counter()))
    if generation == 2 or ms > SLOW_MS:
        try:
            _write(generation, ms, info.get("collected"))
        except Exception:  # a probe never takes a server down
            pass


def _import_next_sitecustomize() -> None:
    """Python imports one ``sitecustomize``: import the one this folder hides, if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if _dir:
    os.makedirs(_dir, exist_ok=True)
    gc.callbacks.append(_callback)
_import_next_sitecustomize()
