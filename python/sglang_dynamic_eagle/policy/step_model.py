"""What a decode step costs and yields: the model the throughput policy decides from.

Cost. A decode step of mode m over a batch of b requests holding K KV tokens takes

    t_m(b, K) = replay_m(bucket) + host_m + per_request_m * b + per_kv_token_m * K   (ms)

``replay_m(bucket)``: the start-up replay of the step's CUDA graphs at the bucket the step runs
at (weights read, the padded batch's matmuls, at context length 1). ``host_m + per_request_m *
b``: what the replay leaves out, the host's launches and per-request work (sampling,
bookkeeping; for a speculative step also tree building and verify). ``per_kv_token_m``:
attention's read of the KV cache per token (a speculative step reads the target's once and the
draft's once per draft step and extend), prior: KV bytes per token over the memory bandwidth
measured at start-up. Host, per-request and KV terms are one ridge least-squares fit over every
timed step (exponential forgetting); a measured bucket adds its own mean residual.

Yield. A plain step yields one token per request; a speculative step, per request, its
acceptance length (``acceptance.py``).

Catch-up. Entering speculation after plain steps runs the draft over the tokens decoded plainly
(at most the catch-up window per request): ``fixed + per_token * tokens``, fitted the same way;
``per_token`` at most the draft prefills' measured ms per token (the same extend over a
prompt's positions).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from sglang_dynamic_eagle.policy.types import check_int_at_least

# Samples a bucket needs before its own mean replaces the scaled calibration: the step timer
# drops the first step of every run, so 4 is one short probe's worth.
MIN_BUCKET_SAMPLES = 4
# Memory of a bucket's mean (in decode steps) and of the catch-up fit (in samples): long enough
# to average out host jitter, short enough to follow contexts that grow over seconds.
FIT_MEMORY_SAMPLES = 64
# Memory of the fit shared by all buckets (host, per-request cost, KV slope), in samples: seconds
# of decoding, so that a burst at one batch size does not erase the others.
GLOBAL_FIT_MEMORY_SAMPLES = 2048
# Weight of the per-KV-token prior, in samples: as much as 64 steps whose KV tokens are spread
# PRIOR_KV_SPREAD_TOKENS apart at the same batch size.
PRIOR_SLOPE_SAMPLES, PRIOR_KV_SPREAD_TOKENS = 64.0, 16384.0
# The per-request cost beyond the replay is pulled to 0 (weight: PRIOR_BATCH_SAMPLES steps spread
# PRIOR_BATCH_SPREAD_REQUESTS apart): one or two batch sizes cannot tell it from noise.
PRIOR_BATCH_SAMPLES, PRIOR_BATCH_SPREAD_REQUESTS = 8.0, 2.0
# A step (or catch-up) over STALL_FACTOR x its prediction is a stall, unless STALL_RUN in a row (_Stalls).
STALL_FACTOR, STALL_RUN = 4.0, 3
MIN_STEP_MS = 0.05  # the least a step is predicted to take (a fit can extrapolate below 0)


@dataclass
class _Sums:
    """Exponentially weighted sums for a regression of t on K (catch-up costs)."""

    w: float = 0.0
    k: float = 0.0
    t: float = 0.0
    kk: float = 0.0
    kt: float = 0.0
    count: int = 0

    def add(self, kv: float, ms: float, keep: float, other: Optional[float] = None) -> None:
        """One sample; with ``other``, ``kk`` sums that third variable instead of kv**2 (a
        bucket's sums of batch size, KV tokens and time)."""
        self.w = self.w * keep + 1.0
        self.k = self.k * keep + kv
        self.t = self.t * keep + ms
        self.kk = self.kk * keep + (kv * kv if other is None else other)
        self.kt = self.kt * keep + kv * ms
        self.count += 1

    def centred(self) -> Tuple[float, float]:
        """(covariance of K and t, variance of K), both times the weight."""
        if self.w <= 0:
            return 0.0, 0.0
        return self.kt - self.k * self.t / self.w, max(0.0, self.kk - self.k * self.k / self.w)


class _Stalls:
    """A time over ``STALL_FACTOR`` x its prediction is a stall (a compile at a new shape, a host
    hiccup), not a cost, unless ``STALL_RUN`` come in a row under one key: then it is the cost."""

    def __init__(self) -> None:
        self._runs: Dict[object, int] = {}

    def skip(self, key: object, ms: float, predicted: Optional[float]) -> bool:
        if predicted and ms > STALL_FACTOR * predicted:
            self._runs[key] = self._runs.get(key, 0) + 1
            if self._runs[key] < STALL_RUN:
                return True
        self._runs[key] = 0
        return False


def _solve3(a: List[List[float]], y: List[float]) -> Optional[List[float]]:
    """Solution of the 3x3 system a x = y (Gaussian elimination, partial pivoting). Runs at
    every timed step on the scheduler's thread: rows are updated in place."""
    m = [a[0][:] + [y[0]], a[1][:] + [y[1]], a[2][:] + [y[2]]]
    for col in range(3):
        pivot = col
        for r in range(col + 1, 3):
            if abs(m[r][col]) > abs(m[pivot][col]):
                pivot = r
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        top = m[col]
        for r in range(3):
            if r != col:
                row = m[r]
                f = row[col] / top[col]
                for j in range(4):
                    row[j] = row[j] - f * top[j]
    return [m[0][3] / m[0][0], m[1][3] / m[1][1], m[2][3] / m[2][2]]


class ModeCost:
    """One mode's step time, ``t(b, K) = replay(bucket) + host_ms + per_request_ms * b +
    per_kv_token_ms * K + correction(bucket)`` (module docstring). The three fitted terms are one
    ridge fit: the KV slope moves from its physical prior only as far as steps whose KV tokens vary
    apart from their batch size show (in steady traffic K grows with b). ``correction``: a
    measured bucket's mean residual (padding, kernel choice at that size). Stalls are left out.
    """

    def __init__(
        self,
        buckets: Sequence[int],
        calibration: Mapping[int, float],
        prior_per_kv_token_ms: float,
        memory: int = FIT_MEMORY_SAMPLES,
    ) -> None:
        self.buckets = tuple(sorted(set(buckets)))
        if not self.buckets:
            raise ValueError("a mode needs at least one bucket")
        self.calibration = {b: float(ms) for b, ms in calibration.items() if ms and ms > 0}
        self.prior_per_kv_token_ms = max(0.0, float(prior_per_kv_token_ms))
        self._calibrated = sorted(self.calibration)
        self._stalls = _Stalls()
        self._bucket_keep = 1.0 - 1.0 / check_int_at_least("memory", memory, 1)
        self._global_keep = 1.0 - 1.0 / GLOBAL_FIT_MEMORY_SAMPLES
        self._xx = [[0.0] * 3 for _ in range(3)]
        self._xy = [0.0] * 3
        self._samples = 0
        self._theta = [0.0, 0.0, self.prior_per_kv_token_ms]  # host_ms, per_request_ms, per_kv
        self._residuals: Dict[int, _Sums] = {b: _Sums() for b in self.buckets}
        self._last_step: Dict[int, int] = {}

    @property
    def per_kv_token_ms(self) -> float:
        return self._theta[2]

    def bucket_of(self, batch_size: int) -> Optional[int]:
        """The bucket a step of ``batch_size`` runs at; None above the largest."""
        index = bisect.bisect_left(self.buckets, batch_size)
        return self.buckets[index] if index < len(self.buckets) else None

    def _replay(self, bucket: int) -> float:
        """The bucket's replay time; an uncalibrated bucket between calibrated ones takes the
        line through its neighbours, one beyond them the nearest (0 with no calibration)."""
        if bucket in self.calibration:
            return self.calibration[bucket]
        known = self._calibrated
        if not known:
            return 0.0
        index = bisect.bisect_left(known, bucket)
        if index == 0 or index == len(known):
            return self.calibration[known[min(index, len(known) - 1)]]
        low, high = known[index - 1], known[index]
        c_low, c_high = self.calibration[low], self.calibration[high]
        return c_low + (c_high - c_low) * (bucket - low) / (high - low)

    def _fitted(self, bucket: int, batch_size: int, kv_tokens: float) -> float:
        host, per_request, per_kv = self._theta
        return self._replay(bucket) + host + per_request * batch_size + per_kv * kv_tokens

    def add(self, bucket: int, kv_tokens: float, ms: float, batch_size: Optional[int] = None,
            step: Optional[int] = None) -> None:
        """One timed step of ``batch_size`` requests (default: the bucket) at ``bucket``."""
        if bucket not in self._residuals or not ms > 0:
            return
        b = bucket if batch_size is None else batch_size
        warm = self._samples >= MIN_BUCKET_SAMPLES
        if self._stalls.skip(bucket, ms, self.predict(b, kv_tokens) if warm else None):
            return
        x = (1.0, float(b), float(kv_tokens))
        y = ms - self._replay(bucket)
        keep = self._global_keep
        for i in range(3):
            self._xy[i] = self._xy[i] * keep + x[i] * y
            for j in range(3):
                self._xx[i][j] = self._xx[i][j] * keep + x[i] * x[j]
        self._samples += 1
        self._refit()
        # The bucket's own means (batch, KV, time over its replay); its correction is their
        # residual under the current fit, so it never carries an older fit's error.
        # Forgetting by decode steps, not samples: a probe after a stretch in the other mode
        # outweighs what the bucket measured long before it.
        gap = 1 if step is None else max(1, step - self._last_step.get(bucket, step - 1))
        self._last_step[bucket] = step if step is not None else 0
        self._residuals[bucket].add(b, y, self._bucket_keep ** gap, kv_tokens)

    def _refit(self) -> None:
        # Ridge priors: the KV slope at its physical prior, the per-request cost at 0.
        prior = [0.0, PRIOR_BATCH_SAMPLES * PRIOR_BATCH_SPREAD_REQUESTS**2,
                 PRIOR_SLOPE_SAMPLES * PRIOR_KV_SPREAD_TOKENS**2]
        target = [0.0, 0.0, self.prior_per_kv_token_ms]
        a = [[self._xx[i][j] + (prior[i] if i == j else 0.0) for j in range(3)] for i in range(3)]
        y = [self._xy[i] + prior[i] * target[i] for i in range(3)]
        theta = _solve3(a, y)
        if theta is not None:
            theta[2] = max(0.0, theta[2])
            self._theta = theta

    def measured(self, bucket: Optional[int]) -> bool:
        return bucket is not None and self._residuals[bucket].count >= MIN_BUCKET_SAMPLES

    def measured_buckets(self) -> List[int]:
        return [b for b in self.buckets if self.measured(b)]

    def predict(self, batch_size: int, kv_tokens: float) -> Optional[float]:
        """Predicted milliseconds of a step; None above the buckets or with nothing known
        (no replay and no timed step)."""
        bucket = self.bucket_of(batch_size)
        if bucket is None or (self._samples == 0 and bucket not in self.calibration):
            return None
        if self._samples == 0:
            return max(MIN_STEP_MS, self._replay(bucket) + self.prior_per_kv_token_ms * kv_tokens)
        correction = 0.0
        if self.measured(bucket):
            s = self._residuals[bucket]
            host, per_request, per_kv = self._theta
            correction = (s.t - host * s.w - per_request * s.k - per_kv * s.kk) / s.w
        return max(MIN_STEP_MS, self._replay(bucket),
                   self._fitted(bucket, batch_size, kv_tokens) + correction)

    def lower_bound(self, batch_size: int, kv_tokens: float) -> Optional[float]:
        """The least a step can take: at a bucket not measured yet, the graph replay alone (no
        host work, context 1) plus the prior KV read; elsewhere the prediction."""
        bucket = self.bucket_of(batch_size)
        predicted = self.predict(batch_size, kv_tokens)
        if (bucket is None or bucket not in self.calibration or predicted is None
                or self.measured(bucket)):
            return predicted
        return min(predicted, self._replay(bucket) + self.prior_per_kv_token_ms * kv_tokens)

    def report(self) -> Dict[str, object]:
        host, per_request, per_kv = self._theta
        return {
            "step_ms": {str(b): round(ms, 3) for b in self.buckets
                        if (ms := self.predict(b, 0.0)) is not None},
            "host_ms": round(host, 4),
            "per_request_ms": round(per_request, 5),
            "per_kv_token_us": round(per_kv * 1000, 6),
            "measured_buckets": self.measured_buckets(),
        }


class CatchupCost:
    """Draft-KV catch-up milliseconds as ``fixed + per_token * tokens``, fitted from timed
    catch-ups (exponential forgetting): one eager draft EXTEND forward, whose launches cost about
    a speculative step's at batch 1 (``prior_fixed_ms``) and a token little (one draft layer).
    A server's first catch-up JIT-compiles its kernels and is not counted; once the fit is warm
    (from the second counted catch-up once a draft prefill was timed, else the fifth) a later
    compile at a new shape is a stall, as for steps. The per-token term is at most the draft
    prefills' (``per_token_bound``), and that bound until catch-ups of several sizes were timed.
    """

    def __init__(self, prior_fixed_ms: float, memory: int = FIT_MEMORY_SAMPLES) -> None:
        self.prior_fixed_ms = max(0.0, prior_fixed_ms)
        self._keep = 1.0 - 1.0 / memory
        self._sums = _Sums()
        self._seen = 0
        self._stalls = _Stalls()
        self._extends: Deque[Tuple[int, float]] = deque(maxlen=memory)  # recent draft prefills
        self.per_token_bound: Optional[float] = None  # set as prefills arrive (below)

    def add_draft_prefill(self, tokens: int, ms: float) -> None:
        """A draft prefill (the draft's extend over a prompt) of ``tokens`` took ``ms``.

        ``per_token_bound`` is the recent prefills' milliseconds over their tokens, pooled: a
        catch-up is the same draft extend over other positions, and each prefill's time is at
        least its tokens times a token's cost, so their sums bound it (fixed costs included,
        which loosen it for short prompts; pooled, so one fast sample does not set it)."""
        if tokens > 0 and ms > 0:
            self._extends.append((tokens, ms))
            self.per_token_bound = (sum(m for _, m in self._extends)
                                    / sum(t for t, _ in self._extends))

    def add(self, tokens: int, ms: float) -> None:
        self._seen += 1
        if self._seen == 1 or tokens <= 0 or not ms > 0:
            return
        # Warm: a slope of its own, or one counted catch-up beside the prefills' per-token cost.
        warm = self._sums.count >= MIN_BUCKET_SAMPLES or (
            self._sums.count > 0 and self.per_token_bound is not None)
        if not self._stalls.skip(None, ms, self.predict(tokens) if warm else None):
            self._sums.add(tokens, ms, self._keep)

    def predict(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        s = self._sums
        if s.count == 0:
            return self.prior_fixed_ms
        cov, var = s.centred()
        bound = self.per_token_bound
        if s.count < MIN_BUCKET_SAMPLES or var <= 0:  # too few sizes for a slope of their own
            if bound is None:
                return s.t / s.w
            # The catch-ups' own time over their tokens bounds it too (and keeps their mean).
            per_token = min(bound, s.t / s.k) if s.k > 0 else bound
        else:
            per_token = max(0.0, cov / var)
            if bound is not None:
                per_token = min(per_token, bound)
        fixed = max(0.0, (s.t - per_token * s.k) / s.w)
        return fixed + per_token * tokens
