"""The first line a user without a GPU reads: before sglang imports anything.

sglang 0.5.17 imports its kernel and quantization modules before it loads any plugin, and on a
machine without CUDA they print 9-11 lines of warnings (Triton, AWQ, GGUF, CUDA_HOME, "Cannot
detect CUDA architecture", and ``python -m sglang.launch_server``'s own deprecation note) above
the launcher's one-line refusal (``gpu_check``). The wheel installs one line in site-packages,
``sglang_dynamic_eagle_first_contact.pth``, which Python runs at start-up: in a process whose
command line selects ``--speculative-algorithm EAGLE3_DYNAMIC`` it calls :func:`check`, which,
in sglang's launcher (``sglang serve``, ``python -m sglang.launch_server``), exits with
``gpu_check``'s one line when the machine certainly has no NVIDIA GPU. Every other
process pays one string search of its command line; this module is not imported there.

"Certainly": the NVIDIA driver library does not load, or ``CUDA_VISIBLE_DEVICES`` hides every
GPU. Anything less certain (a driver without a usable GPU) is left to the launcher's check,
which asks torch. No torch, no CUDA initialisation, standard library only. Registered in
``registry.server`` (drop it when sglang loads plugins before its kernel modules).
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Callable, Optional, Sequence

from sglang_dynamic_eagle.sglang_compat.gpu_check import NEEDS, RUN_ON_A_GPU

ALGORITHM = "EAGLE3_DYNAMIC"  # policy.ALGORITHM_NAME, not imported: this runs at interpreter start
FLAG = "--speculative-algorithm"
DRIVER_LIBRARY = "libcuda.so.1"
PTH_FILE = "sglang_dynamic_eagle_first_contact.pth"


def flag_value(argv: Sequence[str], flag: str) -> Optional[str]:
    """The value a command line gives ``flag`` (``--flag value`` or ``--flag=value``; the last
    one wins, as in argparse), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
        elif arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def selects_algorithm(argv: Sequence[str]) -> bool:
    """Whether a command line starts EAGLE3_DYNAMIC where sglang would look for CUDA: the
    algorithm selected, ``--device`` unset or ``cuda`` (the launcher's GPU check applies the
    same rule; an explicit other device is left to sglang)."""
    device = flag_value(argv, "--device")
    return ((flag_value(argv, FLAG) or "").upper() == ALGORITHM
            and (device is None or device.startswith("cuda")))


def launches_sglang(argv: Sequence[str], orig_argv: Sequence[str]) -> bool:
    """Whether the process is sglang's launcher: ``sglang ...`` (the console script) or
    ``python -m sglang....`` (at start-up ``sys.argv[0]`` is ``-m``; ``sys.orig_argv`` names the
    module). Other programs that take the same flags (a test's fake server, a wrapper) are left
    alone."""
    if argv and os.path.basename(argv[0]) == "sglang":
        return True
    modules = [orig_argv[i + 1] for i, arg in enumerate(orig_argv[:-1]) if arg == "-m"]
    return bool(argv) and argv[0] == "-m" and bool(modules) and modules[0].split(".")[0] == "sglang"


def _driver_loads() -> bool:
    try:
        ctypes.CDLL(DRIVER_LIBRARY)  # maps the library; no cuInit, no CUDA context
    except OSError:
        return False
    return True


def certainly_no_gpu(environ=os.environ, driver_loads: Callable[[], bool] = _driver_loads) -> Optional[str]:
    """What shows there is no NVIDIA GPU, or None when there may be one."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    if not driver_loads():
        return f"no NVIDIA driver: {DRIVER_LIBRARY} does not load"
    return None


def check(argv: Sequence[str], environ=os.environ, driver_loads: Callable[[], bool] = _driver_loads,
          stderr=None, exit_fn: Callable[[int], None] = os._exit,
          orig_argv: Optional[Sequence[str]] = None) -> None:
    """Exit with one line when sglang's launcher starts EAGLE3_DYNAMIC on a machine with no
    NVIDIA GPU. ``os._exit``: a ``SystemExit`` raised while Python runs a ``.pth`` line would
    print a traceback of ``site.py``."""
    orig = getattr(sys, "orig_argv", ()) if orig_argv is None else orig_argv
    if not (selects_algorithm(argv) and launches_sglang(argv, orig)):
        return
    reason = certainly_no_gpu(environ, driver_loads)
    if reason is None:
        return
    stream = stderr if stderr is not None else sys.stderr
    stream.write(f"error: {NEEDS}; found none ({reason}): {RUN_ON_A_GPU}.\n")
    stream.flush()
    exit_fn(1)
