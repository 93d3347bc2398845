"""A prefill's first token to the host before the draft's extend.

EAGLE-3's prefill is the target's extend (which samples the first token) and then the draft's
extend over the same prompt. sglang's overlap scheduler copies a batch's result to the host
after the whole forward (its copy stream waits for the forward stream), so every first token
waits for the draft's extend, 4-9% of the target's prefill GPU time, though nothing in the first
token depends on the draft. Here the draft's extend runs on a side stream instead:

```
 forward stream:  target extend -- publish --+                      (waits)   next forward
                                             |                          ^
 side stream:                                +--> draft extend --> stash -- done event
                                             |                          |
 copy stream:                                +--> first token to host   v
                                                              schedule stream waits for it
```

Three orderings keep the result exact; each is sglang's own, moved to the side stream:

1. The side stream starts where sglang publishes the prefill (between the two extends): it
   waits for the forward stream there, so the draft reads the target's hidden states.
2. The scheduler's stash of the draft's output into its future map (``FutureMap.stash``, the
   next step's input tokens, draft seeds and hidden states) runs on the side stream, after the
   draft extend. The stash of every other batch runs where sglang runs it.
3. After every launch the scheduler fences its next GPU work behind the forward's reads
   (``Scheduler._apply_war_barrier``, reading the worker's ``war_fastpath_runner``); after an
   early prefill the worker hands it this object, whose event is the side stream's end, so the
   schedule stream, and through it the next forward (which waits for the schedule stream), waits
   for the draft extend and the stash, as sglang's barrier waited for the whole forward.

The GPU work is the same and in the same order for every later step; what moves is the first
token's copy and the host's handling of it, by the draft extend's time. Only with sglang's
overlap scheduler (without it the host waits for the whole forward anyway), one tensor-parallel
rank (a draft extend on another stream would issue its collectives there), sglang's fine-grained
barrier (``SGLANG_FORCE_COARSE_WAR_BARRIER`` makes the barrier wait for the forward stream alone)
and without sglang's unified memory pool (whose forward-done event is recorded on the forward
stream). ``SGLANG_DYNAMIC_EAGLE_EARLY_FIRST_TOKEN=0`` keeps sglang's order.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Any, Callable, Iterator, Optional

import torch
from sglang.srt.environ import envs

logger = logging.getLogger(__name__)


class CudaStreams:
    """The stream operations the early first token uses (a fake in the CPU tests)."""

    def new_stream(self) -> Any:
        return torch.cuda.Stream()

    def current(self) -> Any:
        return torch.cuda.current_stream()

    def use(self, stream) -> Any:
        return torch.cuda.stream(stream)

    def mark(self, stream) -> Any:
        event = torch.cuda.Event()
        event.record(stream)
        return event


def coarse_barrier_forced() -> bool:
    return bool(envs.SGLANG_FORCE_COARSE_WAR_BARRIER.get())


class EarlyFirstToken:
    """See the module docstring. ``attach`` once the scheduler exists; ``prefill`` around each
    prefill forward; the worker returns this object as its ``war_fastpath_runner`` while
    ``war_fastpath_read_done_event`` is set (the scheduler reads and clears it)."""

    def __init__(self, enabled: bool, tp_size: int = 1, streams: Optional[CudaStreams] = None,
                 coarse_barrier: Callable[[], bool] = coarse_barrier_forced) -> None:
        self.enabled = enabled and tp_size == 1
        self.active = False
        self.why_off = ("not attached to a scheduler yet" if self.enabled else
                        "tensor parallelism" if enabled else
                        "SGLANG_DYNAMIC_EAGLE_EARLY_FIRST_TOKEN=0")
        self.war_fastpath_read_done_event: Any = None
        self._streams = streams or CudaStreams()
        self._coarse_barrier = coarse_barrier
        self._attached = False
        self._stream: Any = None
        self._stash_for: Any = None  # the bonus tokens of the prefill whose stash moves
        self._on_side = False  # the prefill in progress moved to the side stream

    def attach(self, scheduler) -> None:
        """Once, at the scheduler's first batch choice: wrap its future map's ``stash``."""
        if self._attached:
            return
        self._attached = True
        if not self.enabled:
            return
        self.why_off = self._unsupported(scheduler)
        if self.why_off:
            logger.info("EAGLE3_DYNAMIC: first tokens wait for the draft's prefill (%s).",
                        self.why_off)
            return
        future_map = scheduler.future_map
        future_map.stash = partial(self._stash, future_map.stash)
        self._stream = self._streams.new_stream()
        self.active = True

    def _unsupported(self, scheduler) -> str:
        if not getattr(scheduler, "enable_overlap", False):
            return "no overlap scheduler"
        if getattr(scheduler, "future_map", None) is None:
            return "the scheduler has no future map"
        if not getattr(scheduler, "_war_barrier_enabled", False):
            return "sglang's barrier after a launch is off"
        if self._coarse_barrier():
            return "SGLANG_FORCE_COARSE_WAR_BARRIER is set"
        if getattr(scheduler, "enable_unified_memory", False):
            return "sglang's unified memory pool (its forward-done event misses the side stream)"
        return ""

    @contextmanager
    def prefill(self, on_publish: Optional[Callable[[Any], None]]) -> Iterator[Any]:
        """Yields the ``on_publish`` to give sglang's prefill: it publishes, then moves the rest
        of the prefill (the draft extend) to the side stream until the block ends. Call
        :meth:`launched` with the prefill's result inside the block."""
        if not self.active or on_publish is None:
            yield on_publish
            return
        self._stash_for = None
        with ExitStack() as side:

            def publish(new_seq_lens) -> None:
                on_publish(new_seq_lens)
                self._stream.wait_stream(self._streams.current())
                side.enter_context(self._streams.use(self._stream))
                self._on_side = True

            self._on_side = False
            yield publish
        if self._on_side:
            self.war_fastpath_read_done_event = self._streams.mark(self._stream)
            self._on_side = False

    def launched(self, result) -> None:
        """The prefill's result, inside :meth:`prefill`'s block: if its draft extend ran on the
        side stream, the scheduler's stash of its draft input moves there too."""
        if self._on_side:
            draft_input = getattr(result, "next_draft_input", None)
            self._stash_for = getattr(draft_input, "bonus_tokens", None)

    def _stash(self, original, future_indices, payload) -> None:
        moved = self._stash_for
        if moved is None or getattr(payload, "bonus_tokens", None) is not moved:
            return original(future_indices, payload)
        self._stash_for = None
        with self._streams.use(self._stream):
            original(future_indices, payload)
        self.war_fastpath_read_done_event = self._streams.mark(self._stream)
        return None

    def report(self) -> dict:
        return {"early_first_token": self.active, "early_first_token_off": self.why_off}
