"""DynamicEagleWorker: EAGLE-3 at small batches, plain decoding at large ones.

Every decode step asks the switching policy for a mode, using the running
batch size (identical on every tensor-parallel rank, so every rank takes the
same branch and issues the same collectives):

* speculative: first a draft-KV catch-up for requests that decoded plainly
  since their last speculative step, then sglang's EAGLE-3 step unchanged;
* plain: one target DECODE forward through the plain-decode graphs, sampled
  with the target's own sampler, returned in the shape the spec-v2 scheduler
  expects from a verify that accepted nothing but the bonus token. No draft
  forward, no tree mask, no verify kernel.

Prefill batches always take EAGLE-3's path (target extend + draft extend), so
new requests start with a correct draft context in either mode.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple, Union

import torch
from sglang.srt.layers.logprob_processor import compute_spec_v2_logprobs
from sglang.srt.layers.moe.utils import (
    speculative_moe_a2a_backend_context,
    speculative_moe_backend_context,
)
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_utils import (
    get_draft_input_from_target_hidden_dim,
    get_draft_recurrent_hidden_state_spec,
)
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

from sglang_dynamic_eagle.counters import ModeCounters
from sglang_dynamic_eagle.draft_catchup import DraftCatchup, catchup_budget_bytes, choose_window
from sglang_dynamic_eagle.flags import current_flags
from sglang_dynamic_eagle.plain_decode_graphs import (
    PlainDecodeGraphs,
    plain_decode_batch_sizes,
)
from sglang_dynamic_eagle.policy import DecodeMode, SwitchPolicy, SwitchPolicyConfig
from sglang_dynamic_eagle.prometheus_metrics import MetricsExport
from sglang_dynamic_eagle.spec_algo import speculative_graph_max_bs

logger = logging.getLogger(__name__)

class DynamicEagleWorker(EAGLEWorkerV2):
    """See the module docstring."""

    def __init__(self, server_args, gpu_id, ps, nccl_port, target_worker) -> None:
        super().__init__(server_args, gpu_id, ps, nccl_port, target_worker)
        self.counters = ModeCounters()
        self._flags = current_flags()
        self._policy: Optional[SwitchPolicy] = None
        self._plain_graphs: Optional[PlainDecodeGraphs] = None
        self._catchup: Optional[DraftCatchup] = None
        self._last_step_plain = False
        self._catchup_timings: List[Tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._catchup_gpu_ms = 0.0
        self.metrics_export = MetricsExport()  # used with --enable-metrics

    # -- start-up -------------------------------------------------------

    def init_cuda_graphs(self) -> None:
        super().init_cuda_graphs()
        target_runner = self._target_worker.model_runner
        self._catchup = self._new_catchup()
        self._allocate_plain_result_stubs()
        graphs_enabled = not check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)
        self._plain_graphs = PlainDecodeGraphs(
            target_runner,
            plain_decode_batch_sizes(self.server_args) if graphs_enabled else None,
        )
        self._policy = SwitchPolicy(
            SwitchPolicyConfig(
                disable_batch_threshold=self._flags.disable_batch_threshold,
                enable_batch_threshold=self._flags.enable_batch_threshold,
                switch_patience=self._flags.switch_patience,
                max_speculative_batch=self._speculative_graph_max_bs(),
            )
        )
        logger.info(
            "EAGLE3_DYNAMIC: speculate while batch <= %d (disable above %d, re-enable at "
            "<= %d, patience %d steps); plain-decode graphs up to batch %d; "
            "catch-up window %d positions (%.0f MiB).",
            self._policy.config.max_speculative_batch,
            self._flags.disable_batch_threshold,
            self._flags.enable_batch_threshold,
            self._flags.switch_patience,
            self._plain_graphs.max_bs,
            self._catchup.window,
            self._catchup.stash_bytes / 2**20,
        )

    def _speculative_graph_max_bs(self) -> int:
        """Largest batch every speculative graph (verify, draft, draft extend) covers."""
        runners = (
            self._target_worker.model_runner.decode_cuda_graph_runner,
            self._draft_worker.cuda_graph_runner,
            self._draft_worker.cuda_graph_runner_for_draft_extend,
        )
        captured = [r.max_bs for r in runners if r is not None]
        if captured:
            return min(captured)
        decode = self.server_args.cuda_graph_config.decode
        return speculative_graph_max_bs(
            self._flags.disable_batch_threshold, decode.max_bs or max(decode.bs)
        )

    def _new_catchup(self) -> DraftCatchup:
        target_runner = self._target_worker.model_runner
        req_pool_size = target_runner.req_to_token_pool.req_to_token.shape[0]
        hidden_width = get_draft_input_from_target_hidden_dim(self._draft_worker.draft_runner)
        hidden_dtype = target_runner.model_config.dtype
        window = choose_window(
            catchup_budget_bytes(),
            req_pool_size,
            hidden_width,
            torch.tensor([], dtype=hidden_dtype).element_size(),
        )
        return DraftCatchup(
            req_pool_size=req_pool_size,
            window=window,
            hidden_width=hidden_width,
            hidden_dtype=hidden_dtype,
            device=target_runner.device,
        )

    def _allocate_plain_result_stubs(self) -> None:
        """Preallocated zero tensors that fill a plain result's draft fields.

        The overlap scheduler stashes topk and draft hidden states for every
        decode result; plain steps have none, and catch-up overwrites these
        rows before any draft reads them.
        """
        rows = self._target_worker.model_runner.req_to_token_pool.req_to_token.shape[0]
        device = self._target_worker.model_runner.device
        hidden_size, hidden_dtype = get_draft_recurrent_hidden_state_spec(
            self._draft_worker.draft_runner
        )
        self._stub_topk_p = torch.zeros((rows, self.topk), dtype=torch.float32, device=device)
        self._stub_topk_index = torch.zeros((rows, self.topk), dtype=torch.int64, device=device)
        self._stub_hidden = torch.zeros((rows, hidden_size), dtype=hidden_dtype, device=device)
        self._ones = torch.ones((rows,), dtype=torch.int32, device=device)
        self._row_index = torch.arange(rows, dtype=torch.int64, device=device)

    # -- scheduler-facing overrides ---------------------------------------

    @property
    def war_fastpath_runner(self):
        # A plain step's last shared-buffer read is the target decode graph,
        # which publishes its read-done event on the target runner.
        if self._last_step_plain:
            return self._target_worker.model_runner
        return super().war_fastpath_runner

    @property
    def spec_v2_attn_backends(self) -> tuple:
        backends = super().spec_v2_attn_backends
        if self._plain_graphs is None:
            return backends
        return backends + (self._plain_graphs.attn_backend,)

    def on_verify_complete_cpu(
        self, num_correct_drafts_per_req: list[int], batch_size: int = 0
    ) -> None:
        self.counters.record_result(num_correct_drafts_per_req)
        super().on_verify_complete_cpu(num_correct_drafts_per_req, batch_size=batch_size)

    def forward_batch_generation(
        self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None
    ) -> GenerationBatchResult:
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            self._catchup.forget(_req_pool_indices(batch))
            self._last_step_plain = False
            return super().forward_batch_generation(batch, on_publish, grammar_barrier)
        if batch.forward_mode.is_idle():
            self._last_step_plain = False
            return super().forward_batch_generation(batch, on_publish, grammar_barrier)

        batch_size = batch.batch_size()
        mode = self._observe(batch_size)
        if mode is DecodeMode.PLAIN:
            result = self._plain_step(batch, on_publish)
        else:
            self._catch_up(batch)
            result = super().forward_batch_generation(batch, on_publish, grammar_barrier)
        self._last_step_plain = mode is DecodeMode.PLAIN
        self.counters.record_step(mode, batch_size, ran_graph=bool(result.can_run_cuda_graph))
        return result

    # -- decode steps ----------------------------------------------------

    def _observe(self, batch_size: int) -> DecodeMode:
        previous = self._policy.mode
        mode = self._policy.observe(batch_size)
        if mode is not previous:
            self.counters.record_switch(mode)
            logger.info("EAGLE3_DYNAMIC: %s mode at batch %d.", mode.value, batch_size)
        return mode

    def _catch_up(self, batch: ScheduleBatch) -> None:
        if batch.spec_info is None:
            return
        plan = self._catchup.plan(_req_pool_indices(batch))
        if not plan.rows:
            return
        self._harvest_catchup_timings()
        draft_worker = self._draft_worker
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with (
            draft_worker.draft_tp_context(draft_worker.draft_runner.tp_group),
            speculative_moe_backend_context(),
            speculative_moe_a2a_backend_context(),
        ):
            self._catchup.run(draft_worker, batch, plan)
        end.record()
        if self.plan_stream is not None:
            # The draft extend later in this step plans the same draft attention
            # backend on the plan stream; it must not overtake the catch-up.
            self.plan_stream.wait_stream(torch.cuda.current_stream())
        self._catchup_timings.append((start, end))
        self.counters.record_catchup(plan.num_tokens, plan.truncated_tokens)

    # -- reporting -------------------------------------------------------

    @property
    def mode(self) -> DecodeMode:
        """The mode of the latest decode step (speculative before the first one)."""
        return self._policy.mode

    def report(self) -> Dict[str, Union[int, float]]:
        """Counters plus the static facts of this server, for /get_server_info."""
        self._harvest_catchup_timings()
        policy = self._policy.config
        return {
            **self.counters.snapshot(),
            "catchup_gpu_ms": round(self._catchup_gpu_ms, 3),
            "disable_batch_threshold": policy.disable_batch_threshold,
            "enable_batch_threshold": policy.enable_batch_threshold,
            "switch_patience": policy.switch_patience,
            "max_speculative_graph_batch": policy.max_speculative_batch,
            "max_plain_graph_batch": self._plain_graphs.max_bs,
            "plain_graph_capture_s": round(self._plain_graphs.capture_seconds, 2),
            "plain_graph_memory_gib": round(self._plain_graphs.capture_gib, 3),
            "catchup_window": self._catchup.window,
            "catchup_stash_mib": round(self._catchup.stash_bytes / 2**20, 1),
        }

    def _harvest_catchup_timings(self) -> None:
        """Add up finished catch-up timings without waiting for running ones."""
        pending = []
        for start, end in self._catchup_timings:
            if end.query():
                self._catchup_gpu_ms += start.elapsed_time(end)
            else:
                pending.append((start, end))
        self._catchup_timings = pending

    def _plain_step(self, batch: ScheduleBatch, on_publish) -> GenerationBatchResult:
        target_runner = self._target_worker.model_runner
        batch_size = len(batch.seq_lens)
        positions = batch.seq_lens
        req_pool_indices_cpu = _req_pool_indices(batch)
        _turn_into_decode_batch(batch, target_runner.req_to_token_pool.req_to_token)
        # Plain steps know their new lengths before the forward; publishing now
        # lets the scheduler prepare the next step while this one runs.
        if on_publish is not None:
            on_publish(batch.seq_lens)

        # The plain graph publishes a fresh read-done event; an eager forward
        # publishes none, and a stale one must not satisfy the WAR barrier.
        target_runner.war_fastpath_read_done_event = None
        with self._plain_graphs.active():
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
            batch.req_pool_indices,
            req_pool_indices_cpu,
            positions,
            batch.input_ids,
            logits_output.hidden_states,
        )
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=next_token_ids,
            can_run_cuda_graph=output.can_run_cuda_graph,
            speculative_num_draft_tokens=1,
            next_draft_input=EagleDraftInput(
                topk_p=self._stub_topk_p[:batch_size],
                topk_index=self._stub_topk_index[:batch_size],
                hidden_states=self._stub_hidden[:batch_size],
                bonus_tokens=next_token_ids,
            ),
            accept_lens=self._ones[:batch_size],
            new_seq_lens=batch.seq_lens,
            routed_experts_output=output.routed_experts_output,
            indexer_topk_output=output.indexer_topk_output,
            extra_keep_alive_refs=[forward_batch],
        )

    def _sample(
        self, batch: ScheduleBatch, forward_batch: ForwardBatch, logits_output
    ) -> torch.Tensor:
        """Sample like a plain server. Logprobs, in the spec-v2 ``[bs, 1]`` layout, are
        those of the logits after penalties, logit bias and grammar mask, before
        temperature: what EAGLE's verify reports in speculative steps."""
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


def _req_pool_indices(batch: ScheduleBatch) -> List[int]:
    return [req.req_pool_idx for req in batch.reqs]


def _turn_into_decode_batch(batch: ScheduleBatch, req_to_token: torch.Tensor) -> None:
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
