"""Replaying decode-step traces against a policy and against the oracle (pure, CPU).

A trace (``SGLANG_DYNAMIC_EAGLE_TRACE=<file>``, see ``observability.trace``) is the decode
steps a server ran: batch, KV tokens, queue, mode, measured time, verified tokens. A
:class:`World` costs every step in both modes: a least-squares fit of each mode's timed steps
(a base per CUDA-graph bucket, a cost per request and per KV token; stalls left out; timed at
too few buckets: the start-up timings shifted by the median residual, slopes at priors), never
below the graph's start-up timing plus the KV at the bandwidth prior, times the mode's
measured / fitted ratio over its nearest timed steps at the same bucket; speculative tokens
from the nearest verifies. The batch sequence is taken as given (the same approximation for
the policy and the oracle). :func:`simulate` runs a policy over a world (step times reach it
``feedback_lag`` steps late, every ``feed_every`` steps): each step stands for one token per request, served by a plain
step in its time, by a speculative one in its time x batch / tokens yielded, plus catch-ups.
:func:`oracle_rate` finds the least time knowing every cost (dynamic programming over mode
and plain-run length). Regret = 1 - policy rate / oracle rate.
"""

from __future__ import annotations

import json
import lzma
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from sglang_dynamic_eagle.policy.types import DecodeMode, StepObservation

FEEDBACK_LAG_STEPS = 16  # the worker all-reduces timings of steps [s - 16, s - 8) at step s
LOCAL_STEPS = 16  # steps of a bucket whose measured / fitted ratio corrects a mode's fit
MIN_FITTED_MS = 0.05  # a fit extrapolated below this (or below 0) costs this
MIN_FIT_BUCKETS = 3  # buckets (of 4+ timed steps each) a mode must span for its slopes to be fitted


@dataclass(frozen=True)
class TraceStep:
    batch: int
    kv_tokens: int
    queued: int
    mode: DecodeMode  # the mode that ran
    ms: Optional[float] = None  # measured time of the step (None: not timed)
    spec_tokens: Optional[float] = None  # tokens a verify yielded (speculative steps)
    t: float = field(default=0.0, compare=False)  # when it was decided (the server's clock, s)
    host_us: Optional[Tuple[float, float]] = field(default=None, compare=False)  # worker, step call
    predicted: Optional[float] = field(default=None, compare=False)  # tok/s expected at this batch


def load_trace(path: Path, text: Optional[str] = None) -> List[TraceStep]:
    """A server's trace file (or its ``text``): ``step``, ``time``, ``verify`` and ``host`` lines joined by step."""
    by_kind: Dict[str, Dict[int, dict]] = {"step": {}, "time": {}, "verify": {}, "host": {}}
    for rec in (json.loads(line) for line in (text or read_trace_text(Path(path))).splitlines() if line.strip()):
        if rec.get("k") in by_kind:
            by_kind[rec["k"]][rec["step"]] = rec
    times, verifies, hosts = by_kind["time"], by_kind["verify"], by_kind["host"]
    return [
        TraceStep(batch=r["b"], kv_tokens=r["kv"], queued=r.get("q", 0), mode=DecodeMode(r["mode"]),
                  ms=times[n]["ms"] if n in times else None,
                  spec_tokens=verifies[n]["tokens"] if n in verifies else None, t=r.get("t", 0.0),
                  host_us=(hosts[n]["us"], hosts[n]["step_us"]) if n in hosts else None,
                  predicted=None if "pb" in r else r.get("pp" if r["mode"] == "plain" else "ps") or None)
        for n, r in sorted(by_kind["step"].items())
    ]


def _fit(points: Sequence[Tuple[int, int, float, float]]) -> Tuple[Dict[int, float], float, float]:
    """Least squares of ms = base[bucket] + per_request * b + per_kv * K over (bucket, b, K,
    ms) points: returns (base per bucket, per_request, per_kv)."""
    buckets = sorted({p[0] for p in points})
    column = {bucket: i for i, bucket in enumerate(buckets)}
    x = np.zeros((len(points), len(buckets) + 2))
    y = np.array([p[3] for p in points])
    for row, (bucket, batch, kv, _) in enumerate(points):
        x[row, column[bucket]] = 1.0
        x[row, -2], x[row, -1] = batch, kv
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return {bucket: float(coef[i]) for bucket, i in column.items()}, float(coef[-2]), float(coef[-1])


def _robust_fit(points, min_samples: int = 4, stall_factor: float = 4.0):
    """:func:`_fit` without stalls (steps over ``stall_factor`` times the first fit: JIT
    compiles, host hiccups, which would have hit either mode) and without buckets timed fewer
    than ``min_samples`` times."""
    base, per_request, per_kv = _fit(points)
    kept = [p for p in points if p[3] <= stall_factor * (base[p[0]] + per_request * p[1]
                                                          + per_kv * p[2])]
    counts = {b: sum(p[0] == b for p in kept) for b in {p[0] for p in kept}}
    kept = [p for p in kept if counts[p[0]] >= min_samples] or kept
    return _fit(kept)


def _bucket(buckets: Sequence[int], batch: int) -> int:
    """The smallest bucket holding ``batch``; above the largest, the batch itself (eager)."""
    return next((b for b in buckets if b >= batch), batch)


@dataclass
class World:
    """Both modes' cost and yield at every step, and the catch-up cost."""

    batch: np.ndarray
    kv_tokens: np.ndarray
    queued: np.ndarray
    plain_ms: np.ndarray
    spec_ms: np.ndarray  # inf where speculation cannot run (above the speculative graphs)
    spec_tokens: np.ndarray
    catchup_fixed_ms: float
    catchup_per_token_ms: float

    def serve_ms(self, i: int) -> float:
        """Time speculation takes to serve step ``i``'s demand (one token per request): its
        step time over the tokens it yields per request (inf above the speculative graphs)."""
        if not np.isfinite(self.spec_ms[i]) or self.spec_tokens[i] <= 0:
            return np.inf
        return float(self.spec_ms[i] * self.batch[i] / self.spec_tokens[i])

    def catchup_ms(self, tokens: int) -> float:
        return self.catchup_fixed_ms + self.catchup_per_token_ms * tokens if tokens > 0 else 0.0

    def part(self, first: int, end: int) -> "World":
        """Steps ``[first, end)`` costed by the whole trace's fit (a load may be too short to fit)."""
        arrays = ("batch", "kv_tokens", "queued", "plain_ms", "spec_ms", "spec_tokens")
        return replace(self, **{name: getattr(self, name)[first:end] for name in arrays})

    @classmethod
    def from_trace(cls, steps: Sequence[TraceStep], buckets: Sequence[int],
                   max_speculative_batch: int, catchup_per_token_ms: float,
                   catchup_fixed_ms: float = 0.0, stall_factor: float = 4.0,
                   priors: Optional[Dict[DecodeMode, Tuple[Dict[int, float], float]]] = None,
                   ) -> "World":
        buckets = sorted(buckets)

        def floor(mode: DecodeMode, s: TraceStep) -> float:
            # The mode's graph timed at start-up (above the graphs: the largest) plus its KV at the
            # prior: a fit of other sizes and contexts can extrapolate below it.
            calibrated, per_kv_prior = (priors or {}).get(mode, ({0: 0.0}, 0.0))
            graph = min(_bucket(sorted(calibrated), s.batch), max(calibrated))
            return calibrated[graph] + per_kv_prior * s.kv_tokens

        fits, shifts = {}, {}  # shifts: modes costed as their floor plus the median residual
        for mode in (DecodeMode.PLAIN, DecodeMode.SPECULATIVE):
            timed = [s for s in steps if s.mode is mode and s.ms]
            if not timed:
                raise ValueError(f"the trace has no timed {mode.value} step")
            fits[mode] = _robust_fit([(_bucket(buckets, s.batch), s.batch, s.kv_tokens, s.ms) for s in timed])
            if (priors or {}).get(mode, ({},))[0] and len(fits[mode][0]) < MIN_FIT_BUCKETS:  # slopes unknown
                shifts[mode] = float(np.median([s.ms - floor(mode, s) for s in timed]))

        def fitted(mode: DecodeMode, s: TraceStep) -> float:
            if mode in shifts:
                return floor(mode, s) + shifts[mode]
            base, per_request, per_kv = fits[mode]  # unmeasured bucket: the nearest measured base
            bucket = _bucket(buckets, s.batch)
            nearest = min(base, key=lambda b: (abs(b - bucket), -b))
            return base[nearest] + per_request * s.batch + per_kv * s.kv_tokens

        at = np.array([_bucket(buckets, s.batch) for s in steps])

        def local_ratio(mode: DecodeMode) -> np.ndarray:
            # Measured over fitted time of the mode's nearest timed steps at the same graph bucket
            # (stalls left out; 1 without any): what one line misses where the load is.
            ratio = np.ones(len(steps))
            for b in np.unique(at):
                timed = [(i, s.ms / m) for i, s in enumerate(steps) if s.mode is mode and s.ms
                         and at[i] == b and 0 < (m := fitted(mode, s)) and s.ms <= stall_factor * m]
                ratio[at == b] = _local_mean(timed, len(steps), LOCAL_STEPS // 2)[at == b]
            return ratio

        ratios = {mode: local_ratio(mode) for mode in fits}

        def cost(mode: DecodeMode, i: int, s: TraceStep) -> float:
            return max(floor(mode, s), max(MIN_FITTED_MS, fitted(mode, s)) * float(ratios[mode][i]))

        per_request = _acceptance_per_request(steps)
        return cls(
            batch=np.array([s.batch for s in steps]),
            kv_tokens=np.array([s.kv_tokens for s in steps]),
            queued=np.array([s.queued for s in steps]),
            plain_ms=np.array([cost(DecodeMode.PLAIN, i, s) for i, s in enumerate(steps)]),
            spec_ms=np.array([cost(DecodeMode.SPECULATIVE, i, s) if s.batch <= max_speculative_batch
                              else np.inf for i, s in enumerate(steps)]),
            spec_tokens=np.array([a * s.batch for s, a in zip(steps, per_request)]),
            catchup_fixed_ms=catchup_fixed_ms, catchup_per_token_ms=catchup_per_token_ms)


def _local_mean(samples: Sequence[Tuple[int, float]], length: int, half: int) -> np.ndarray:
    """Per step of ``length``, the mean of the ``2 * half`` (step, value) samples nearest to it
    (1 without samples): no decision can foresee one step's luck, so none is charged with it."""
    if not samples:
        return np.ones(length)
    at = np.array([i for i, _ in samples])
    sums = np.concatenate([[0.0], np.cumsum([v for _, v in samples])])
    low = np.clip(np.searchsorted(at, np.arange(length)) - half, 0, max(0, len(at) - 2 * half))
    high = np.minimum(low + 2 * half, len(at))
    return (sums[high] - sums[low]) / (high - low)


def _acceptance_per_request(steps: Sequence[TraceStep], smooth: int = 8) -> np.ndarray:
    """Per step, the tokens per request of the ``2 * smooth`` verified steps nearest to it."""
    return _local_mean([(i, s.spec_tokens / s.batch) for i, s in enumerate(steps)
                        if s.spec_tokens and s.batch], len(steps), smooth)


@dataclass
class ReplayResult:
    tokens: float
    ms: float
    speculative_steps: int
    switches: int

    @property
    def rate(self) -> float:
        """Output tokens per second."""
        return 1000.0 * self.tokens / self.ms if self.ms else 0.0


def simulate(policy, world: World, catchup_window: int, catchup_max_tokens: int = 8192,
             feedback_lag: int = FEEDBACK_LAG_STEPS, feed_every: int = 1) -> ReplayResult:
    """Run ``policy`` (a ``DecodePolicy``; fed back step times, verifies and catch-ups where
    it takes them) over ``world``."""
    tokens = ms = 0.0
    plain_run = spec_steps = switches = 0
    carry = 0.0  # accepted drafts owed to the verify feedback (whole drafts per verify)
    previous: Optional[DecodeMode] = None
    pending: List[Tuple[int, int, DecodeMode, int, int, float]] = []
    for i in range(len(world.batch)):
        b, kv = int(world.batch[i]), int(world.kv_tokens[i])
        obs = StepObservation(batch_size=b, kv_tokens=kv, queued=int(world.queued[i]))
        mode = policy.decide(obs)
        if mode is DecodeMode.SPECULATIVE and not np.isfinite(world.spec_ms[i]):
            raise AssertionError(f"step {i}: speculation above the speculative graphs")
        switches += int(previous is not None and mode is not previous)
        previous = mode
        if mode is DecodeMode.SPECULATIVE:
            catchup_tokens = min(b * min(plain_run, catchup_window), catchup_max_tokens)
            catchup = world.catchup_ms(catchup_tokens)
            step_ms, step_tokens, served_ms = world.spec_ms[i], world.spec_tokens[i], world.serve_ms(i)
            if catchup and hasattr(policy, "add_catchup"):
                policy.add_catchup(catchup_tokens, catchup)
            ms += catchup
            plain_run = 0
            spec_steps += 1
            if hasattr(policy, "add_verify"):
                drafts, carry = accepted_drafts_per_request(step_tokens, b, carry)
                policy.add_verify(drafts)
        else:
            step_ms, step_tokens, served_ms = world.plain_ms[i], float(b), world.plain_ms[i]
            plain_run += 1
        ms += float(served_ms)
        tokens += float(b)
        pending.append((i, getattr(policy, "step", i + 1), mode, b, kv, float(step_ms)))
        while pending and pending[0][0] <= i - feedback_lag and (i + 1) % feed_every == 0:
            _, index, m, pb, pkv, pms = pending.pop(0)
            if hasattr(policy, "add_step_time"):
                policy.add_step_time(index, m, pb, pkv, pms)
    return ReplayResult(tokens, ms, spec_steps, switches)


def accepted_drafts_per_request(tokens: float, batch: int, carry: float = 0.0) -> Tuple[List[int], float]:
    """Accepted drafts per request (bonus excluded) summing to ``tokens - batch`` plus ``carry``,
    and the fraction carried on to the next verify, so that whole drafts keep the world's mean
    (rounding each verify alone would turn a mean of 1.6 tokens into 1.5)."""
    total = max(0.0, tokens - batch) + carry
    drafts = int(total)
    base, extra = divmod(drafts, batch)
    return [base + (1 if r < extra else 0) for r in range(batch)], total - drafts


def oracle_rate(world: World, catchup_window: int, catchup_max_tokens: int = 8192) -> float:
    """The best achievable tokens per second over ``world``, catch-ups included: dynamic
    programming over (mode, plain-run length) of the total time, steps served as in simulate."""
    runs = np.arange(catchup_window + 1)  # plain steps since the last speculative one (capped)
    spec = 0.0  # least time so far, ending in a speculative step
    plain = np.full(catchup_window + 1, np.inf)  # ... ending in a plain run of length r
    for i in range(len(world.batch)):
        b = int(world.batch[i])
        t_plain, t_spec = world.plain_ms[i], world.serve_ms(i)
        tokens = np.minimum(b * runs, catchup_max_tokens)
        catch = np.where(tokens > 0, world.catchup_fixed_ms
                         + world.catchup_per_token_ms * tokens, 0.0)
        new_spec = min(spec, float(np.min(plain + catch))) + t_spec
        new_plain = np.full(catchup_window + 1, np.inf)
        new_plain[1] = spec
        new_plain[2:] = plain[1:-1]
        new_plain[-1] = min(new_plain[-1], plain[-1])
        spec, plain = new_spec, new_plain + t_plain
    best = min(spec, float(np.min(plain)))
    return 1000.0 * float(world.batch.sum()) / best


def read_trace_text(path: Path) -> str:
    return lzma.open(path, "rt").read() if path.suffix == ".xz" else path.read_text()


def load_recorded(trace_path: Path) -> Tuple[List[TraceStep], dict]:
    """A recorded trace (``.xz`` read compressed) and its server's configuration and priors:
    the trace's last ``config`` line, or a sidecar ``<name>.json`` beside it; without a sidecar's
    ``catchup`` the catch-up cost is fitted from the trace's ``catchup`` lines."""
    trace_path = Path(trace_path)
    text = read_trace_text(trace_path)
    steps = load_trace(trace_path, text)
    records = [json.loads(line) for line in text.splitlines() if line.strip()]
    sidecar = trace_path.parent / f"{trace_path.name.split('.jsonl')[0]}.json"
    if sidecar.exists():
        meta = json.loads(sidecar.read_text())
    else:
        meta = next((r for r in reversed(records) if r.get("k") == "config"), None)
        if meta is None:
            raise ValueError(f"{trace_path}: no config line and no sidecar {sidecar.name}")
    if "catchup" not in meta:
        points = [(r["tokens"], r["ms"]) for r in records if r.get("k") == "catchup"][1:]
        fixed, per_token = (float(np.mean([p[1] for p in points])), 0.0) if points else (0.0, 0.0)
        if len({p[0] for p in points}) > 1:
            per_token, fixed = (float(c) for c in np.polyfit(*zip(*points), 1))
            per_token, fixed = max(0.0, per_token), max(0.0, fixed)
        meta = {**meta, "catchup": {"fixed_ms": fixed, "per_token_ms": per_token}}
    return steps, meta


def recorded_world(steps: Sequence[TraceStep], meta: dict) -> World:
    plain_buckets = sorted(meta["buckets"]["plain"] if "buckets" in meta
                           else (int(b) for b in meta["calibration"]["plain"]))
    priors = {mode: ({int(b): ms for b, ms in meta["calibration"][mode.value].items()},
                     meta.get("per_kv_token_ms", {}).get(mode.value, 0.0))
              for mode in DecodeMode if "calibration" in meta and mode.value in meta["calibration"]}
    return World.from_trace(steps, plain_buckets, meta["max_speculative_batch"],
                            catchup_per_token_ms=meta["catchup"]["per_token_ms"],
                            catchup_fixed_ms=meta["catchup"]["fixed_ms"], priors=priors)


def throughput_policy_for(meta: dict, per_kv_token_scale: float = 1.0):
    """The automatic policy as the recorded server built it (its calibration and priors)."""
    from sglang_dynamic_eagle.policy.throughput import (ThroughputPolicyConfig,
                                                         new_throughput_policy)

    calibration = {DecodeMode(mode): {int(b): ms for b, ms in table.items()}
                   for mode, table in meta["calibration"].items()}
    buckets = ({DecodeMode(mode): list(b) for mode, b in meta["buckets"].items()} if "buckets" in meta
               else {mode: sorted(table) for mode, table in calibration.items()})
    per_kv = {DecodeMode(m): per_kv_token_scale * v for m, v in meta["per_kv_token_ms"].items()}
    config = ThroughputPolicyConfig(**{
        name: meta[name] for name in ("max_speculative_batch", "max_running_requests",
                                      "kv_capacity_tokens", "catchup_window",
                                      "catchup_max_tokens", "exploration_share") if name in meta})
    spec = calibration[DecodeMode.SPECULATIVE]
    prior = meta.get("catchup_prior_fixed_ms", spec[min(spec)] if spec else 0.0)
    return new_throughput_policy(config, buckets, calibration, per_kv,
                                 catchup_prior_fixed_ms=prior,
                                 max_acceptance=meta["max_acceptance"])
