"""Switching policy for EAGLE3_DYNAMIC: speculate at small decode batches, decode plainly at large ones.

Speculation turns off once the running decode batch stays above N (the disable threshold)
and turns back on only once it stays at or below M <= N (the enable threshold). Batch sizes
in the band (M, N] keep whatever mode is current, so a batch hovering around one threshold
does not toggle the mode. Each change also needs `switch_patience` (K) consecutive qualifying
steps: switching back to speculation costs a draft-KV catch-up for every running request, and
patience stops bursty load from flapping the mode. A batch larger than the biggest speculative
CUDA graph forces plain decoding at once. The policy is a pure function of the batch-size
sequence (no clock, no randomness), so every tensor-parallel rank makes the same decisions.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# Measured on one H200 (8B-shaped model, EAGLE-3 steps 3, topk 1, 4 draft tokens, simulated
# acceptance 3.0, input 512 / output 256), output throughput EAGLE-3 vs plain decoding, tok/s:
# c=1 368 vs 201, c=4 1111 vs 779, c=16 2674 vs 2559, c=64 4013 vs 6136, c=128 4456 vs 9357.
# EAGLE-3 still wins at 16 and loses clearly by 64, so speculation stays on through batch 16
# (M=16) and turns off above 24 (N=24); the band between the two avoids flapping.
DEFAULT_DISABLE_BATCH_THRESHOLD = 24
DEFAULT_ENABLE_BATCH_THRESHOLD = 16
DEFAULT_SWITCH_PATIENCE = 4

_DISABLE_FLAG = "--speculative-disable-batch-threshold"
_ENABLE_FLAG = "--speculative-enable-batch-threshold"
_PATIENCE_FLAG = "--speculative-switch-patience"
_GRAPH_LIMIT_NAME = "max_speculative_batch (largest speculative CUDA-graph batch)"


class DecodeMode(str, enum.Enum):
    SPECULATIVE = "speculative"
    PLAIN = "plain"


def _check_int_at_least(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


@dataclass(frozen=True)
class SwitchPolicyConfig:
    """Thresholds of the switching policy; see the module docstring."""

    disable_batch_threshold: int  # N; 0 = never turn speculation off by threshold
    enable_batch_threshold: int  # M <= N when N > 0; ignored when N == 0
    switch_patience: int  # K >= 1
    max_speculative_batch: int  # largest batch the speculative CUDA graphs cover

    def __post_init__(self) -> None:
        _check_int_at_least(_DISABLE_FLAG, self.disable_batch_threshold, 0)
        _check_int_at_least(_ENABLE_FLAG, self.enable_batch_threshold, 0)
        _check_int_at_least(_PATIENCE_FLAG, self.switch_patience, 1)
        _check_int_at_least(_GRAPH_LIMIT_NAME, self.max_speculative_batch, 1)
        if 0 < self.disable_batch_threshold < self.enable_batch_threshold:
            raise ValueError(
                f"{_ENABLE_FLAG} ({self.enable_batch_threshold}) must be <= "
                f"{_DISABLE_FLAG} ({self.disable_batch_threshold}) when the latter is > 0"
            )

    @property
    def enable_limit(self) -> int:
        """Largest batch size that counts towards turning speculation back on."""
        if self.disable_batch_threshold == 0:
            return self.max_speculative_batch
        return min(self.enable_batch_threshold, self.max_speculative_batch)


class SwitchPolicy:
    """Decides, one decode step at a time, whether the step speculates or decodes plainly."""

    def __init__(
        self,
        config: SwitchPolicyConfig,
        initial_mode: DecodeMode = DecodeMode.SPECULATIVE,
    ) -> None:
        self._config = config
        self._mode = DecodeMode(initial_mode)
        self._streak = 0  # consecutive steps that qualify for leaving the current mode
        self._switches_to_plain = 0
        self._switches_to_speculative = 0

    @property
    def mode(self) -> DecodeMode:
        return self._mode

    @property
    def config(self) -> SwitchPolicyConfig:
        return self._config

    @property
    def switches_to_plain(self) -> int:
        return self._switches_to_plain

    @property
    def switches_to_speculative(self) -> int:
        return self._switches_to_speculative

    def observe(self, batch_size: int) -> DecodeMode:
        """Feed the running decode batch size of one decode step; returns the mode that step runs in."""
        if batch_size < 0:
            raise ValueError(f"batch_size must be >= 0, got {batch_size}")
        if batch_size > self._config.max_speculative_batch:
            self._streak = 0
            if self._mode is DecodeMode.SPECULATIVE:
                self._switch(DecodeMode.PLAIN, batch_size)
        elif self._mode is DecodeMode.SPECULATIVE:
            self._step_speculative(batch_size)
        else:
            self._step_plain(batch_size)
        return self._mode

    def _step_speculative(self, batch_size: int) -> None:
        threshold = self._config.disable_batch_threshold
        if threshold == 0:
            return
        self._advance_streak(batch_size > threshold, DecodeMode.PLAIN, batch_size)

    def _step_plain(self, batch_size: int) -> None:
        qualifies = batch_size <= self._config.enable_limit
        self._advance_streak(qualifies, DecodeMode.SPECULATIVE, batch_size)

    def _advance_streak(self, qualifies: bool, target: DecodeMode, batch_size: int) -> None:
        if not qualifies:
            self._streak = 0
            return
        self._streak += 1
        if self._streak >= self._config.switch_patience:
            self._switch(target, batch_size)

    def _switch(self, target: DecodeMode, batch_size: int) -> None:
        self._mode = target
        self._streak = 0
        if target is DecodeMode.PLAIN:
            self._switches_to_plain += 1
        else:
            self._switches_to_speculative += 1
        logger.debug("decode mode -> %s at batch size %d", target.value, batch_size)
