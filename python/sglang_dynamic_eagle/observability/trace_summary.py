"""What a decode-step trace says, for an operator: ``sglang-dynamic-eagle trace FILE``.

A server started with ``SGLANG_DYNAMIC_EAGLE_TRACE=FILE`` records every decode step
(``observability.trace``). This reads it back: per time window (``--windows N`` equal spans of
the trace, or of ``--span A:B``, seconds A to B after its first step), the steps of each mode by batch range (graphs reach 256 on an H200) with their
measured time (median), output tokens per second (plain: one token per request; speculative:
the tokens its verifies yielded), the tokens per second the policy predicted for the mode at
those steps (median over steps without a queue, where it predicted at the batch that ran; absent
from older traces) and host microseconds
(median: the worker's own work / the mode's step call), so a prediction far from the outcome, a
slowdown, a mode held where the other served more, a host that paces
the GPU, or a batch range never measured shows at a glance. With the trace's configuration
line, the policy is replayed on the trace against the best mode choice knowing both modes'
costs (``policy.replay``): how far below it the policy's choices are, and speculating always or
never for comparison. Prefill batches (``prefill`` lines, absent from older traces) are summed
per prompt-token range: the target's and the draft's GPU time apart. The verifies' tokens per
request, over all of them and over each request's first ones (newer traces): far apart, the
requests accept differently and the slow ones hold the batch. Catch-ups (their GPU time: one
that compiles at a new shape stands out), host stalls (a step whose host time is many times
its mode's median: a compile, a garbage collection) and GPU stalls (a timed step twice the time
the policy predicted for it: a compile, another process on the GPU) are listed, and, where the trace has them,
the tokens and milliseconds the policy predicted for its speculative steps against the verified
and measured ones, and the time a new request waits for the decode step in flight before its
prefill (part of its time to first token), beside that wait were the same steps plain. A trace
in which one mode never ran a timed step is not replayed (a replay costs both modes from the
whole trace's own steps); it says so.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from sglang_dynamic_eagle.policy import DecodeMode, ThresholdPolicy, ThresholdPolicyConfig
from sglang_dynamic_eagle.policy.replay import (TraceStep, load_recorded, load_trace, oracle_rate,
                                                read_trace_text, recorded_world, simulate,
                                                throughput_policy_for)

BATCH_RANGES: Tuple[Tuple[int, Optional[int]], ...] = ((1, 8), (9, 32), (33, 128), (129, 256), (257, None))
PREFILL_RANGES: Tuple[Tuple[int, Optional[int]], ...] = ((1, 256), (257, 1024), (1025, 4096), (4097, None))
REPLAY_WINDOW = 256  # catch-up window of the replay (the server's default)
# A step's host time over this many times its mode's median is a stall (launches vary by a
# few times with the batch; a compile or a collection takes tens of milliseconds).
HOST_STALL_FACTOR = 10.0
# A timed step over this many times the milliseconds the policy predicted for it is a GPU stall:
# the cost model's error is a few percent (its prediction line), while a first-use compile
# (sglang's triton kernels, 68-127 ms on an H100) or another process on the GPU doubles a step.
GPU_STALL_FACTOR = 2.0


def _range_of(value: int, ranges=BATCH_RANGES) -> Tuple[int, str]:
    """(index, label) of the range of ``ranges`` that holds ``value``."""
    index, (low, high) = next((i, r) for i, r in enumerate(ranges) if r[1] is None or value <= r[1])
    return index, f"{low}-{high}" if high is not None else f">= {low}"


def span_indices(steps: Sequence[TraceStep], span: Optional[Tuple[float, float]]) -> Tuple[int, int]:
    """[first, end) of the steps decided from ``span[0]`` to ``span[1]`` seconds after the trace's
    first step (all of them without a span)."""
    if not steps:
        raise ValueError("no decode steps in the trace (is it a SGLANG_DYNAMIC_EAGLE_TRACE file?)")
    if span is None:
        return 0, len(steps)
    start = steps[0].t
    chosen = [i for i, s in enumerate(steps) if span[0] <= s.t - start <= span[1]]
    if not chosen:
        raise ValueError(f"no decode step from {span[0]:g} to {span[1]:g} s (the trace spans "
                         f"{steps[-1].t - start:.1f} s)")
    return chosen[0], chosen[-1] + 1


def summary_rows(steps: Sequence[TraceStep], windows: int = 1,
                 span: Optional[Tuple[float, float]] = None) -> List[Dict[str, object]]:
    """One row per (window, mode, batch range) with steps: steps, timed steps, median step ms,
    tokens per second over the timed ones (None without any), the median predicted tokens per
    second and median host microseconds ("worker / step call"; each None in traces without
    them). ``window_s``: the window's start, seconds after the trace's first step."""
    first, end = span_indices(steps, span)
    origin, steps = steps[0].t, steps[first:end]
    start, last = min(s.t for s in steps), max(s.t for s in steps)
    width = (last - start) / windows or 1.0
    groups: Dict[Tuple[int, DecodeMode, Tuple[int, str]], List[TraceStep]] = {}
    for step in steps:
        window = min(int((step.t - start) / width), windows - 1)
        groups.setdefault((window, step.mode, _range_of(step.batch)), []).append(step)
    offset = start - origin if span is not None else 0.0
    rows = []
    for (window, mode, (_, batches)), chosen in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1].value, g[0][2])):
        plain = mode is DecodeMode.PLAIN
        timed = [s for s in chosen if s.ms and (plain or s.spec_tokens)]
        served = sum(s.batch if plain else s.spec_tokens for s in timed)
        hosts = [s.host_us for s in chosen if s.host_us]
        predicted = [s.predicted for s in chosen if s.predicted is not None]
        rows.append({"window_s": round(offset + window * width, 1 if span else None), "mode": mode.value, "batch": batches, "steps": len(chosen),
                     "timed": len(timed), "median_ms": round(statistics.median(s.ms for s in timed), 2) if timed else None,
                     "tokens_per_s": round(1000 * served / sum(s.ms for s in timed)) if timed else None,
                     "predicted": round(statistics.median(predicted)) if predicted else None,
                     "host_us": " / ".join(f"{statistics.median(h[i] for h in hosts):.0f}" for i in (0, 1))
                     if hosts else None})
    return rows


def replay_regrets(path: Path, span: Optional[Tuple[float, float]] = None) -> Optional[Dict[str, float]]:
    """Below the best mode choice (0.05 = 5% fewer tokens per second), for the policy the trace's
    configuration builds and for speculating always / never; None without a configuration line.
    With a span, its steps costed by the whole trace's fit (as the replay tests cost a load)."""
    try:
        steps, meta = load_recorded(path)
    except ValueError:
        return None
    world = recorded_world(steps, meta).part(*span_indices(steps, span))
    best = oracle_rate(world, REPLAY_WINDOW)
    top = meta["max_speculative_batch"]
    policies = {"policy": throughput_policy_for(meta),
                "always speculate": ThresholdPolicy(ThresholdPolicyConfig(0, 0, 1, top)),
                "never speculate": ThresholdPolicy(ThresholdPolicyConfig(1, 0, 1, top),
                                                   initial_mode=DecodeMode.PLAIN)}
    return {name: 1.0 - simulate(policy, world, REPLAY_WINDOW).rate / best for name, policy in policies.items()}


def prefill_rows(records: Sequence[dict], origin: float,
                 span: Optional[Tuple[float, float]] = None) -> List[Dict[str, object]]:
    """Per prompt-token range, the trace's prefill batches (``prefill`` lines, read at ``origin``
    + the span): batches, median target and draft GPU milliseconds, the draft's total over the
    target's."""
    groups: Dict[Tuple[int, str], List[dict]] = {}
    for r in records:
        if r.get("k") == "prefill" and (span is None or span[0] <= r["t"] - origin <= span[1]):
            groups.setdefault(_range_of(r["tokens"], PREFILL_RANGES), []).append(r)
    return [{"tokens": label, "batches": len(chosen),
             "target_ms": round(statistics.median(r["target_ms"] for r in chosen), 2),
             "draft_ms": round(statistics.median(r["draft_ms"] for r in chosen), 2),
             "draft_share": round(sum(r["draft_ms"] for r in chosen) / max(1e-9, sum(r["target_ms"] for r in chosen)), 3)}
            for (_, label), chosen in sorted(groups.items())]


def _in_span(t: float, origin: float, span: Optional[Tuple[float, float]]) -> bool:
    return span is None or span[0] <= t - origin <= span[1]


def acceptance_line(records: Sequence[dict], origin: float,
                    span: Optional[Tuple[float, float]] = None) -> Optional[str]:
    """Tokens per verified request over the verifies (of the steps in the span), and over each
    request's first ones where the trace has them: what a request without verifies is priced at
    (``policy/acceptance.py``). Apart, they show requests that accept differently."""
    steps = {r["step"] for r in records if r.get("k") == "step" and _in_span(r["t"], origin, span)}
    verifies = [r for r in records if r.get("k") == "verify" and r["step"] in steps]
    count = sum(r["requests"] for r in verifies)
    if not count:
        return None
    line = f"Tokens per verified request: {sum(r['tokens'] for r in verifies) / count:.2f} over {count} verifies"
    first = sum(r.get("first_requests", 0) for r in verifies)
    if first:
        line += (f"; {sum(r.get('first_tokens', 0) for r in verifies) / first:.2f} over each request's first "
                 f"({first}: what a request without verifies is priced at)")
    return line


def catchup_line(records: Sequence[dict], origin: float,
                 span: Optional[Tuple[float, float]] = None) -> Optional[str]:
    """The catch-ups' count, tokens and GPU milliseconds (median, longest)."""
    chosen = [r for r in records if r.get("k") == "catchup" and _in_span(r["t"], origin, span)]
    if not chosen:
        return None
    longest = max(chosen, key=lambda r: r["ms"])
    return (f"Catch-ups: {len(chosen)}, {sum(r['tokens'] for r in chosen):,} tokens, median "
            f"{statistics.median(r['ms'] for r in chosen):.2f} ms, longest {longest['ms']:.1f} ms "
            f"({longest['tokens']:,} tokens)")


def _step_ms(records: Sequence[dict]) -> Dict[int, float]:
    """Each timed decode step's measured milliseconds, by step."""
    return {r["step"]: r["ms"] for r in records if r.get("k") == "time"}


def _timed_at_their_batch(records: Sequence[dict], times: Dict[int, float], origin: float,
                          span: Optional[Tuple[float, float]]) -> List[dict]:
    """The timed decode steps in the span that were predicted at the batch that ran (no ``pb``)."""
    return [r for r in records if r.get("k") == "step" and r["step"] in times and "pb" not in r
            and _in_span(r["t"], origin, span)]


def prediction_line(records: Sequence[dict], origin: float,
                    span: Optional[Tuple[float, float]] = None) -> Optional[str]:
    """Speculative steps without a queue (predicted at the batch that ran), timed and verified:
    the median tokens per step predicted against verified, and step milliseconds predicted
    against measured, so a misjudged acceptance shows apart from a misjudged step time."""
    times = _step_ms(records)
    tokens = {r["step"]: r["tokens"] for r in records if r.get("k") == "verify"}
    chosen = [r for r in records if r.get("k") == "step" and r["mode"] == "speculative" and not r["q"]
              and "ys" in r and "pt" in r and r["step"] in times and r["step"] in tokens
              and _in_span(r["t"], origin, span)]
    if not chosen:
        return None
    median = statistics.median
    ys, got = median(r["ys"] for r in chosen), median(tokens[r["step"]] for r in chosen)
    pt, took = median(r["pt"] for r in chosen), median(times[r["step"]] for r in chosen)
    return (f"Speculative steps without a queue ({len(chosen)} timed, medians): tokens per step predicted "
            f"{ys:.1f}, verified {got:.1f} ({100 * (ys / got - 1):+.1f}%); step time predicted {pt:.2f} ms, "
            f"measured {took:.2f} ({100 * (pt / took - 1):+.1f}%)")


def in_flight_wait_ms(step_ms: Sequence[float]) -> float:
    """Mean time a request arriving at random (Poisson) waits for the decode step in flight:
    it lands in a step with probability proportional to the step's length, half-way on average,
    so ``E[t^2] / (2 E[t])``."""
    return sum(t * t for t in step_ms) / (2 * sum(step_ms))


def overlap_wait_ms(step_ms: Sequence[float]) -> float:
    """On sglang's overlap loop (its default) the step after the one in flight was chosen when
    the one in flight began, so an arrival at a busy server waits for both before its prefill:
    ``E[t^2] / (2 E[t]) + E[t]``."""
    return in_flight_wait_ms(step_ms) + sum(step_ms) / len(step_ms)


def wait_line(records: Sequence[dict], origin: float,
              span: Optional[Tuple[float, float]] = None) -> Optional[str]:
    """The wait for the decode step in flight (before a new request's prefill can run: part of
    its time to first token), and with the step already chosen (overlap loop), over the timed
    steps and over the same steps were they plain, as the policy predicted them (``pp``, tokens
    per second; steps predicted at a larger projected batch than ran are left out of both)."""
    times = _step_ms(records)
    steps = _timed_at_their_batch(records, times, origin, span)
    if not steps:
        return None
    measured = [times[r["step"]] for r in steps]
    plain = [1000.0 * r["b"] / r["pp"] for r in steps] if all(r.get("pp") for r in steps) else None
    line = f"Wait of an arrival for the decode step in flight ({len(steps)} timed steps): {in_flight_wait_ms(measured):.2f} ms"
    if plain:
        line += f"; {in_flight_wait_ms(plain):.2f} ms were they plain (predicted)"
    line += f". With the step already chosen (overlap loop): {overlap_wait_ms(measured):.2f} ms"
    if plain:
        line += f"; {overlap_wait_ms(plain):.2f} ms were they plain"
    return line


def stall_line(records: Sequence[dict], origin: float,
               span: Optional[Tuple[float, float]] = None) -> Optional[str]:
    """Decode steps whose host time (the mode's step call) exceeds ``HOST_STALL_FACTOR`` times
    the median of that mode's steps: how many, and the longest with its step, mode and batch."""
    steps = {r["step"]: r for r in records if r.get("k") == "step" and _in_span(r["t"], origin, span)}
    hosts = [(r["step_us"], steps[r["step"]]) for r in records if r.get("k") == "host" and r["step"] in steps]
    if not hosts:
        return None
    stalls = []
    for mode in {step["mode"] for _, step in hosts}:
        times = [(us, step) for us, step in hosts if step["mode"] == mode]
        median = statistics.median(us for us, _ in times)
        stalls += [(us, step) for us, step in times if median > 0 and us > HOST_STALL_FACTOR * median]
    if not stalls:
        return f"Host stalls (a step's host time over {HOST_STALL_FACTOR:g}x its mode's median): none"
    us, step = max(stalls, key=lambda x: x[0])
    return (f"Host stalls (a step's host time over {HOST_STALL_FACTOR:g}x its mode's median): {len(stalls)}, "
            f"the longest {us / 1000:.1f} ms at step {step['step']} ({step['mode']}, {step['b']} requests, "
            f"{step['t'] - origin:.1f} s in)")


def gpu_stall_line(records: Sequence[dict], origin: float,
                   span: Optional[Tuple[float, float]] = None) -> Optional[str]:
    """Timed decode steps whose GPU interval exceeds ``GPU_STALL_FACTOR`` times the milliseconds
    the policy predicted for them (``pt``; steps predicted at a projected batch left out): how
    many, and the three longest with when they ran, so an operator can line them up with what
    else happened then (a compile in triton's cache, another server's traffic)."""
    times = _step_ms(records)
    steps = [r for r in _timed_at_their_batch(records, times, origin, span) if r.get("pt")]
    if not steps:
        return None
    title = f"GPU stalls (a timed step over {GPU_STALL_FACTOR:g}x its predicted time, {len(steps)} steps)"
    stalls = sorted((r for r in steps if times[r["step"]] > GPU_STALL_FACTOR * r["pt"]),
                    key=lambda r: -times[r["step"]])
    if not stalls:
        return f"{title}: none"
    return f"{title}: {len(stalls)}; the longest " + ", ".join(
        f"{times[r['step']]:.1f} ms against {r['pt']:.1f} at step {r['step']} ({r['mode']}, {r['b']} requests, "
        f"{r['t'] - origin:.1f} s in)" for r in stalls[:3])


def render(path: Path, windows: int = 1, replay: bool = True,
           span: Optional[Tuple[float, float]] = None) -> str:
    path = Path(path)
    text = read_trace_text(path)
    steps = load_trace(path, text)
    rows = summary_rows(steps, windows, span)
    columns: Sequence[str] = ("window_s", "mode", "batch", "steps", "timed", "median_ms", "tokens_per_s", "predicted",
                              "host_us")
    lines = [f"Decode steps of {path}:", "", "| " + " | ".join(columns) + " |",
             "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join("-" if row[c] is None else str(row[c]) for c in columns) + " |" for row in rows]
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    prefills = prefill_rows(records, steps[0].t, span)
    if prefills:
        keys = ("tokens", "batches", "target_ms", "draft_ms", "draft_share")
        lines += ["", "Prefill batches (GPU time, median ms; the draft's total over the target's):", "",
                  "| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
        lines += ["| " + " | ".join(str(row[k]) for k in keys) + " |" for row in prefills]
    for line in (acceptance_line(records, steps[0].t, span), prediction_line(records, steps[0].t, span),
                 catchup_line(records, steps[0].t, span), wait_line(records, steps[0].t, span),
                 stall_line(records, steps[0].t, span), gpu_stall_line(records, steps[0].t, span)):
        if line:
            lines += ["", line]
    unmeasured = [m.value for m in DecodeMode if not any(s.mode is m and s.ms for s in steps)]
    if replay and unmeasured:
        lines += ["", f"Not replayed: the trace has no timed {unmeasured[0]} step (a replay costs both "
                      "modes from the trace's own steps)"]
    regrets = replay_regrets(Path(path), span) if replay and not unmeasured else None
    if regrets is not None:
        lines += ["", "Replayed below the best mode choice per step: " + ", ".join(
            f"{name} {100 * value:.1f}%" for name, value in regrets.items())]
    return "\n".join(lines) + "\n"
