"""One plain decode step inside the speculative server.

The spec-v2 decode batch is rewritten into an ordinary one-token DECODE batch, the target runs
it through the plain-decode graphs, the target's sampler picks the token, the step's inputs are
stashed for the draft-KV catch-up, and the result is returned in the shape the spec-v2
scheduler expects from a verify that accepted only the bonus token. No draft forward, no tree
mask, no verify kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from sglang.srt.layers.logprob_processor import compute_spec_v2_logprobs
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_utils import get_draft_recurrent_hidden_state_spec

from sglang_dynamic_eagle.engine.draft_catchup import batch_req_pool_indices

if TYPE_CHECKING:
    from sglang_dynamic_eagle.engine.draft_catchup import DraftCatchup
    from sglang_dynamic_eagle.engine.plain_decode_graphs import PlainDecodeGraphs


def turn_into_decode_batch(batch: ScheduleBatch, req_to_token: torch.Tensor) -> None:
    """Rewrite the spec-v2 decode batch into a one-token DECODE batch.

    Spec v2 keeps ``seq_lens`` at the committed length L and the bonus token
    x_L in ``spec_info``; DECODE feeds x_L at position L (``seq_lens - 1``).
    The KV slot at L is already reserved: EAGLE's per-request reserve is at
    least two verify windows past the committed length. The scheduler restores
    every field after the forward (``Scheduler._forward_isolation``).
    """
    positions = batch.seq_lens
    batch.input_ids = batch.spec_info.bonus_tokens.to(torch.int64)
    batch.out_cache_loc = req_to_token[batch.req_pool_indices, positions].to(torch.int64)
    batch.seq_lens = positions + 1
    if batch.seq_lens_cpu is not None:
        batch.seq_lens_cpu = batch.seq_lens_cpu + 1
    if batch.seq_lens_sum is not None:
        batch.seq_lens_sum += len(batch.reqs)
    batch.forward_mode = ForwardMode.DECODE
    batch.spec_info = None


class PlainDecodeStep:
    """The plain step of one worker, with the preallocated tensors its results need."""

    def __init__(
        self,
        target_worker,
        draft_runner,
        topk: int,
        graphs: PlainDecodeGraphs,
        catchup: DraftCatchup,
    ) -> None:
        self._target_worker = target_worker
        self._graphs = graphs
        self._catchup = catchup
        self._allocate_result_stubs(draft_runner, topk)

    def _allocate_result_stubs(self, draft_runner, topk: int) -> None:
        """Preallocated zero tensors that fill the draft fields of a plain step's result, which
        ran no draft: the overlap scheduler stashes topk and draft hidden states for every
        result."""
        runner = self._target_worker.model_runner
        rows = runner.req_to_token_pool.req_to_token.shape[0]
        device = runner.device
        hidden_size, hidden_dtype = get_draft_recurrent_hidden_state_spec(draft_runner)
        self._stub_topk_p = torch.zeros((rows, topk), dtype=torch.float32, device=device)
        self._stub_topk_index = torch.zeros((rows, topk), dtype=torch.int64, device=device)
        self._stub_hidden = torch.zeros((rows, hidden_size), dtype=hidden_dtype, device=device)
        self._ones = torch.ones((rows,), dtype=torch.int32, device=device)
        self._row_index = torch.arange(rows, dtype=torch.int64, device=device)

    def run(self, batch: ScheduleBatch, on_publish) -> GenerationBatchResult:
        target_runner = self._target_worker.model_runner
        batch_size = len(batch.seq_lens)
        req_pool_indices_cpu = batch_req_pool_indices(batch)
        turn_into_decode_batch(batch, target_runner.req_to_token_pool.req_to_token)
        self._catchup.plain_step_lengths.publish(req_pool_indices_cpu, batch.seq_lens)
        # Plain steps know their new lengths before the forward; publishing now
        # lets the scheduler prepare the next step while this one runs.
        if on_publish is not None:
            on_publish(batch.seq_lens)

        # The plain graph publishes a fresh read-done event; an eager forward
        # publishes none, and a stale one must not satisfy the WAR barrier.
        target_runner.war_fastpath_read_done_event = None
        with self._graphs.active():
            forward_batch = ForwardBatch.init_new(
                batch,
                target_runner,
                capture_hidden_mode=CaptureHiddenMode.FULL,
                return_hidden_states_before_norm=False,
            )
            output = self._target_worker.forward_batch_generation(
                batch=None, forward_batch=forward_batch, is_verify=True
            )
        logits_output = output.logits_output
        next_token_ids = self._sample(batch, forward_batch, logits_output)

        self._catchup.record_plain_step(
            req_pool_indices_cpu, batch.input_ids, logits_output.hidden_states
        )
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=next_token_ids,
            can_run_cuda_graph=output.can_run_cuda_graph,
            speculative_num_draft_tokens=1,
            next_draft_input=self.draft_input_stub(next_token_ids),
            accept_lens=self._ones[:batch_size],
            new_seq_lens=batch.seq_lens,
            routed_experts_output=output.routed_experts_output,
            indexer_topk_output=output.indexer_topk_output,
            extra_keep_alive_refs=[forward_batch],
        )

    def draft_input_stub(self, bonus_tokens: torch.Tensor) -> EagleDraftInput:
        """The draft fields of a result that ran no draft: zero stubs, one row per bonus
        token, which catch-up overwrites before a draft reads them; rows with nothing left to
        catch up (a truncated catch-up) propose from them, which costs acceptance only."""
        batch_size = len(bonus_tokens)
        return EagleDraftInput(
            topk_p=self._stub_topk_p[:batch_size],
            topk_index=self._stub_topk_index[:batch_size],
            hidden_states=self._stub_hidden[:batch_size],
            bonus_tokens=bonus_tokens,
        )

    def _sample(
        self, batch: ScheduleBatch, forward_batch: ForwardBatch, logits_output
    ) -> torch.Tensor:
        """Sample like a plain server. Logprobs, in the spec-v2 ``[bs, 1]`` layout, are
        those of the logits after penalties, logit bias and grammar mask (kept before the
        sampler scales them), at the requests' temperature (``compute_spec_v2_logprobs``
        divides by it unless every request is greedy): what EAGLE's verify reports in
        speculative steps."""
        runner = self._target_worker.model_runner
        sampling_info = forward_batch.sampling_info
        runner._preprocess_logits(logits_output, sampling_info)
        adjusted_logits = (
            logits_output.next_token_logits.clone() if batch.return_logprob else None
        )
        next_token_ids = runner.sampler(
            logits_output, sampling_info, False, None, None, forward_batch.positions
        )
        runner.ngram_embedding_manager.update_after_decode(
            next_token_ids=next_token_ids, forward_batch=forward_batch
        )
        if adjusted_logits is not None:
            logits_output.next_token_logits = adjusted_logits
            accept_index = self._row_index[: len(batch.seq_lens)].unsqueeze(1)
            compute_spec_v2_logprobs(batch, logits_output, next_token_ids, accept_index, 0)
        return next_token_ids
