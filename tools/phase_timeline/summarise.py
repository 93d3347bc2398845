#!/usr/bin/env python3
"""Per-prefill intervals from the timelines that ``sglang_phase_timeline`` wrote, per server.

    python3 tools/phase_timeline/summarise.py DIR [--min-reqs 1 --max-reqs 1]

For every prefill (a ``run_batch`` of an EXTEND batch): from the scheduler receiving requests
to the prefill's launch, the launch on the host (the target's part and the draft's), the GPU
time of the target extend and the draft prefill, the next batch's launch (with its wait for
the prefill's published sequence lengths), and the processing of the prefill's result, which
sends its first tokens. Prefills are grouped by the request count of the batch launched after
them (the running batch), so that a 1-request load can be read apart from a 4-request one.
Prints one markdown table per group: the median and the 80th percentile of each interval
(milliseconds), one column pair per server.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

EXTEND = "EXTEND"
NAN = float("nan")
TARGET_LAUNCH = "target extend launch (host)"


@dataclass(frozen=True)
class Record:
    phase: str
    mode: Optional[str]
    reqs: Optional[int]
    start_ns: int
    end_ns: int
    gpu_ms: Optional[float]

    @property
    def host_ms(self) -> float:
        return _ms(self.start_ns, self.end_ns)


@dataclass
class Timeline:
    algorithm: str
    records: List[Record] = field(default_factory=list)


def read_timeline(path: Path) -> Timeline:
    lines = path.read_text().splitlines()
    timeline = Timeline(json.loads(lines[0])["algorithm"])
    for line in lines[1:]:
        raw = json.loads(line)
        timeline.records.append(Record(raw["phase"], raw.get("mode"), raw.get("reqs"),
                                       raw["start_ns"], raw["end_ns"], raw.get("gpu_ms")))
    timeline.records.sort(key=lambda record: record.start_ns)
    return timeline


def _ms(start_ns: int, end_ns: int) -> float:
    return (end_ns - start_ns) / 1e6


def _first(records: List[Record], start: int, phase: str, mode: Optional[str] = None,
           stop_phase: Optional[str] = None) -> Optional[int]:
    """Index of the first record from ``start`` on of ``phase`` (and ``mode``, if given),
    or None if one of ``stop_phase`` comes first."""
    for index in range(start, len(records)):
        record = records[index]
        if record.phase == phase and (mode is None or record.mode == mode):
            return index
        if record.phase == stop_phase:
            return None
    return None


def _inner(records: List[Record], outer: int, phase: str) -> Optional[Record]:
    """The first ``phase`` record that starts and ends within the ``outer`` record."""
    for record in records[outer + 1:]:
        if record.start_ns > records[outer].end_ns:
            return None
        if record.phase == phase and record.end_ns <= records[outer].end_ns:
            return record
    return None


def _last_received(records: List[Record], launch: int) -> Optional[Record]:
    for record in reversed(records[:launch]):
        if record.phase == "recv":
            return record
        if record.phase == "run_batch":
            return None
    return None


def _host(record: Optional[Record]) -> float:
    return record.host_ms if record is not None else NAN


def _gpu(record: Optional[Record]) -> float:
    return record.gpu_ms if record is not None and record.gpu_ms is not None else NAN


def prefill_intervals(records: List[Record]) -> List[Dict[str, float]]:
    """One dict of intervals (ms) per prefill whose next launch and result processing were
    recorded; 'running_reqs' is the request count of the batch launched next."""
    intervals = []
    for index, launch in enumerate(records):
        if launch.phase != "run_batch" or launch.mode != EXTEND:
            continue
        following_index = _first(records, index + 1, "run_batch")
        result_index = _first(records, index + 1, "process_result", EXTEND)
        if following_index is None or result_index is None:
            continue
        following, result = records[following_index], records[result_index]
        received = _last_received(records, index)
        target = _inner(records, index, "target_forward")
        draft = _inner(records, index, "draft_prefill")
        intervals.append({
            "running_reqs": float(following.reqs or 0),
            "received → launch": _ms(received.end_ns, launch.start_ns) if received else NAN,
            "prefill launch (host)": launch.host_ms,
            TARGET_LAUNCH: _host(target),
            "draft prefill launch (host)": _host(draft),
            "target extend (GPU)": _gpu(target),
            "draft prefill (GPU)": _gpu(draft),
            "prefill end → next launch": _ms(launch.end_ns, following.start_ns),
            "next launch (host)": following.host_ms,
            "its wait for sequence lengths": _host(_inner(records, following_index, "resolve_seq_lens")),
            "next launch end → result processed": _ms(following.end_ns, result.start_ns),
            "result processing": result.host_ms,
            "prefill launch → result processed": _ms(launch.start_ns, result.end_ns),
        })
    return intervals


def percentile(values: List[float], fraction: float) -> float:
    """The ``fraction`` quantile of the values that are numbers (an interval a prefill did not
    have, such as a draft prefill that a short request's prefill skips, is NaN)."""
    values = sorted(v for v in values if v == v)
    if not values:
        return NAN
    return values[min(len(values) - 1, int(fraction * len(values)))]


def median(values: List[float]) -> float:
    numbers = [v for v in values if v == v]
    return statistics.median(numbers) if numbers else NAN


def table(by_server: Dict[str, List[Dict[str, float]]]) -> str:
    servers = list(by_server)
    sample = next(rows[0] for rows in by_server.values() if rows)
    keys = [key for key in sample if key != "running_reqs"]
    head = "| interval (ms) | " + " | ".join(f"{s} median | {s} p80" for s in servers) + " |"
    lines = [head, "| --- |" + " --- | --- |" * len(servers)]
    lines.append("| prefills | " + " | ".join(f"{len(by_server[s])} | " for s in servers) + " |")
    for key in keys:
        cells = []
        for server in servers:
            values = [row[key] for row in by_server[server]]
            cells.append(f"{median(values):.2f} | "
                         f"{percentile(values, 0.8):.2f}")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory")
    parser.add_argument("--groups", default="1,2-4",
                        help="running-request ranges to report apart (default %(default)s)")
    parser.add_argument("--host-speed-split", metavar="FAST_MS,SLOW_MS",
                        help="also report, within each group, the prefills whose target extend launch "
                             "took less than FAST_MS and at least SLOW_MS apart: the host's speed varies "
                             "over seconds, so that servers are compared at the same speed")
    args = parser.parse_args(argv)
    timelines = [read_timeline(path) for path in sorted(Path(args.directory).glob("timeline-*.jsonl"))]
    rows = {timeline.algorithm: prefill_intervals(timeline.records) for timeline in timelines}
    for group in args.groups.split(","):
        low, _, high = group.partition("-")
        low_n, high_n = int(low), int(high or low)
        selected = {server: [r for r in server_rows if low_n <= r["running_reqs"] <= high_n]
                    for server, server_rows in rows.items()}
        if not any(selected.values()):
            continue
        print(f"\n### Prefills followed by a batch of {group} requests\n")
        print(table(selected))
        if args.host_speed_split:
            fast_ms, slow_ms = (float(part) for part in args.host_speed_split.split(","))
            for label, keep in ((f"under {fast_ms:g} ms", lambda ms: ms < fast_ms),
                                (f"{slow_ms:g} ms or more", lambda ms: ms >= slow_ms)):
                split = {server: [r for r in rows_ if keep(r[TARGET_LAUNCH])]
                         for server, rows_ in selected.items()}
                if all(split.values()):
                    print(f"\n#### ... whose target extend launch took {label}\n")
                    print(table(split))
    return 0


if __name__ == "__main__":
    sys.exit(main())
