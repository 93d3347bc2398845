"""Switching policies: pure Python (no torch, no sglang), deterministic in their inputs.

* ``types``: what a policy sees (:class:`StepObservation`) and says (:class:`DecodeMode`).
* ``step_model``: what a decode step of each mode costs and yields, fitted online.
* ``throughput``: the automatic policy (the default), from that model.
* ``threshold``: fixed batch-size thresholds (``--speculative-disable-batch-threshold N``).
* ``replay``: replays recorded step traces against a policy and against the oracle.
"""

from sglang_dynamic_eagle.policy.threshold import (
    DEFAULT_ENABLE_BATCH_THRESHOLD,
    DEFAULT_SWITCH_PATIENCE,
    PatienceStreak,
    ThresholdPolicy,
    ThresholdPolicyConfig,
)
from sglang_dynamic_eagle.policy.types import (
    ALGORITHM_NAME,
    DISABLE_FLAG,
    ENABLE_FLAG,
    PATIENCE_FLAG,
    DecodeMode,
    DecodePolicy,
    ReportValue,
    StepObservation,
    check_int_at_least,
)

__all__ = [
    "ALGORITHM_NAME", "DEFAULT_ENABLE_BATCH_THRESHOLD", "DEFAULT_SWITCH_PATIENCE", "DISABLE_FLAG",
    "ENABLE_FLAG", "PATIENCE_FLAG", "DecodeMode", "DecodePolicy", "PatienceStreak", "ReportValue",
    "StepObservation", "ThresholdPolicy", "ThresholdPolicyConfig", "check_int_at_least",
]
