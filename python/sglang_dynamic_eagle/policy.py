"""Switching policies for EAGLE3_DYNAMIC: which decode steps speculate and which decode plainly.

The worker asks a policy once per decode step, through the small :class:`DecodePolicy`
protocol: a :class:`StepObservation` in (the running batch size, the measured step costs and
the measured acceptance), a :class:`DecodeMode` out. Two policies implement it:

* :class:`ThresholdPolicy` (this module), chosen by a numeric
  ``--speculative-disable-batch-threshold N``: speculation turns off once the running decode
  batch stays above N and turns back on only once it stays at or below M <= N (the enable
  threshold). Batch sizes in the band (M, N] keep the current mode.
* ``auto_policy.CostPolicy``, the default (``auto``): speculate while the measured cost and
  acceptance say a speculative step yields more tokens per second than a plain one.

Both need ``switch_patience`` (K) consecutive qualifying steps before the mode changes, and both
force plain decoding at once for a batch larger than the biggest speculative CUDA graph.
Policies are pure functions of their observation sequence (no clock, no randomness, no torch),
so every tensor-parallel rank that feeds them identical observations decides identically.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Protocol, Union

if TYPE_CHECKING:
    from sglang_dynamic_eagle.auto_policy import CostTable

# Measured on one H200 (8B-shaped model, EAGLE-3 steps 3, topk 1, 4 draft tokens, simulated
# acceptance 3.0, input 512 / output 256), output throughput EAGLE-3 vs plain decoding, tok/s:
# c=1 368 vs 201, c=4 1111 vs 779, c=16 2674 vs 2559, c=64 4013 vs 6136, c=128 4456 vs 9357.
# These fixed thresholds (used only when N is given without M) come from that table.
DEFAULT_ENABLE_BATCH_THRESHOLD = 16
DEFAULT_SWITCH_PATIENCE = 4

ALGORITHM_NAME = "EAGLE3_DYNAMIC"
DISABLE_FLAG = "--speculative-disable-batch-threshold"
ENABLE_FLAG = "--speculative-enable-batch-threshold"
PATIENCE_FLAG = "--speculative-switch-patience"
_GRAPH_LIMIT_NAME = "max_speculative_batch (largest speculative CUDA-graph batch)"

ReportValue = Union[int, float, str, Dict[str, float], List[int]]


class DecodeMode(str, enum.Enum):
    SPECULATIVE = "speculative"
    PLAIN = "plain"


def check_int_at_least(name: str, value: object, minimum: int) -> int:
    """``value`` if it is an int >= ``minimum``; otherwise a one-line ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}.")
    return value


@dataclass(frozen=True)
class StepObservation:
    """What a policy sees of one decode step, before the step runs.

    ``costs`` and ``acceptance`` are identical on every tensor-parallel rank (the worker builds
    them from all-reduced timings and from verify results); the threshold policy ignores them.
    """

    batch_size: int
    costs: Optional[CostTable] = None
    acceptance: Optional[float] = None  # tokens per request per verify, bonus included

    def __post_init__(self) -> None:
        if self.batch_size < 0:
            raise ValueError(f"batch_size must be >= 0, got {self.batch_size}")


class DecodePolicy(Protocol):
    """What the worker needs of a switching policy."""

    @property
    def mode(self) -> DecodeMode:
        """The mode of the latest decided step (the initial mode before the first)."""

    def expects_plain(self, observation: StepObservation) -> bool:
        """True when decode steps like ``observation`` would be plain for good: above the
        largest speculative batch, or, while the policy rests in plain mode (a probe's return
        mode), where its rule would not enter speculation, patience aside. From speculation
        False: leaving takes the patience, and a batch that shrinks back would keep
        speculating. Changes no state (a deferred draft prefill asks it about the batch a
        prefill joins)."""

    @property
    def max_speculative_batch(self) -> int:
        """Largest batch that may speculate (the speculative CUDA graphs' limit)."""

    def decide(self, observation: StepObservation) -> DecodeMode:
        """The mode of the step described by ``observation``."""

    def wants_fresh_costs(self) -> bool:
        """True when the next decision should read a cost table refreshed after this step
        (the same on every tensor-parallel rank: it depends only on the decisions)."""

    def report(self) -> Dict[str, ReportValue]:
        """The policy's configuration and state, for ``/server_info``."""


class PatienceStreak:
    """Counts consecutive qualifying steps; says when ``patience`` of them have been seen."""

    def __init__(self, patience: int) -> None:
        self.patience = check_int_at_least(PATIENCE_FLAG, patience, 1)
        self._length = 0

    def advance(self, qualifies: bool) -> bool:
        """Count one step; True when this step completes a streak (which then restarts)."""
        if not qualifies:
            self._length = 0
            return False
        self._length += 1
        if self._length >= self.patience:
            self._length = 0
            return True
        return False

    def reset(self) -> None:
        self._length = 0


@dataclass(frozen=True)
class ThresholdPolicyConfig:
    """Fixed thresholds; see the module docstring."""

    disable_batch_threshold: int  # N; 0 = never turn speculation off by threshold
    enable_batch_threshold: int  # M <= N when N > 0; ignored when N == 0
    switch_patience: int  # K >= 1
    max_speculative_batch: int  # largest batch the speculative CUDA graphs cover

    def __post_init__(self) -> None:
        check_int_at_least(DISABLE_FLAG, self.disable_batch_threshold, 0)
        check_int_at_least(ENABLE_FLAG, self.enable_batch_threshold, 0)
        check_int_at_least(PATIENCE_FLAG, self.switch_patience, 1)
        check_int_at_least(_GRAPH_LIMIT_NAME, self.max_speculative_batch, 1)
        if 0 < self.disable_batch_threshold < self.enable_batch_threshold:
            raise ValueError(
                f"{ENABLE_FLAG} ({self.enable_batch_threshold}) must be <= "
                f"{DISABLE_FLAG} ({self.disable_batch_threshold}) when the latter is > 0"
            )

    @property
    def enable_limit(self) -> int:
        """Largest batch size that counts towards turning speculation back on."""
        if self.disable_batch_threshold == 0:
            return self.max_speculative_batch
        return min(self.enable_batch_threshold, self.max_speculative_batch)


class ThresholdPolicy:
    """Fixed batch-size thresholds with a band and patience; a :class:`DecodePolicy`."""

    def __init__(
        self,
        config: ThresholdPolicyConfig,
        initial_mode: DecodeMode = DecodeMode.SPECULATIVE,
    ) -> None:
        self._config = config
        self._mode = DecodeMode(initial_mode)
        self._streak = PatienceStreak(config.switch_patience)

    @property
    def mode(self) -> DecodeMode:
        return self._mode

    def expects_plain(self, observation: StepObservation) -> bool:
        batch_size = observation.batch_size
        if batch_size > self._config.max_speculative_batch:
            return True
        return self._mode is DecodeMode.PLAIN and batch_size > self._config.enable_limit

    @property
    def config(self) -> ThresholdPolicyConfig:
        return self._config

    @property
    def max_speculative_batch(self) -> int:
        return self._config.max_speculative_batch

    def decide(self, observation: StepObservation) -> DecodeMode:
        batch_size = observation.batch_size
        if batch_size > self._config.max_speculative_batch:
            self._streak.reset()
            self._mode = DecodeMode.PLAIN
        elif self._mode is DecodeMode.SPECULATIVE:
            threshold = self._config.disable_batch_threshold
            if threshold > 0 and self._streak.advance(batch_size > threshold):
                self._mode = DecodeMode.PLAIN
        elif self._streak.advance(batch_size <= self._config.enable_limit):
            self._mode = DecodeMode.SPECULATIVE
        return self._mode

    def wants_fresh_costs(self) -> bool:
        return False

    def report(self) -> Dict[str, ReportValue]:
        return {
            "policy": "threshold",
            "disable_batch_threshold": self._config.disable_batch_threshold,
            "enable_batch_threshold": self._config.enable_batch_threshold,
            "switch_patience": self._config.switch_patience,
            "max_speculative_graph_batch": self._config.max_speculative_batch,
        }
