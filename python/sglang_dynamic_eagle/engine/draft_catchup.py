"""Draft-KV catch-up after plain-mode steps.

The EAGLE-3 draft's KV entry at position ``p`` is computed from the token at
``p + 1`` and the target's auxiliary hidden states at ``p``. Plain steps run no
draft forward, so every position a request decoded in plain mode lacks draft
KV. Each plain step therefore stashes, per request, the token it fed and the
aux hidden states it produced into a ring shared by all requests (one entry per
request and plain step, ``ring_size`` entries in all). When speculation resumes,
one draft EXTEND forward over each request's missed positions still in the
ring (at most ``max_window``) rebuilds their draft KV and yields the draft's
next proposal, exactly as the draft extend after a prefill does; sglang's
``_draft_extend_for_prefill`` runs it.

Sharing the ring makes the history per request follow the load: a plain batch of
``b`` requests keeps the last ``ring_size // b`` positions of each (a ring per
request slot would keep the same few positions for every slot of a large pool).
Positions older than that keep stale draft KV: acceptance, never the output
tokens, pays for them (the target verifies every token).
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple, Union

import torch
from sglang.srt.layers.moe.utils import (
    speculative_moe_a2a_backend_context,
    speculative_moe_backend_context,
)
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from sglang_dynamic_eagle.engine.step_costs import GpuIntervals

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.speculative.eagle_info import EagleDraftInput

# Positions one catch-up rebuilds at most, over all its requests (sglang's default prefill
# chunk): the catch-up is one eager draft EXTEND forward, and 256 positions for each of 128
# requests would make it a 32k-token one.
MAX_CATCHUP_TOKENS = 8192


def choose_ring_size(
    budget_bytes: int, req_pool_size: int, hidden_width: int, elem_bytes: int
) -> int:
    """Ring entries that fit the memory budget, and never fewer than the request slots (even
    above the budget), so that the latest plain step is always wholly in the ring."""
    return max(req_pool_size, budget_bytes // (hidden_width * elem_bytes + 8))


def _with_rows(tensor: torch.Tensor, rows: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` whose ``rows`` are replaced by ``values``."""
    return tensor.index_put((rows,), values.to(tensor.dtype))


class PlainStepLengths:
    """The sequence lengths the latest plain step left, readable on the host without waiting
    for that step.

    A plain step knows its new lengths before its forward (committed length + 1) and copies
    them to pinned memory there; a catch-up at the next step reads them once that copy is done,
    which it is long before, since it sits ahead of the plain forward in the stream. Reading the
    batch's GPU lengths instead would make the host wait for the whole previous step whenever
    sglang keeps no CPU mirror of them (``needs_cpu_seq_lens`` is False for triton attention).
    """

    def __init__(self, capacity: int, device: torch.device) -> None:
        self._on_gpu = torch.device(device).type == "cuda"
        self._host = torch.zeros(capacity, dtype=torch.int64, pin_memory=self._on_gpu)
        self._ready = torch.cuda.Event() if self._on_gpu else None
        self._req_pool_indices: Sequence[int] = ()

    def publish(self, req_pool_indices_cpu: Sequence[int], seq_lens: torch.Tensor) -> None:
        self._host[: len(req_pool_indices_cpu)].copy_(
            seq_lens.to(torch.int64), non_blocking=self._on_gpu
        )
        if self._ready is not None:
            self._ready.record()
        self._req_pool_indices = req_pool_indices_cpu  # mapped to rows only when read

    def lengths(self, req_pool_indices: Sequence[int]) -> Optional[List[int]]:
        """These request slots' lengths as the latest plain step left them, or None if one of
        them was not in that step."""
        row_of = {index: row for row, index in enumerate(self._req_pool_indices)}
        rows = [row_of.get(index) for index in req_pool_indices]
        if any(row is None for row in rows):
            return None
        if self._ready is not None:
            self._ready.synchronize()
        return [int(self._host[row]) for row in rows]


def batch_req_pool_indices(batch: ScheduleBatch) -> List[int]:
    """The batch's request slots as it was formed. Not ``req.req_pool_idx``: when the overlap
    scheduler turns overlap off for a batch (grammar batches, for one), it processes the
    previous step's results after forming this batch, so a request that finished there is
    still in it with its slot already released (``req_pool_idx`` None)."""
    return batch.req_pool_indices_cpu.tolist()


@dataclass(frozen=True)
class CatchupPlan:
    """Which rows of a decode batch need catch-up, and how many positions each."""

    rows: List[int]
    lengths: List[int]
    truncated_tokens: int
    # The ring entries of the positions to catch up, row after row, oldest first.
    ring_entries: List[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)


class DraftCatchup:
    """Ring stash of plain-step inputs, shared by all requests, and the catch-up draft
    forward."""

    def __init__(
        self,
        *,
        req_pool_size: int,
        ring_size: int,
        max_window: int,
        hidden_width: int,
        hidden_dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.ring_size = ring_size
        self.max_window = max_window
        self._tokens = torch.zeros((ring_size,), dtype=torch.int64, device=device)
        self._hidden = torch.zeros((ring_size, hidden_width), dtype=hidden_dtype, device=device)
        self._written = 0  # ring entries written so far; entry n lives at n % ring_size
        self._batch_offsets = torch.arange(req_pool_size, dtype=torch.int64, device=device)
        self._missed = [0] * req_pool_size
        # Per request slot: the entries (numbers, not ring indices) of its latest plain steps.
        self._entries: List[deque] = [deque(maxlen=max_window) for _ in range(req_pool_size)]
        self.device = device
        self.plain_step_lengths = PlainStepLengths(req_pool_size, device)
        self.gpu_time = GpuIntervals()

    def _on_device(self, values: Sequence[int]) -> torch.Tensor:
        """An int64 device tensor of ``values``, copied from pinned memory without making the
        host wait for the GPU (a copy from pageable memory would synchronise the stream)."""
        pinned = torch.device(self.device).type == "cuda"
        host = torch.tensor(values, dtype=torch.int64, pin_memory=pinned)
        return host.to(self.device, non_blocking=pinned)

    @property
    def stash_bytes(self) -> int:
        return self._tokens.nbytes + self._hidden.nbytes

    def report(self) -> Dict[str, Union[int, float]]:
        return {
            "catchup_gpu_ms": round(self.gpu_time.total_ms, 3),
            "catchup_ring_entries": self.ring_size,
            "catchup_max_window": self.max_window,
            "catchup_stash_mib": round(self.stash_bytes / 2**20, 1),
        }

    def forget(self, req_pool_indices: Sequence[int]) -> None:
        """A prefill (re)built these requests' draft KV: nothing is missing."""
        for index in req_pool_indices:
            self._missed[index] = 0
            self._entries[index].clear()

    def record_plain_step(
        self,
        req_pool_indices_cpu: Sequence[int],
        input_ids: torch.Tensor,
        aux_hidden_states: torch.Tensor,
    ) -> None:
        """Stash one plain step, one ring entry per request in batch order: GPU scatters only,
        no synchronisation. A request is in every decode step from its prefill (or its last
        catch-up) on, so a slot's entries are its consecutive latest positions."""
        first = self._written
        count = len(req_pool_indices_cpu)
        ring = (self._batch_offsets[:count] + first) % self.ring_size
        self._tokens[ring] = input_ids.to(torch.int64)
        self._hidden[ring] = aux_hidden_states.to(self._hidden.dtype)
        for entry, index in enumerate(req_pool_indices_cpu, start=first):
            self._missed[index] += 1
            self._entries[index].append(entry)
        self._written = first + count

    def _kept_entries(self, index: int) -> List[int]:
        """The slot's newest entries that the ring still holds, oldest first."""
        entries = self._entries[index]
        oldest_kept = self._written - self.ring_size
        if not entries or entries[0] >= oldest_kept:
            return list(entries)
        return [entry for entry in entries if entry >= oldest_kept]

    def plan(self, req_pool_indices_cpu: Sequence[int]) -> CatchupPlan:
        """The rows to catch up and their newest positions still in the ring, at most
        ``MAX_CATCHUP_TOKENS`` in all (each row keeps an equal share of its newest ones). A
        row none of whose positions is left (possible only if it missed the latest plain
        steps) is counted as truncated and forgotten: its next proposal comes from the stub,
        acceptance only."""
        missing = [(row, index, self._missed[index])
                   for row, index in enumerate(req_pool_indices_cpu) if self._missed[index]]
        share = max(1, MAX_CATCHUP_TOKENS // len(missing)) if missing else 0
        rows, lengths, entries, truncated = [], [], [], 0
        for row, index, missed in missing:
            kept = self._kept_entries(index)[-min(missed, share):]
            truncated += missed - len(kept)
            if kept:
                rows.append(row)
                lengths.append(len(kept))
                entries += kept
            else:
                self.forget([index])
        return CatchupPlan(rows=rows, lengths=lengths, truncated_tokens=truncated,
                           ring_entries=entries)

    def catch_up(
        self, draft_worker, batch: ScheduleBatch, plan_stream: Optional[torch.cuda.Stream]
    ) -> Optional[CatchupPlan]:
        """Before a speculative step: rebuild the draft KV its requests missed in plain
        steps, timed on the GPU (``gpu_time``). Returns the plan, or None if nothing was
        missing."""
        if batch.spec_info is None:
            return None
        plan = self.plan(batch_req_pool_indices(batch))
        if not plan.rows:
            return None
        start = self.gpu_time.start()
        with (
            draft_worker.draft_tp_context(draft_worker.draft_runner.tp_group),
            speculative_moe_backend_context(),
            speculative_moe_a2a_backend_context(),
        ):
            self.run(draft_worker, batch, plan)
        self.gpu_time.stop(start, plan.num_tokens)
        if plan_stream is not None:
            # The draft extend later in this step plans the same draft attention
            # backend on the plan stream; it must not overtake the catch-up.
            plan_stream.wait_stream(torch.cuda.current_stream())
        return plan

    def run(self, draft_worker, batch: ScheduleBatch, plan: CatchupPlan) -> None:
        """Rebuild the missed draft KV and the draft fields of ``batch.spec_info``."""
        rows = self._on_device(plan.rows)
        sub_batch, aux_hidden_states = self._extend_batch(draft_worker, batch, plan, rows)
        draft_input: EagleDraftInput = batch.spec_info
        seeds = draft_worker._draft_extend_for_prefill(
            sub_batch, aux_hidden_states, draft_input.bonus_tokens[rows]
        )
        # Out of place: without overlap scheduling these tensors are the plain
        # step's shared zero stubs.
        draft_input.topk_p = _with_rows(draft_input.topk_p, rows, seeds.topk_p)
        draft_input.topk_index = _with_rows(draft_input.topk_index, rows, seeds.topk_index)
        draft_input.hidden_states = _with_rows(
            draft_input.hidden_states, rows, seeds.hidden_states
        )
        self.forget([int(batch.req_pool_indices_cpu[row]) for row in plan.rows])

    def _lengths_on_host(
        self, batch: ScheduleBatch, plan: CatchupPlan, seq_lens: torch.Tensor
    ) -> List[int]:
        """The rows' lengths on the host: sglang's CPU mirror, else what the plain step before
        published, else (a row that was not in it) a synchronising copy."""
        if batch.seq_lens_cpu is not None:
            return batch.seq_lens_cpu[plan.rows].tolist()
        published = self.plain_step_lengths.lengths(
            [int(batch.req_pool_indices_cpu[row]) for row in plan.rows])
        return seq_lens.cpu().tolist() if published is None else published

    def _extend_batch(
        self, draft_worker, batch: ScheduleBatch, plan: CatchupPlan, rows: torch.Tensor
    ) -> Tuple[ScheduleBatch, torch.Tensor]:
        """An EXTEND view of the rows to catch up over their missed positions,
        and the stashed target aux hidden states of those positions."""
        num_tokens = plan.num_tokens
        lengths = self._on_device(plan.lengths)
        seq_lens = batch.seq_lens[rows].to(torch.int64)
        seq_lens_cpu = self._lengths_on_host(batch, plan, seq_lens)
        req_pool_indices = batch.req_pool_indices[rows]
        token_req = torch.repeat_interleave(req_pool_indices, lengths, output_size=num_tokens)
        starts = torch.repeat_interleave(seq_lens - lengths, lengths, output_size=num_tokens)
        first_token = torch.repeat_interleave(
            torch.cumsum(lengths, 0) - lengths, lengths, output_size=num_tokens
        )
        positions = starts + torch.arange(num_tokens, device=self.device) - first_token
        ring = self._on_device([entry % self.ring_size for entry in plan.ring_entries])
        req_to_token = draft_worker.req_to_token_pool.req_to_token

        sub_batch = copy.copy(batch)
        sub_batch.reqs = [batch.reqs[row] for row in plan.rows]
        sub_batch.forward_mode = ForwardMode.EXTEND
        sub_batch.input_ids = self._tokens[ring]
        sub_batch.spec_info = None
        sub_batch.req_pool_indices = req_pool_indices
        sub_batch.req_pool_indices_cpu = batch.req_pool_indices_cpu[plan.rows]
        sub_batch.seq_lens = seq_lens
        sub_batch.orig_seq_lens = seq_lens.to(torch.int32)
        sub_batch.seq_lens_cpu = torch.tensor(seq_lens_cpu, dtype=torch.int64)
        sub_batch.seq_lens_sum = sum(seq_lens_cpu)
        sub_batch.out_cache_loc = req_to_token[token_req, positions].to(torch.int64)
        sub_batch.extend_lens = list(plan.lengths)
        sub_batch.prefix_lens = [s - n for s, n in zip(seq_lens_cpu, plan.lengths)]
        sub_batch.extend_logprob_start_lens = [0] * len(plan.rows)
        sub_batch.extend_num_tokens = num_tokens
        sub_batch.extend_input_logprob_token_ids = None
        sub_batch.return_logprob = False
        sub_batch.top_logprobs_nums = None
        sub_batch.token_ids_logprobs = None
        sub_batch.multimodal_inputs = [None] * len(plan.rows)
        sub_batch.input_embeds = None
        sub_batch.chunked_req = None
        sub_batch.chunked_req_next_prompt_token = None
        sub_batch.is_extend_in_batch = True
        sub_batch.global_forward_mode = ForwardMode.EXTEND
        sub_batch.has_grammar = False
        if batch.sampling_info is not None:
            sub_batch.sampling_info = copy.copy(batch.sampling_info)
        return sub_batch, self._hidden[ring]
