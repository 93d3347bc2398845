"""Summaries of the GPU kernel traces that sglang's ``/start_profile`` writes.

A trace is a Chrome trace (``*.trace.json.gz``) of the scheduler forward steps ``first_iter``
to ``first_iter + steps - 1`` (sglang's ``/start_profile`` with ``start_step``). The summary
holds, for the window: the kernels' summed GPU time by name, the GPU's busy time (the union of
kernel intervals) against the span from the first kernel's start to the last one's end (the
rest is the GPU waiting for the host), and the prompt tokens of the window's prefill batches,
read from the server log's prefill lines, which carry their forward step with
``SGLANG_LOG_FORWARD_ITERS=1``. (A batch's line is logged when its result is processed, one
step after it was launched, so the log's order is not the window's.) Under overlap scheduling
the GPU may still run the step before the window when tracing starts, and the window's last
step after it stops: each end can be off by part of a step.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Sequence, Tuple

GPU_EVENT_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
PREFILL_LINE = re.compile(r"Prefill batch \[(\d+)\],.*#new-token: (\d+)")
FORWARD_ITER = re.compile(r"(?:Prefill|Decode) batch \[(\d+)\]")


@dataclass
class KernelSummary:
    busy_us: float = 0.0
    span_us: float = 0.0
    kernels: int = 0
    by_name_us: Dict[str, float] = field(default_factory=dict)
    prefill_batches: int = 0
    prefill_tokens: int = 0

    @property
    def idle_share(self) -> float:
        return 1 - self.busy_us / self.span_us if self.span_us else 0.0

    def per_token_us(self, value_us: float) -> float:
        return value_us / self.prefill_tokens if self.prefill_tokens else 0.0


def gpu_intervals(events: Iterable[dict]) -> List[Tuple[str, float, float]]:
    """(name, start, end) in microseconds of every GPU event of a trace's ``traceEvents``."""
    return [
        (event.get("name", "?"), float(event["ts"]), float(event["ts"]) + float(event["dur"]))
        for event in events
        if event.get("ph") == "X" and event.get("cat") in GPU_EVENT_CATEGORIES
    ]


def union_length(intervals: Sequence[Tuple[float, float]]) -> float:
    total, covered_until = 0.0, float("-inf")
    for start, end in sorted(intervals):
        total += max(0.0, end - max(start, covered_until))
        covered_until = max(covered_until, end)
    return total


def summarise_events(events: Iterable[dict]) -> KernelSummary:
    intervals = gpu_intervals(events)
    summary = KernelSummary(kernels=len(intervals))
    if not intervals:
        return summary
    by_name: Dict[str, float] = defaultdict(float)
    for name, start, end in intervals:
        by_name[name] += end - start
    summary.by_name_us = dict(by_name)
    summary.busy_us = union_length([(start, end) for _, start, end in intervals])
    summary.span_us = max(end for _, _, end in intervals) - min(start for _, start, _ in intervals)
    return summary


def latest_forward_iter(log_lines: Iterable[str]) -> int:
    """The highest forward step in the log's batch lines (0 if none carries one)."""
    return max((int(m.group(1)) for m in map(FORWARD_ITER.search, log_lines) if m), default=0)


def prefill_in_window(log_lines: Iterable[str], first_iter: int, steps: int) -> Tuple[int, int]:
    """(prefill batches, prompt tokens) of the forward steps first_iter .. first_iter+steps-1."""
    batches = tokens = 0
    for match in map(PREFILL_LINE.search, log_lines):
        if match and first_iter <= int(match.group(1)) < first_iter + steps:
            batches += 1
            tokens += int(match.group(2))
    return batches, tokens


def trace_events(trace_path: Path) -> List[dict]:
    with gzip.open(trace_path, "rt") as trace:
        return json.load(trace).get("traceEvents", [])


def summarise_trace(trace_path: Path, server_log: Path, first_iter: int, steps: int) -> KernelSummary:
    summary = summarise_events(trace_events(trace_path))
    summary.prefill_batches, summary.prefill_tokens = prefill_in_window(
        server_log.read_text(errors="replace").splitlines(), first_iter, steps
    )
    return summary


def _short(name: str, width: int = 70) -> str:
    name = name.replace("|", "/")
    return name if len(name) <= width else name[: width - 3] + "..."


def _rows_side_by_side(rows, values: Dict[str, object]) -> List[str]:
    """One table line per (label, cell) with each configuration's cell of its value."""
    return [f"| {label} | " + " | ".join(cell(value) for value in values.values()) + " |"
            for label, cell in rows]


def _summed_by_name(per_config: Iterable[Dict[str, float]]) -> Dict[str, float]:
    """Microseconds by kernel name summed over the configurations (to rank the kernels)."""
    totals: Dict[str, float] = defaultdict(float)
    for by_name in per_config:
        for name, us in by_name.items():
            totals[name] += us
    return totals


def comparison_markdown(summaries: Dict[str, KernelSummary], top: int = 25) -> str:
    """Totals per prompt token and the ``top`` kernels by time, side by side."""
    configs = list(summaries)
    lines = ["| | " + " | ".join(configs) + " |", "| --- |" + " --- |" * len(configs)]
    rows = [
        ("prefill batches in the window", lambda s: f"{s.prefill_batches}"),
        ("prompt tokens in the window", lambda s: f"{s.prefill_tokens}"),
        ("kernels", lambda s: f"{s.kernels}"),
        ("GPU busy (ms)", lambda s: f"{s.busy_us / 1000:.1f}"),
        ("span (ms)", lambda s: f"{s.span_us / 1000:.1f}"),
        ("GPU idle share of the span", lambda s: f"{100 * s.idle_share:.1f}%"),
        ("GPU busy per prompt token (us)", lambda s: f"{s.per_token_us(s.busy_us):.3f}"),
        ("span per prompt token (us)", lambda s: f"{s.per_token_us(s.span_us):.3f}"),
    ]
    lines += _rows_side_by_side(rows, summaries)
    totals = _summed_by_name(summary.by_name_us for summary in summaries.values())
    names = sorted(totals, key=totals.get, reverse=True)[:top]
    lines += ["", f"Top {len(names)} kernels, GPU time per prompt token (us):", "",
              "| kernel | " + " | ".join(configs) + " |", "| --- |" + " --- |" * len(configs)]
    for name in names:
        cells = [f"{summaries[c].per_token_us(summaries[c].by_name_us.get(name, 0.0)):.4f}"
                 for c in configs]
        lines.append(f"| `{_short(name)}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def idle_before(events: Iterable[dict], min_gap_us: float = 5.0) -> Dict[str, Tuple[int, float]]:
    """The GPU's idle gaps (longer than ``min_gap_us``) by the GPU event that ends each:
    name -> (gaps, total us). The event that ends a gap is the first the host launched after
    the GPU ran out of work, so its gaps are host time on the step's critical path."""
    gaps: Dict[str, List[float]] = defaultdict(lambda: [0, 0.0])
    covered_until = None
    for name, start, end in sorted(gpu_intervals(events), key=lambda i: i[1]):
        if covered_until is not None and start - covered_until > min_gap_us:
            gaps[name][0] += 1
            gaps[name][1] += start - covered_until
        covered_until = end if covered_until is None else max(covered_until, end)
    return {name: (int(n), us) for name, (n, us) in gaps.items()}


def idle_markdown(traces: Dict[str, Path], top: int = 12) -> str:
    """The ``top`` idle gaps by the event that ends them, side by side: gaps, mean us, total ms."""
    gaps = {config: idle_before(trace_events(path)) for config, path in traces.items()}
    totals: Dict[str, float] = defaultdict(float)
    for by_name in gaps.values():
        for name, (_, us) in by_name.items():
            totals[name] += us
    configs = list(traces)
    lines = ["| GPU idle before | " + " | ".join(f"{c}: gaps, mean us, total ms" for c in configs)
             + " |", "| --- |" + " --- |" * len(configs)]
    for name in sorted(totals, key=totals.get, reverse=True)[:top]:
        cells = []
        for config in configs:
            n, us = gaps[config].get(name, (0, 0.0))
            cells.append(f"{n}, {us / n:.0f}, {us / 1000:.1f}" if n else "-")
        lines.append(f"| `{_short(name)}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@dataclass
class DecodeSteps:
    """Consecutive replays of a trace's most frequent large CUDA graph (the decode step at the
    window's batch size) and what the GPU did between them: the step's own graph against the
    work each mode adds around it (input preparation, result handling) and the GPU's idle time
    there (the host late with the next step)."""

    graph_kernels: int = 0
    steps: int = 0
    period_us: float = 0.0  # graph start to the next one's start, mean
    graph_span_us: float = 0.0  # first kernel start to last kernel end of a replay, mean
    between_busy_us: float = 0.0  # GPU busy between a replay's end and the next one's start, mean
    between_kernels: float = 0.0
    between_by_name_us: Dict[str, float] = field(default_factory=dict)  # per step

    @property
    def between_idle_us(self) -> float:
        return self.period_us - self.graph_span_us - self.between_busy_us


def decode_steps(events: Sequence[dict], min_graph_kernels: int = 100) -> DecodeSteps:
    """The decode steps of one trace: GPU events are matched to the host call that launched
    them by their ``correlation``; a graph replay is the events of one ``cudaGraphLaunch``.
    Only pairs of consecutive replays of the most frequent graph with at least
    ``min_graph_kernels`` kernels count, so a prefill run as CUDA graphs breaks the pair; an eager
    prefill between two decode graphs would count as work between them (in the traces this was
    written for, prefills ran as graphs). Work between graphs is clipped to the gap."""
    launches = {e["args"]["correlation"]: e["name"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    gpu = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_EVENT_CATEGORIES),
                 key=lambda e: e["ts"])
    replays: Dict[int, List[dict]] = defaultdict(list)
    for event in gpu:
        correlation = event.get("args", {}).get("correlation")
        if launches.get(correlation) == "cudaGraphLaunch":
            replays[correlation].append(event)
    graphs = sorted((min(e["ts"] for e in ks), max(e["ts"] + e["dur"] for e in ks), len(ks))
                    for ks in replays.values())
    sizes = [n for _, _, n in graphs if n >= min_graph_kernels]
    result = DecodeSteps(graph_kernels=max(set(sizes), key=sizes.count) if sizes else 0)
    by_name: Dict[str, float] = defaultdict(float)
    for (start, end, n), (next_start, _, next_n) in zip(graphs, graphs[1:]):
        if n != result.graph_kernels or next_n != n:
            continue
        between = [e for e in gpu if end <= e["ts"] < next_start
                   and launches.get(e.get("args", {}).get("correlation")) != "cudaGraphLaunch"]
        result.steps += 1
        result.period_us += next_start - start
        result.graph_span_us += end - start
        result.between_busy_us += union_length([(e["ts"], min(e["ts"] + e["dur"], next_start)) for e in between])
        result.between_kernels += len(between)
        for e in between:
            by_name[e["name"]] += e["dur"]
    if result.steps:
        for name in ("period_us", "graph_span_us", "between_busy_us", "between_kernels"):
            setattr(result, name, getattr(result, name) / result.steps)
        result.between_by_name_us = {k: v / result.steps for k, v in by_name.items()}
    return result


def decode_steps_markdown(traces: Dict[str, Path], top: int = 10, min_graph_kernels: int = 100) -> str:
    """Each trace's decode steps side by side, and the ``top`` kernels between the graphs."""
    steps = {config: decode_steps(trace_events(path), min_graph_kernels)
             for config, path in traces.items()}
    configs = list(traces)
    lines = ["| per decode step | " + " | ".join(configs) + " |", "| --- |" + " --- |" * len(configs)]
    rows = [("decode graph (kernels)", lambda s: f"{s.graph_kernels}"),
            ("consecutive steps", lambda s: f"{s.steps}"),
            ("period (us)", lambda s: f"{s.period_us:.0f}"),
            ("graph span (us)", lambda s: f"{s.graph_span_us:.0f}"),
            ("GPU busy between graphs (us)", lambda s: f"{s.between_busy_us:.0f}"),
            ("GPU idle between graphs (us)", lambda s: f"{s.between_idle_us:.0f}"),
            ("kernels between graphs", lambda s: f"{s.between_kernels:.1f}")]
    lines += _rows_side_by_side(rows, steps)
    totals = _summed_by_name(s.between_by_name_us for s in steps.values())
    for name in sorted(totals, key=totals.get, reverse=True)[:top]:
        lines.append(f"| `{_short(name)}` (us) | " + " | ".join(
            f"{steps[c].between_by_name_us.get(name, 0.0):.1f}" for c in configs) + " |")
    return "\n".join(lines) + "\n"


USAGE = ("usage: python3 tools/kernel_profile.py [--decode-steps] CONFIG=TRACE.json.gz [CONFIG=TRACE ...]"
         " (the GPU's idle gaps by the event that ends them; --decode-steps: each decode step's"
         " graph and the GPU work and idle time between graphs)")


def main(argv: Sequence[str]) -> str:
    decode = "--decode-steps" in argv
    pairs = [arg for arg in argv if arg != "--decode-steps"]
    if not pairs or any("=" not in arg for arg in pairs):
        raise SystemExit(USAGE)
    traces = {arg.split("=", 1)[0]: Path(arg.split("=", 1)[1]) for arg in pairs}
    return decode_steps_markdown(traces) if decode else idle_markdown(traces)


if __name__ == "__main__":
    import sys

    print(main(sys.argv[1:]), end="")
