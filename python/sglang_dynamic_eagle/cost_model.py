"""Step costs of both decode modes: what the automatic policy compares.

Pure Python. The worker feeds :class:`MeasuredCosts` with a start-up calibration (CUDA-graph
replay times per bucket, ``step_costs.calibrate``) and with timings of real decode steps; it
turns them into a :class:`CostTable`. For tensor parallelism the whole state travels as one
flat vector (:meth:`MeasuredCosts.to_vector`), all-reduced with MAX across ranks before the
table is built, so every rank decides from the same table (and from the slowest rank's
timings, which is what a TP step costs).
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from sglang_dynamic_eagle.policy import DecodeMode

MODES = (DecodeMode.PLAIN, DecodeMode.SPECULATIVE)
DEFAULT_MIN_SAMPLES = 4
DEFAULT_WINDOW = 9
DEFAULT_CROSSOVER_LOG_INTERVAL_S = 60.0
MIN_TREND_SPAN = 8


@dataclass(frozen=True)
class CostLookup:
    """One mode's cost at one batch size."""

    bucket: Optional[int]  # the CUDA-graph batch size the step runs at; None beyond the last
    step_ms: Optional[float]  # None: neither measured nor estimated
    measured: bool  # timed from real steps on this server, not only estimated


@dataclass(frozen=True)
class ModeCosts:
    """Step cost of one mode per CUDA-graph bucket (ascending), in milliseconds."""

    buckets: Tuple[int, ...]
    step_ms: Tuple[Optional[float], ...]
    measured: Tuple[bool, ...]

    def __post_init__(self) -> None:
        if not (len(self.buckets) == len(self.step_ms) == len(self.measured)):
            raise ValueError("buckets, step_ms and measured must have one entry per bucket")
        if list(self.buckets) != sorted(set(self.buckets)):
            raise ValueError(f"buckets must be strictly ascending, got {self.buckets}")

    def lookup(self, batch_size: int) -> CostLookup:
        """The cost at the smallest bucket that holds ``batch_size`` (beyond the last bucket:
        no bucket, no cost)."""
        index = bisect.bisect_left(self.buckets, batch_size)
        if index == len(self.buckets):
            return CostLookup(bucket=None, step_ms=None, measured=False)
        return CostLookup(self.buckets[index], self.step_ms[index], self.measured[index])

    def measured_buckets(self) -> List[int]:
        """Buckets whose cost was timed on this server (the others are estimates)."""
        return [bucket for bucket, measured in zip(self.buckets, self.measured) if measured]

    def as_dict(self) -> Dict[str, float]:
        return {
            str(bucket): round(ms, 3)
            for bucket, ms in zip(self.buckets, self.step_ms)
            if ms is not None
        }


@dataclass(frozen=True)
class CostTable:
    """What a step of each mode costs on this server, and what a catch-up costs."""

    plain: ModeCosts
    speculative: ModeCosts
    catchup_ms: float = 0.0


def speculative_gain(acceptance: float, plain_ms: float, speculative_ms: float) -> float:
    """Tokens per second of speculative steps over those of plain steps at one batch size."""
    return acceptance * plain_ms / speculative_ms


def crossover_batch(costs: CostTable, acceptance: float) -> int:
    """The largest speculative bucket at which speculation pays (gain >= 1); 0 if none."""
    best = 0
    for bucket in costs.speculative.buckets:
        plain = costs.plain.lookup(bucket).step_ms
        spec = costs.speculative.lookup(bucket).step_ms
        if plain is not None and spec is not None and speculative_gain(acceptance, plain, spec) >= 1:
            best = bucket
    return best


class CrossoverLogGate:
    """When a move of the crossover is worth a log line: its first value, then a changed value
    at most once per ``interval_s``. Near the crossover the acceptance estimate moves it back
    and forth every few table refreshes; the gauges always show the current value."""

    def __init__(
        self,
        interval_s: float = DEFAULT_CROSSOVER_LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._logged: Optional[int] = None
        self._logged_at: Optional[float] = None

    def should_log(self, crossover: int) -> bool:
        if crossover == self._logged:
            return False
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < self.interval_s:
            return False
        self._logged, self._logged_at = crossover, now
        return True


class RecentMedian:
    """The median of the latest ``window`` samples: robust to the odd slow step (a page
    fault, a host hiccup) and replaced by fresh samples as the context lengths move."""

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        self._samples: Deque[float] = deque(maxlen=window)
        self.count = 0

    def add(self, sample: float) -> None:
        self._samples.append(sample)
        self.count += 1

    @property
    def value(self) -> float:
        return statistics.median(self._samples) if self._samples else 0.0


def _nearest(buckets: Sequence[int], bucket: int) -> Optional[int]:
    """The element of ``buckets`` (ascending) closest to ``bucket``; ties go to the larger."""
    if not buckets:
        return None
    index = bisect.bisect_left(buckets, bucket)
    candidates = buckets[max(0, index - 1) : index + 1]
    return min(candidates, key=lambda b: (abs(b - bucket), -b))


def _line_between(measured: Mapping[int, float], bucket: int) -> Optional[float]:
    """At an unmeasured ``bucket`` between two measured ones: the line through the nearest
    measured bucket below it and the nearest above (else None). It stays between their costs,
    so no span is needed against noise, and it rises with either of them."""
    ordered = sorted(measured)
    index = bisect.bisect_left(ordered, bucket)
    if index == 0 or index == len(ordered) or ordered[index] == bucket:
        return None
    low, high = ordered[index - 1], ordered[index]
    return measured[low] + (measured[high] - measured[low]) * (bucket - low) / (high - low)


def _trend_above(measured: Mapping[int, float], bucket: int) -> Optional[float]:
    """At ``bucket`` above every measured bucket: the line through the largest measured bucket
    and the largest one at least ``MIN_TREND_SPAN`` requests below it (else None). The span
    keeps the noise of two neighbouring small buckets (a few percent of a step) from becoming
    a slope that a long extrapolation multiplies. A higher cost measured at the lower bucket
    lowers the line (never below the scaled calibration, see ``_estimate``), so the policy's
    monotonicity in costs holds per cost table, not per measurement."""
    ordered = sorted(measured)
    if not ordered or bucket <= ordered[-1]:
        return None
    high = ordered[-1]
    lower = [b for b in ordered if b <= high - MIN_TREND_SPAN]
    if not lower:
        return None
    low = lower[-1]
    slope = (measured[high] - measured[low]) / (high - low)
    return measured[high] + slope * (bucket - high)


class MeasuredCosts:
    """Calibration plus online step timings, per mode and CUDA-graph bucket."""

    def __init__(
        self,
        buckets: Mapping[DecodeMode, Sequence[int]],
        calibration: Mapping[DecodeMode, Mapping[int, float]],
        *,
        min_samples: int = DEFAULT_MIN_SAMPLES,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        self.buckets = {mode: tuple(sorted(set(buckets[mode]))) for mode in MODES}
        self.calibration = {mode: dict(calibration.get(mode, {})) for mode in MODES}
        self.min_samples = min_samples
        self._steps = {
            mode: {bucket: RecentMedian(window) for bucket in self.buckets[mode]} for mode in MODES
        }
        self._catchup = RecentMedian(window)

    def bucket_of(self, mode: DecodeMode, batch_size: int) -> Optional[int]:
        """The bucket a step of ``batch_size`` runs at; None above the largest."""
        buckets = self.buckets[mode]
        index = bisect.bisect_left(buckets, batch_size)
        return buckets[index] if index < len(buckets) else None

    def add_step(self, mode: DecodeMode, bucket: int, step_ms: float) -> None:
        self._steps[mode][bucket].add(step_ms)

    def add_catchup(self, catchup_ms: float) -> None:
        self._catchup.add(catchup_ms)

    def to_vector(self) -> List[float]:
        """(median, -count) per mode and bucket, then the catch-up's (median, -count).

        Counts are negated so that an element-wise MAX across ranks yields the slowest rank's
        cost and the *smallest* count: a bucket counts as measured only once every rank
        measured it.
        """
        vector: List[float] = []
        for mode in MODES:
            for bucket in self.buckets[mode]:
                stat = self._steps[mode][bucket]
                vector += [stat.value, -float(stat.count)]
        return vector + [self._catchup.value, -float(self._catchup.count)]

    def table(self, vector: Optional[Sequence[float]] = None) -> CostTable:
        """The cost table from ``vector`` (default: this rank's own :meth:`to_vector`)."""
        values = list(self.to_vector() if vector is None else vector)
        measured: Dict[DecodeMode, Dict[int, float]] = {}
        position = 0
        for mode in MODES:
            measured[mode] = {}
            for bucket in self.buckets[mode]:
                median, count = values[position], -values[position + 1]
                position += 2
                if count >= self.min_samples:
                    measured[mode][bucket] = median
        catchup_ms = values[position] if -values[position + 1] > 0 else 0.0
        return CostTable(
            plain=self._mode_costs(DecodeMode.PLAIN, measured),
            speculative=self._mode_costs(DecodeMode.SPECULATIVE, measured),
            catchup_ms=catchup_ms,
        )

    def _mode_costs(
        self, mode: DecodeMode, measured: Mapping[DecodeMode, Mapping[int, float]]
    ) -> ModeCosts:
        buckets = self.buckets[mode]
        step_ms = tuple(
            measured[mode][bucket] if bucket in measured[mode]
            else self._estimate(mode, bucket, measured)
            for bucket in buckets
        )
        flags = tuple(bucket in measured[mode] for bucket in buckets)
        return ModeCosts(buckets=buckets, step_ms=step_ms, measured=flags)

    def _estimate(
        self, mode: DecodeMode, bucket: int, measured: Mapping[DecodeMode, Mapping[int, float]]
    ) -> Optional[float]:
        """An unmeasured bucket: the larger of two estimates where both exist.

        * Its calibration scaled by measured/calibrated at the nearest measured bucket (of this
          mode, else of the other mode); without a calibration, the nearest measured bucket's
          cost.
        * Above this mode's largest measured bucket, the line through it and a measured bucket
          at least ``MIN_TREND_SPAN`` requests below it; for a speculative step between two
          measured buckets, the line through the nearest one on each side (not for plain
          steps: where a cost bends upward the line overestimates it, which for a plain step
          would favour speculation). The calibration replays graphs
          at context length 1, so it leaves out attention over real contexts, which grows with
          the batch: a ratio taken at a smaller bucket underestimates a larger one. Measured
          on the 8B-shaped model (2026-12-01): scaled from bucket 32, a speculative step at 64
          was estimated at 29.8 ms and then measured at 35.2; the line through 16 and 32 gives
          33.2. With only buckets 1 and 128 measured (2026-12-02), bucket 64 was scaled from
          bucket 1 (the nearer) to 18.0 ms and then measured at 31.9; the line gives 36.0.
        """
        calibrated = self.calibration[mode].get(bucket)
        if calibrated is None:
            nearest = _nearest(sorted(measured[mode]), bucket)
            scaled = measured[mode][nearest] if nearest is not None else None
        else:
            own = self._scale_at(mode, bucket, measured)
            other = DecodeMode.SPECULATIVE if mode is DecodeMode.PLAIN else DecodeMode.PLAIN
            scale = own if own is not None else self._scale_at(other, bucket, measured)
            scaled = calibrated * (scale if scale is not None else 1.0)
        trend = _trend_above(measured[mode], bucket)
        if trend is None and mode is DecodeMode.SPECULATIVE:
            trend = _line_between(measured[mode], bucket)
        if scaled is None or trend is None:
            return scaled if trend is None else trend
        return max(scaled, trend)

    def _scale_at(
        self, mode: DecodeMode, bucket: int, measured: Mapping[DecodeMode, Mapping[int, float]]
    ) -> Optional[float]:
        usable = sorted(b for b in measured[mode] if self.calibration[mode].get(b))
        nearest = _nearest(usable, bucket)
        if nearest is None:
            return None
        return measured[mode][nearest] / self.calibration[mode][nearest]


def calibration_table(
    buckets: Mapping[DecodeMode, Sequence[int]], vector: Sequence[float]
) -> Dict[DecodeMode, Dict[int, float]]:
    """Inverse of :func:`calibration_vector` (0 means not calibrated)."""
    table: Dict[DecodeMode, Dict[int, float]] = {}
    position = 0
    for mode in MODES:
        table[mode] = {}
        for bucket in sorted(set(buckets[mode])):
            if vector[position] > 0:
                table[mode][bucket] = vector[position]
            position += 1
    return table


def calibration_vector(
    buckets: Mapping[DecodeMode, Sequence[int]],
    calibration: Mapping[DecodeMode, Mapping[int, float]],
) -> List[float]:
    """Calibration per mode and bucket as a flat vector (for an all-reduce across ranks)."""
    return [
        float(calibration.get(mode, {}).get(bucket, 0.0))
        for mode in MODES
        for bucket in sorted(set(buckets[mode]))
    ]
