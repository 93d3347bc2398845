"""Fixed batch-size thresholds (``--speculative-disable-batch-threshold N``): the operator's
override of the automatic policy.

Speculation turns off once the running decode batch stays above N for K consecutive steps
(K = ``--speculative-switch-patience``) and back on once it stays at or below M <= N
(``--speculative-enable-batch-threshold``). Batches in the band (M, N] keep the current mode;
N = 0 always speculates. A batch above the largest speculative CUDA graph decodes plainly at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

from sglang_dynamic_eagle.policy.types import (
    DISABLE_FLAG,
    ENABLE_FLAG,
    PATIENCE_FLAG,
    DecodeMode,
    ReportValue,
    StepObservation,
    check_int_at_least,
)

# Measured on one H200 (8B-shaped model, EAGLE-3 steps 3, topk 1, 4 draft tokens, simulated
# acceptance 3.0, input 512 / output 256), output throughput EAGLE-3 vs plain decoding, tok/s:
# c=1 368 vs 201, c=4 1111 vs 779, c=16 2674 vs 2559, c=64 4013 vs 6136, c=128 4456 vs 9357.
# The enable threshold used when only N is given comes from that table.
DEFAULT_ENABLE_BATCH_THRESHOLD = 16
DEFAULT_SWITCH_PATIENCE = 4
_GRAPH_LIMIT_NAME = "max_speculative_batch (largest speculative CUDA-graph batch)"


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
    """Fixed batch-size thresholds with a band and patience; a ``DecodePolicy``."""

    def __init__(
        self, config: ThresholdPolicyConfig, initial_mode: DecodeMode = DecodeMode.SPECULATIVE
    ) -> None:
        self.config = config
        self._mode = DecodeMode(initial_mode)
        self._streak = PatienceStreak(config.switch_patience)

    @property
    def mode(self) -> DecodeMode:
        return self._mode

    @property
    def max_speculative_batch(self) -> int:
        return self.config.max_speculative_batch

    def decide(self, observation: StepObservation) -> DecodeMode:
        batch_size = observation.batch_size
        if batch_size > self.config.max_speculative_batch:
            self._streak.reset()
            self._mode = DecodeMode.PLAIN
        elif self._mode is DecodeMode.SPECULATIVE:
            threshold = self.config.disable_batch_threshold
            if threshold > 0 and self._streak.advance(batch_size > threshold):
                self._mode = DecodeMode.PLAIN
        elif self._streak.advance(batch_size <= self.config.enable_limit):
            self._mode = DecodeMode.SPECULATIVE
        return self._mode

    def report(self) -> Dict[str, ReportValue]:
        return {
            "policy": "threshold",
            "disable_batch_threshold": self.config.disable_batch_threshold,
            "enable_batch_threshold": self.config.enable_batch_threshold,
            "switch_patience": self.config.switch_patience,
            "max_speculative_graph_batch": self.config.max_speculative_batch,
        }
