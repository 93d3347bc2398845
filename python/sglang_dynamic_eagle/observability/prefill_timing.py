"""What prefill batches cost on the GPU: the target's extend and the draft's, apart.

Three CUDA events per prefill batch (:meth:`PrefillTimer.timed`): before the target extend,
between the target extend and the draft extend (sglang's worker publishes there, in
non-overlap mode too, when given a callback), and after the draft extend. Intervals are read with ``Event.query()`` as they complete, never
waited for. The target part includes the capture of EAGLE-3's auxiliary hidden states and the
sampling of the first token; the draft part is the draft extend over every prompt token and the
draft's first proposal.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Optional

import torch


def _event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


@dataclass
class PrefillEvents:
    num_tokens: int
    start: torch.cuda.Event
    target_end: Optional[torch.cuda.Event] = None
    end: Optional[torch.cuda.Event] = None
    key: Optional[int] = None  # the caller's name for the batch (its draft part goes to key_sink)


class PrefillTimer:
    """Totals over completed prefill batches (batches, tokens, target ms, draft ms); each
    completed batch also goes to ``sink(tokens, target_ms, draft_ms)`` where one is set (the
    decode-step trace's)."""

    def __init__(self) -> None:
        self._pending: Deque[PrefillEvents] = deque()
        self.batches = 0
        self.tokens = 0
        self.target_ms = 0.0
        self.draft_ms = 0.0
        self.sink: Optional[Callable[[int, float, float], None]] = None
        # A keyed batch's draft milliseconds, as ``key_sink(key, draft_ms)`` (the timing feed's).
        self.key_sink: Optional[Callable[[int, float], None]] = None

    def timed(self, num_tokens: int, on_publish: Optional[Callable[[Any], None]],
              forward: Callable[[Callable[[Any], None]], Any], key: Optional[int] = None) -> Any:
        """``forward(publish)`` for a prefill of ``num_tokens``, timed in two parts: the
        ``publish`` it is given marks the end of the target extend, then calls ``on_publish``
        (the scheduler's, if any)."""
        self.harvest()  # keeps the pending events few without a report reading them
        events = self.start(num_tokens, key)

        def publish(new_seq_lens) -> None:
            self.target_done(events)
            if on_publish is not None:
                on_publish(new_seq_lens)

        result = forward(publish)
        self.stop(events)
        return result

    def start(self, num_tokens: int, key: Optional[int] = None) -> PrefillEvents:
        return PrefillEvents(num_tokens, _event(), key=key)

    def target_done(self, events: PrefillEvents) -> None:
        events.target_end = _event()

    def stop(self, events: PrefillEvents) -> None:
        """End of the batch's work; a batch whose target end was never marked is not counted."""
        if events.target_end is None:
            return
        events.end = _event()
        self._pending.append(events)

    def harvest(self) -> None:
        while self._pending and self._pending[0].end.query():
            events = self._pending.popleft()
            target_ms = events.start.elapsed_time(events.target_end)
            draft_ms = events.target_end.elapsed_time(events.end)
            self.batches += 1
            self.tokens += events.num_tokens
            self.target_ms += target_ms
            self.draft_ms += draft_ms
            if self.sink is not None:
                self.sink(events.num_tokens, target_ms, draft_ms)
            if self.key_sink is not None and events.key is not None:
                self.key_sink(events.key, draft_ms)

    def report(self) -> Dict[str, float]:
        self.harvest()
        return {
            "prefill_batches": self.batches,
            "prefill_tokens": self.tokens,
            "prefill_target_gpu_ms": round(self.target_ms, 3),
            "prefill_draft_gpu_ms": round(self.draft_ms, 3),
        }
