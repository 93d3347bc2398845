"""What a switching policy sees and says: pure types, no torch, no sglang.

The worker asks a policy once per decode step: a :class:`StepObservation` in (the running
batch, its KV tokens, the queue, the acceptance record of its requests), a :class:`DecodeMode`
out. Every input is identical on every tensor-parallel rank (batch and queue are the
scheduler's, identical by construction; acceptance comes from verify results; step timings
are all-reduced before a policy sees them), and policies are deterministic functions of their
inputs (no clock, no randomness), so every rank takes the same branch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Dict, List, Protocol, Sequence, Union

ALGORITHM_NAME = "EAGLE3_DYNAMIC"
DISABLE_FLAG = "--speculative-disable-batch-threshold"
ENABLE_FLAG = "--speculative-enable-batch-threshold"
PATIENCE_FLAG = "--speculative-switch-patience"

ReportValue = Union[int, float, str, Dict[str, float], List[int], List[dict]]


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
    """One decode step, before it runs.

    ``verifies[i]`` / ``accepted[i]``: verify steps request ``i`` of the batch has been through
    and the tokens they yielded (bonus tokens included); empty sequences mean "unknown" (every
    request then counts at the server-wide acceptance). ``remaining[i]``: tokens request ``i``
    may still emit (``max_new_tokens`` minus its output): a step yields no more than that.
    """

    batch_size: int
    kv_tokens: int = 0  # KV entries the batch's attention reads (sum of its sequence lengths)
    queued: int = 0  # requests waiting to be admitted
    verifies: Sequence[int] = ()
    accepted: Sequence[int] = ()
    remaining: Sequence[int] = ()  # tokens each request may still emit (empty: unbounded)
    step: int = 0  # the decode step's index on this server (matches timings to decisions)

    def __post_init__(self) -> None:
        if self.batch_size < 0 or self.kv_tokens < 0 or self.queued < 0:
            raise ValueError(f"negative batch_size, kv_tokens or queued: {self}")
        if len(self.verifies) != len(self.accepted):
            raise ValueError("verifies and accepted must have one entry per request")
        if self.remaining and len(self.remaining) != self.batch_size:
            raise ValueError("remaining must have one entry per request of the batch")


class DecodePolicy(Protocol):
    """What the worker needs of a switching policy."""

    @property
    def mode(self) -> DecodeMode:
        """The mode of the latest decided step (the initial mode before the first)."""

    @property
    def max_speculative_batch(self) -> int:
        """Largest batch that may speculate (the speculative CUDA graphs' limit)."""

    def decide(self, observation: StepObservation) -> DecodeMode:
        """The mode of the step described by ``observation``."""

    def report(self) -> Dict[str, ReportValue]:
        """The policy's configuration and state, for ``/server_info``."""
