"""The automatic policy's recent decisions beside the step time measured for each, for
``/server_info``: what it saw, both modes' predicted output tokens per second, the time it
predicted for the step it chose and the time that step took, and the mean prediction error
over them (README: "What the server reports"). Fed by the worker's policy feed: a decision at
its step's end, a measured time when the timing feed hands it over (some steps later)."""

from __future__ import annotations

from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

RECENT_DECISIONS = 16  # decisions with a measured time kept for /server_info


class DecisionLog:
    def __init__(self, size: int = RECENT_DECISIONS) -> None:
        self._size = size
        self._latest = None
        self._waiting: Dict[int, object] = {}  # step -> its decision, until its time comes back
        self._measured: Deque[Tuple[object, float]] = deque(maxlen=size)

    def decided(self, decision) -> None:
        """A decided step (``policy.throughput.Decision``; None: nothing to log)."""
        if decision is None:
            return
        self._latest = decision
        self._waiting[decision.step] = decision
        while len(self._waiting) > 4 * self._size:  # steps whose time never came back
            del self._waiting[next(iter(self._waiting))]  # the oldest (steps come in order)

    def timed(self, step: int, mode, ms: float) -> None:
        """Decided step ``step`` took ``ms`` (a time of another mode than decided is not its)."""
        decision = self._waiting.pop(step, None)
        if decision is not None and decision.mode is mode:
            self._measured.append((decision, ms))

    def prediction_error(self) -> Optional[float]:
        """Mean |predicted - measured| / measured over the logged decisions with both."""
        errors = [abs(d.predicted_ms - ms) / ms for d, ms in self._measured if d.predicted_ms and ms]
        return sum(errors) / len(errors) if errors else None

    def report(self) -> Dict[str, object]:
        error = self.prediction_error()
        recent: List[dict] = [{**d.as_dict(), "measured_ms": round(ms, 3)} for d, ms in self._measured]
        if self._latest is not None and (not self._measured or self._measured[-1][0] is not self._latest):
            recent.append({**self._latest.as_dict(), "measured_ms": None})
        return {"prediction_error": round(error, 4) if error is not None else 0.0,
                # The latest decisions whose step time came back, then the latest one.
                "recent_decisions": recent}
