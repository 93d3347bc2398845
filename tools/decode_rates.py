#!/usr/bin/env python3
"""Steady decode speed per server and batch size, read from sglang's own decode log lines
("Decode batch, #running-req: N, ... gen throughput (token/s): X, #queue-req: Q"): the median X
over the lines at each running-request count, per server. Each line's X is sglang's tokens over
the time since its previous decode log line (``--decode-log-interval`` steps, 40 by default),
prefills and idle gaps in it included: in a closed loop most intervals also hold the prefills of
the requests that replaced finished ones, so compare servers at the same load decoding in the
same mode (a faster decode leaves the prefills a larger share of each interval: a speculative
server's lines understate its lead over a plain one), not against a step model. What it separates is the speed at each batch size from the mix of batch
sizes. A cell of few lines mixes intervals with and without a prefill (read its lines where it
matters), and an EAGLE3_DYNAMIC server's lines in plain mode count with its speculative ones. A benchmark's
``server_logs_tail.txt`` (sections "===== NAME: last lines of the server log =====") or plain
server logs, one server each.

    python3 tools/decode_rates.py benchmark/results/<folder>/server_logs_tail.txt[.xz] [--min-lines 3]
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
DECODE = re.compile(r"Decode batch(?: \[\d+\])?, #running-req: (\d+),.*gen throughput \(token/s\): ([\d.]+), #queue-req: (\d+)")


def decode_rates(text: str, default_name: str = "server") -> Dict[str, Dict[int, List[float]]]:
    """{server: {running requests: [gen tokens/s of each decode log line]}}; lines with requests
    queued are left out (a queue means prefills interleave with the decode steps)."""
    rates: Dict[str, Dict[int, List[float]]] = {}
    name = default_name
    for line in text.splitlines():
        section = SECTION.match(line)
        if section:
            name = section.group(1)
            continue
        decode = DECODE.search(line)
        if decode and int(decode.group(3)) == 0:
            rates.setdefault(name, {}).setdefault(int(decode.group(1)), []).append(float(decode.group(2)))
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
    args = parser.parse_args(argv)
    if args.min_lines < 1:
        parser.error(f"--min-lines {args.min_lines}: give 1 or more")
    rates: Dict[str, Dict[int, List[float]]] = {}
    for path in args.logs:
        if not path.is_file():
            parser.error(f"{path}: no such file")
        for name, by_size in decode_rates(read_trace_text(path), default_name=path.name.split(".")[0]).items():
            # Several files: each server named with its file's folder, so none replaces another.
            rates[f"{path.parent.name}/{name}" if len(args.logs) > 1 else name] = by_size
    if not rates:
        print("No decode log lines without a queue (sglang logs one every --decode-log-interval steps).")
        return 1
    print(f"Median decode tokens/s by running requests (sglang's decode log, no queue), {args.min_lines}+ lines:\n")
    print("\n".join(table(rates, args.min_lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
