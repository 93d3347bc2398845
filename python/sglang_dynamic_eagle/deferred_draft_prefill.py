"""Prefill without the draft's prefill: its draft KV is left to the catch-up, or never read.

When the prefilled requests will decode plainly, a prefill's draft extend (about 2% of the
target's prefill GPU time with the 8B-shaped model, 2026-12-01) writes draft KV that only a
later speculative step reads, and it makes the batch's first tokens wait for it. With
``SGLANG_DYNAMIC_EAGLE_DEFER_DRAFT_PREFILL=W``, a text prefill batch whose requests join a
batch that the policy expects to decode plainly (``DecodePolicy.expects_plain`` at the size
of :class:`RunningRequests` with the batch's requests: from plain mode, or above the largest
speculative batch) runs the target extend alone (capturing EAGLE-3's auxiliary hidden states as
sglang's does) and stashes each request's last W positions of the batch (token and auxiliary
hidden states) in the catch-up ring, as plain steps stash theirs. If speculation resumes, the
catch-up rebuilds their draft KV together with the positions decoded plainly since. Older
prompt positions keep stale draft KV (zeros or another request's entries): acceptance pays
for them, never an output token, since the target verifies every one; through the radix cache
a later request that shares such a prefix pays it too.

A prefill whose requests all ask for at most two tokens runs the target extend alone in either
mode and stashes nothing, with or without a window (``short_requests``: by default such
requests cache their prefixes apart from every other request, so that no draft KV they leave
stale is ever read). In a speculative step their rows propose from the stub:
:class:`StubProposals` keeps their verifications out of the policy's acceptance estimate (the
mode counters count them).

The window is off by default. Outputs stay lossless, but stale prompt draft KV costs
acceptance wherever a later speculative step reads it: with a draft that copies from its
prompt (one H200, 2026-12-02), a window covering the prompt kept EAGLE3's acceptance (3.250
against 3.160 tokens per verify) and a window of 16 lost 28% of it. The server cannot know at
the prefill whether a prompt will be read that far back or its prefix reused.
"""

from __future__ import annotations

import os
from collections import deque
from typing import TYPE_CHECKING, Callable, Deque, Dict, FrozenSet, Iterable, List, Optional, Sequence

from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

from sglang_dynamic_eagle.draft_catchup import MAX_WINDOW, batch_req_pool_indices
from sglang_dynamic_eagle.short_requests import (ShortPrefill, all_in_separate_cache,
                                                 asks_at_most_two_tokens)
from sglang_dynamic_eagle.startup_errors import StartupError

if TYPE_CHECKING:
    from sglang_dynamic_eagle.draft_catchup import DraftCatchup
    from sglang_dynamic_eagle.plain_step import PlainDecodeStep

DEFER_ENV = "SGLANG_DYNAMIC_EAGLE_DEFER_DRAFT_PREFILL"


def deferred_prefill_window() -> int:
    """Positions per request a deferred prefill stashes, from the environment; 0: off
    (checked at server start-up)."""
    raw = os.environ.get(DEFER_ENV, "0")
    if not raw.isdigit() or int(raw) > MAX_WINDOW:
        raise StartupError(
            f"{DEFER_ENV}={raw!r} is invalid: set it to the number of prompt positions per "
            f"request (1 to {MAX_WINDOW}) whose draft KV a deferred prefill leaves to the "
            "catch-up, or to 0 or unset to keep the draft's prefill."
        )
    return int(raw)


def can_defer(batch: ScheduleBatch) -> bool:
    """A prefill of text prompts alone: mixed batches, input embeddings and multimodal
    inputs keep sglang's path."""
    return (
        batch.forward_mode == ForwardMode.EXTEND
        and batch.input_embeds is None
        and not any(batch.multimodal_inputs or ())
    )


def decode_at_most_once(batch: ScheduleBatch) -> bool:
    """Every request of the batch finishes within one decode step after its prefill (of a
    decode batch: in this step)."""
    return all(asks_at_most_two_tokens(request) for request in batch.reqs)


def defers_short_requests(batch: ScheduleBatch, short_prefill: ShortPrefill) -> bool:
    """Whether the prefill is one of short requests alone that skips the draft: with
    ``separate-cache``, requests that sglang caches apart (the key decides, not the length:
    only they are sure never to share their prefix with a request that speculates)."""
    if short_prefill is ShortPrefill.SEPARATE_CACHE:
        return all_in_separate_cache(batch.reqs)
    return short_prefill is ShortPrefill.SHARED_CACHE and decode_at_most_once(batch)


class RunningRequests:
    """The requests a prefill's requests will decode with: those of the latest decode step and
    those prefilled since, less the finished ones. The worker sees only its own batches, and a
    prefill batch holds only the new requests."""

    def __init__(self) -> None:
        self._decoded: List[object] = []
        self._prefilled: Dict[int, object] = {}

    def decoded(self, requests: Iterable) -> None:
        """Every decode step: a copy of the list only (the batch extends its own in place)."""
        self._decoded = list(requests)
        self._prefilled = {}

    def prefilled(self, requests: Iterable) -> None:
        self._prefilled.update((id(request), request) for request in requests)

    def count(self) -> int:
        running = {id(request): request for request in self._decoded}
        running.update(self._prefilled)
        return sum(1 for request in running.values() if not request.finished())


class StubProposals:
    """The rows of speculative steps whose requests' prefill stashed nothing: they propose from
    the stub, so their verifications measure the stub, not the draft. Results are processed in
    launch order, so each speculative result takes the oldest launched step's rows."""

    def __init__(self) -> None:
        self._requests: Dict[int, object] = {}
        self._pending_rows: Deque[FrozenSet[int]] = deque()

    def prefilled(self, requests: Iterable) -> None:
        self._requests = {key: request for key, request in self._requests.items()
                          if not request.finished()}
        self._requests.update((id(request), request) for request in requests)

    def speculative_step(self, requests: Sequence) -> None:
        self._pending_rows.append(frozenset(
            row for row, request in enumerate(requests) if id(request) in self._requests
        ) if self._requests else frozenset())

    def drafted(self, num_correct_drafts_per_req: Sequence[int]) -> Sequence[int]:
        """The oldest pending speculative step's accepted drafts, less the stub rows'."""
        rows = self._pending_rows.popleft() if self._pending_rows else frozenset()
        if not rows:
            return num_correct_drafts_per_req
        return [count for row, count in enumerate(num_correct_drafts_per_req) if row not in rows]


class NoDeferral:
    """The deferral off: what the worker asks of a deferral, answered so that every prefill
    runs the draft extend."""

    def window_for(self, batch: ScheduleBatch, expects_plain: Callable[[int], bool]) -> Optional[int]:
        """Positions per request the prefill leaves to the catch-up instead of running the
        draft extend; None: it runs the draft extend. ``expects_plain(n)``: whether the
        policy expects a batch of n requests to decode plainly."""
        return None

    def decoded(self, batch: ScheduleBatch) -> None:
        """Every decode step, before it runs."""

    def speculative_step(self, batch: ScheduleBatch) -> None:
        """Every speculative step, at launch."""

    def drafted(self, num_correct_drafts_per_req: Sequence[int]) -> Sequence[int]:
        """A speculative step's accepted drafts per request that measure the draft."""
        return num_correct_drafts_per_req

    def report(self) -> Dict[str, int]:
        return {}


class DeferredDraftPrefill(NoDeferral):
    """The target-only prefill of one worker, which prefills take it, and what it has
    deferred."""

    def __init__(
        self,
        target_worker,
        catchup: DraftCatchup,
        plain_step: PlainDecodeStep,
        window: int,
        short_prefill: ShortPrefill,
    ) -> None:
        self._target_worker = target_worker
        self._catchup = catchup
        self._plain_step = plain_step
        self.window = window
        self.short_prefill = short_prefill
        self.batches = 0
        self.tokens = 0
        self.unstashed_batches = 0
        self._running = RunningRequests()
        self._stub_proposals = StubProposals()

    def window_for(self, batch: ScheduleBatch, expects_plain: Callable[[int], bool]) -> Optional[int]:
        if self.window:
            self._running.prefilled(batch.reqs)
        if not can_defer(batch):
            return None
        if defers_short_requests(batch, self.short_prefill):
            self._stub_proposals.prefilled(batch.reqs)
            return 0
        if self.window and expects_plain(self._running.count()):
            return self.window
        return None

    def decoded(self, batch: ScheduleBatch) -> None:
        # Only the window's rule reads the running requests: no copy per step without it.
        if self.window:
            self._running.decoded(batch.reqs)

    def speculative_step(self, batch: ScheduleBatch) -> None:
        self._stub_proposals.speculative_step(batch.reqs)

    def drafted(self, num_correct_drafts_per_req: Sequence[int]) -> Sequence[int]:
        return self._stub_proposals.drafted(num_correct_drafts_per_req)

    def run(self, batch: ScheduleBatch, on_publish, window: int) -> GenerationBatchResult:
        """The target extend of EAGLE-3's prefill, then a stash of each request's last
        ``window`` positions (0: none) instead of the draft extend. With nothing to stash the
        extend captures no hidden states: it is a plain server's prefill."""
        capture = CaptureHiddenMode.FULL if window else CaptureHiddenMode.NULL
        result = self._target_worker.forward_batch_generation(batch, capture_hidden_mode=capture)
        # Spec v2 keeps the committed length, as sglang's prefill does.
        result.new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        self._catchup.record_prefill_tail(
            batch_req_pool_indices(batch),
            batch.extend_lens,
            [prefix + extend for prefix, extend in zip(batch.prefix_lens, batch.extend_lens)],
            batch.input_ids,
            result.logits_output.hidden_states,
            window,
        )
        result.next_draft_input = self._plain_step.draft_input_stub(result.next_token_ids)
        self.batches += 1
        self.tokens += batch.extend_num_tokens or 0
        self.unstashed_batches += window == 0
        return result

    def report(self) -> Dict[str, int]:
        return {
            "deferred_draft_prefill_window": self.window,
            "short_prefill": self.short_prefill.value,
            "deferred_draft_prefill_batches": self.batches,
            "deferred_draft_prefill_tokens": self.tokens,
            "deferred_draft_prefill_unstashed_batches": self.unstashed_batches,
        }
