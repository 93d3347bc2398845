"""Mode counters for EAGLE3_DYNAMIC: what tests, the benchmark and operators read.

Pure Python. The worker updates them on the scheduler's CPU thread; they are
exported under the ``dynamic_eagle`` key of ``/server_info`` and logged
with sglang's periodic decode log line.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, Optional, Sequence, Tuple, Union

from sglang_dynamic_eagle.policy import DecodeMode


@dataclass
class ModeCounters:
    speculative_steps: int = 0
    plain_steps: int = 0
    plain_graph_steps: int = 0
    switches_to_plain: int = 0
    switches_to_speculative: int = 0
    catchup_forwards: int = 0
    catchup_tokens: int = 0
    catchup_truncated_tokens: int = 0
    speculative_verified_requests: int = 0
    speculative_accepted_tokens: int = 0
    max_plain_batch: int = 0
    max_speculative_batch: int = 0
    # Results whose request count differs from their step's batch size: a sign that the
    # launch-order attribution below has slipped (expected to stay 0).
    mismatched_results: int = 0
    # The decode step (worker's index) of the latest result attributed by record_result.
    verified_step: int = 0
    # Decode steps decided when the scheduler chose their batch, not at the worker's call.
    decided_at_batch_selection: int = 0
    # Host (CPU) seconds of the scheduler thread, decode steps only: the worker's own work
    # around a step (its view of the batch, the policy, bookkeeping, its part of result
    # processing; with a trace, the trace's writes; with tensor parallelism, the timing feed's
    # all-reduce every few steps, which waits for the slowest rank), and each mode's step (its
    # launches, a speculative step's with its catch-up; with overlap scheduling the GPU runs
    # behind them). Where a step's host time reaches its GPU time, the host paces the GPU;
    # compare them with the step times in the policy's report.
    host_dispatch_s: float = 0.0
    host_before_launch_s: float = 0.0  # of it, from the worker's call to the mode's step
    host_step_s: Dict[DecodeMode, float] = field(
        default_factory=lambda: {DecodeMode.PLAIN: 0.0, DecodeMode.SPECULATIVE: 0.0})
    _pending_modes: Deque[Tuple[DecodeMode, int, int]] = field(default_factory=deque, repr=False)

    def record_step(self, mode: DecodeMode, batch_size: int, *, ran_graph: bool,
                    step: int = 0, decided_at_selection: bool = False) -> None:
        """Count one decode step at launch time."""
        self.decided_at_batch_selection += int(decided_at_selection)
        if mode == DecodeMode.PLAIN:
            self.plain_steps += 1
            self.plain_graph_steps += int(ran_graph)
            self.max_plain_batch = max(self.max_plain_batch, batch_size)
        else:
            self.speculative_steps += 1
            self.max_speculative_batch = max(self.max_speculative_batch, batch_size)
        self._pending_modes.append((mode, batch_size, step))

    def record_host(self, mode: Optional[DecodeMode], dispatch_s: float, step_s: float = 0.0,
                    before_launch_s: float = 0.0) -> None:
        """Host seconds of one decode step's dispatch (``before_launch_s`` of it before the mode's
        step was called) and of its mode's step call (mode None: dispatch work outside a step,
        e.g. result processing)."""
        self.host_dispatch_s += dispatch_s
        self.host_before_launch_s += before_launch_s
        if mode is not None:
            self.host_step_s[mode] += step_s

    def record_switch(self, new_mode: DecodeMode) -> None:
        if new_mode == DecodeMode.PLAIN:
            self.switches_to_plain += 1
        else:
            self.switches_to_speculative += 1

    def record_catchup(self, tokens: int, truncated_tokens: int) -> None:
        self.catchup_forwards += 1
        self.catchup_tokens += tokens
        self.catchup_truncated_tokens += truncated_tokens

    def record_result(self, num_correct_drafts_per_req: Sequence[int]) -> Optional[DecodeMode]:
        """Attribute one processed decode result to the step that produced it; returns
        that step's mode (None for a result with no pending step).

        Results are processed in launch order, so the oldest pending mode is
        the one this result belongs to. Plain results carry no acceptance.
        """
        if not self._pending_modes:
            return None
        mode, batch_size, self.verified_step = self._pending_modes.popleft()
        if num_correct_drafts_per_req and len(num_correct_drafts_per_req) != batch_size:
            self.mismatched_results += 1
        if mode == DecodeMode.SPECULATIVE:
            self.speculative_verified_requests += len(num_correct_drafts_per_req)
            self.speculative_accepted_tokens += sum(num_correct_drafts_per_req) + len(
                num_correct_drafts_per_req
            )
        return mode

    @property
    def mean_accept_length(self) -> float:
        """Tokens per request per speculative verify step, bonus token included."""
        if self.speculative_verified_requests == 0:
            return 0.0
        return self.speculative_accepted_tokens / self.speculative_verified_requests

    def snapshot(self) -> Dict[str, Union[int, float]]:
        return {
            "speculative_steps": self.speculative_steps,
            "plain_steps": self.plain_steps,
            "plain_graph_steps": self.plain_graph_steps,
            "switches_to_plain": self.switches_to_plain,
            "switches_to_speculative": self.switches_to_speculative,
            "catchup_forwards": self.catchup_forwards,
            "catchup_tokens": self.catchup_tokens,
            "catchup_truncated_tokens": self.catchup_truncated_tokens,
            "speculative_verified_requests": self.speculative_verified_requests,
            "speculative_accepted_tokens": self.speculative_accepted_tokens,
            "mean_accept_length": round(self.mean_accept_length, 4),
            "max_plain_batch": self.max_plain_batch,
            "max_speculative_batch": self.max_speculative_batch,
            "mismatched_results": self.mismatched_results,
            "decided_at_batch_selection": self.decided_at_batch_selection,
            "host_dispatch_ms": round(1000 * self.host_dispatch_s, 3),
            "host_before_launch_ms": round(1000 * self.host_before_launch_s, 3),
            "host_speculative_step_ms": round(1000 * self.host_step_s[DecodeMode.SPECULATIVE], 3),
            "host_plain_step_ms": round(1000 * self.host_step_s[DecodeMode.PLAIN], 3),
        }

    def log_line(self) -> str:
        return (
            f"EAGLE3_DYNAMIC: spec steps {self.speculative_steps}, "
            f"plain steps {self.plain_steps} ({self.plain_graph_steps} graph), "
            f"switches to plain {self.switches_to_plain}, "
            f"to spec {self.switches_to_speculative}, "
            f"catch-up tokens {self.catchup_tokens}, "
            f"spec accept len {self.mean_accept_length:.2f}"
        )
