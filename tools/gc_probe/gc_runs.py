#!/usr/bin/env python3
"""The garbage collections a probed server ran during a benchmark's measured runs.

    python3 tools/gc_probe/gc_runs.py RESULTS GCPROBE_DIR [--min-ms 2]

RESULTS is ``benchmark/run.py``'s results.json(.xz), whose runs carry their start and end; the
probe's files (``sitecustomize.py``) carry each collection's end. Prints, per run, the full
collections and the others of at least ``--min-ms`` that ended in it (process, generation, milliseconds, seconds
into the run), and how many collections over it fell outside every run (start-up, warm-up).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, NamedTuple, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmark"))

from sweeplib.results import load_results  # noqa: E402


class Collection(NamedTuple):
    ended: float
    pid: int
    generation: int
    ms: float


def read_probe(folder: Path) -> List[Collection]:
    out = []
    for path in sorted(folder.glob("gc-*.txt")):
        for line in path.read_text().splitlines():
            ended, pid, generation, ms = line.split()[:4]
            out.append(Collection(float(ended), int(pid), int(generation), float(ms)))
    return sorted(out)


def report(document: dict, collections: Sequence[Collection], min_ms: float) -> str:
    slow = [c for c in collections if c.ms >= min_ms or c.generation == 2]
    inside = set()
    lines = [f"full collections and those of {min_ms:g} ms or more, by measured run:", ""]
    for run in document["runs"]:
        start, end = run.get("started_at"), run.get("ended_at")
        if start is None or end is None:
            continue
        hits = [c for c in slow if start <= c.ended <= end]
        inside.update(hits)
        text = "; ".join(f"pid {c.pid} gen {c.generation} {c.ms:.1f} ms at +{c.ended - start:.1f} s"
                         for c in hits) or "none"
        lines.append(f"{run['config']} {run['workload']} round {run['round']}: {text}")
    outside = [c for c in slow if c not in inside]
    longest = max((c.ms for c in outside), default=0.0)
    lines += ["", f"outside the runs: {len(outside)} (longest {longest:.0f} ms)"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("probe", type=Path)
    parser.add_argument("--min-ms", type=float, default=2.0)
    args = parser.parse_args(argv)
    print(report(load_results(args.results), read_probe(args.probe), args.min_ms), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
