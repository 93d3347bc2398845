#!/usr/bin/env python3
"""Steady decode speed per server and batch size, read from sglang's own decode log lines
("Decode batch, #running-req: N, ... gen throughput (token/s): X, #queue-req: Q"): the median X
over the lines at each running-request count, per server. Each line's X is sglang's tokens over
the time since its previous decode log line (``--decode-log-interval`` steps, 40 by default), so
an interval that held a prefill reads slower (in the closed runs of 2026-12-06 one speculative
line in two held one; a wave's first interval also holds the idle gap before it). Only intervals
without a prefill count (no "Prefill batch" line since the server's previous decode line; a
server's first decode line, whose interval starts before the log, and lines with requests queued
are left out); ``--with-prefill`` shows the others instead, idle gaps included. What it
separates is the speed at each batch size from the mix of batch sizes and from prefills; an
EAGLE3_DYNAMIC server's lines in plain mode count with its speculative ones. It relies on
sglang 0.5.17 logging a prefill when its result is processed, in the order the work ran; it
cannot tell apart the ranks of a data-parallel server writing one log, sees no prefills on a
disaggregated decode server, and counts an interval in which finished requests were not
replaced at the smaller batch logged at its end. A benchmark's ``server_logs_tail.txt``
(sections "===== NAME: last lines of the server log =====") or plain server logs, one server each.

    python3 tools/decode_rates.py benchmark/results/<folder>/server_logs_tail.txt[.xz] [--min-lines 3] [--with-prefill]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from sglang_dynamic_eagle.policy.replay import read_trace_text  # noqa: E402

SECTION = re.compile(r"^===== (\S+): last lines of the server log =====")
# "Decode batch [N]," with SGLANG_LOG_FORWARD_ITERS=1.
PREFILL = "Prefill batch"
DECODE = re.compile(r"Decode batch(?: \[\d+\])?, #running-req: (\d+),.*gen throughput \(token/s\): ([\d.]+), #queue-req: (\d+)")


def decode_rates(text: str, default_name: str = "server",
                 with_prefill: bool = False) -> Dict[str, Dict[int, List[float]]]:
    """{server: {running requests: [gen tokens/s of each decode log line]}} of the lines whose
    interval held no prefill (``with_prefill``: of those whose interval held one); lines with
    requests queued, and each server's first decode line, are left out (module docstring)."""
    rates: Dict[str, Dict[int, List[float]]] = {}
    name, after_decode, prefill_since = default_name, False, False
    for line in text.splitlines():
        section = SECTION.match(line)
        if section:
            name, after_decode, prefill_since = section.group(1), False, False
            continue
        if PREFILL in line:
            prefill_since = True
            continue
        decode = DECODE.search(line)
        if not decode:
            continue
        if after_decode and int(decode.group(3)) == 0 and prefill_since == with_prefill:
            rates.setdefault(name, {}).setdefault(int(decode.group(1)), []).append(float(decode.group(2)))
        after_decode, prefill_since = True, False
    return rates


def table(rates: Dict[str, Dict[int, List[float]]], min_lines: int) -> List[str]:
    names = list(rates)
    sizes = sorted({n for r in rates.values() for n, xs in r.items() if len(xs) >= min_lines})
    rows = ["| running requests | " + " | ".join(f"{n} (lines)" for n in names) + " |",
            "|" + " --- |" * (len(names) + 1)]
    for size in sizes:
        cells = []
        for name in names:
            xs = rates[name].get(size, [])
            cells.append(f"{statistics.median(xs):.0f} ({len(xs)})" if len(xs) >= min_lines else "-")
        rows.append(f"| {size} | " + " | ".join(cells) + " |")
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", type=Path, nargs="+", help="server_logs_tail.txt[.xz] or server logs")
    parser.add_argument("--min-lines", type=int, default=3, help="decode log lines a cell needs")
    parser.add_argument("--with-prefill", action="store_true", help="the intervals that held a prefill instead")
    args = parser.parse_args(argv)
    if args.min_lines < 1:
        parser.error(f"--min-lines {args.min_lines}: give 1 or more")
    rates: Dict[str, Dict[int, List[float]]] = {}
    for path in args.logs:
        if not path.is_file():
            parser.error(f"{path}: no such file")
        for name, by_size in decode_rates(read_trace_text(path), path.name.split(".")[0],
                                              args.with_prefill).items():
            # Several files: each server named with its file's folder, so none replaces another.
            rates[f"{path.parent.name}/{name}" if len(args.logs) > 1 else name] = by_size
    if not rates:
        print("No decode log lines of that kind without a queue (sglang logs one every --decode-log-interval steps).")
        return 1
    kind = "with a prefill" if args.with_prefill else "without a prefill"
    print(f"Median decode tokens/s by running requests (sglang's decode log, intervals {kind}, no queue), "
          f"{args.min_lines}+ lines:\n")
    print("\n".join(table(rates, args.min_lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
