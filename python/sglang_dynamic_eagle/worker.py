"""DynamicEagleWorker: EAGLE-3 while speculation pays, plain decoding while it does not.

A dispatcher. Every decode step it builds the policy's view of the batch (``observations``:
KV tokens, queue, the acceptance of its requests), asks the policy (``policy``) for a mode
(every input identical on every tensor-parallel rank, so every rank takes the same branch and
issues the same collectives), and runs

* speculative: the draft-KV catch-up for requests that decoded plainly since their last
  speculative step (``draft_catchup``), then sglang's EAGLE-3 step unchanged;
* plain: one target DECODE forward through the plain-decode graphs (``plain_step``).

After the step it hands the step's end to the timing feed (``step_costs``), which gives the
policy the measured times a few steps later, and verify results to the acceptance records.
Prefill batches take EAGLE-3's path (target extend + draft extend), so new requests start with
a correct draft context in either mode; ``prefill_timing`` measures both parts.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Deque, Dict, Optional

import torch
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend
from sglang.srt.speculative.eagle_utils import get_draft_input_from_target_hidden_dim
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

from sglang_dynamic_eagle import upstream_internals
from sglang_dynamic_eagle.counters import ModeCounters
from sglang_dynamic_eagle.draft_catchup import (
    MAX_CATCHUP_TOKENS,
    DraftCatchup,
    batch_req_pool_indices,
    catchup_budget_bytes,
    catchup_max_window,
    choose_ring_size,
)
from sglang_dynamic_eagle.draft_prefill import DraftPrefillChoice, use_last_position_mlp
from sglang_dynamic_eagle.flags import current_flags
from sglang_dynamic_eagle.host_syncs import HostSyncCounter, sync_check_enabled
from sglang_dynamic_eagle.plain_decode_graphs import PlainDecodeGraphs, plain_decode_batch_sizes
from sglang_dynamic_eagle.observations import RequestAcceptance, observe
from sglang_dynamic_eagle.plain_step import PlainDecodeStep
from sglang_dynamic_eagle.policy import (
    DecodeMode,
    DecodePolicy,
    ReportValue,
    ThresholdPolicy,
    ThresholdPolicyConfig,
)
from sglang_dynamic_eagle.policy.throughput import (
    ThroughputPolicy,
    ThroughputPolicyConfig,
    crossover_batch,
    new_throughput_policy,
)
from sglang_dynamic_eagle.prefill_timing import PrefillTimer
from sglang_dynamic_eagle.prometheus_metrics import MetricsExport
from sglang_dynamic_eagle.spec_algo import speculative_graph_max_bs
from sglang_dynamic_eagle.step_costs import (
    TimingFeed,
    calibrate,
    kv_bytes_per_token,
    memory_bandwidth_gbps,
    tp_max_reducer,
)
from sglang_dynamic_eagle.trace import StepTrace

logger = logging.getLogger(__name__)


class DynamicEagleWorker(EAGLEWorkerV2):
    """See the module docstring."""

    def __init__(self, server_args, gpu_id, ps, nccl_port, target_worker) -> None:
        upstream_internals.check_hooks_in_effect()
        super().__init__(server_args, gpu_id, ps, nccl_port, target_worker)
        self.counters = ModeCounters()
        self.request_acceptance = RequestAcceptance()
        self.metrics_export = MetricsExport()  # used with --enable-metrics
        self.prefill_timer = PrefillTimer()
        self.host_syncs = HostSyncCounter(sync_check_enabled())
        self.queued = 0  # requests waiting to be admitted; set by the scheduler hook
        draft_tp_size = getattr(self._draft_worker.draft_runner.tp_group, "world_size", 1)
        self._draft_prefill_choice = DraftPrefillChoice(follows_gpu=draft_tp_size == 1)
        self._last_position_draft_mlp = use_last_position_mlp(
            self._draft_worker.draft_runner.model, self._draft_prefill_choice)
        self._flags = current_flags()
        self._trace = StepTrace.from_environment()
        self._policy: Optional[DecodePolicy] = None
        self._plain_graphs: Optional[PlainDecodeGraphs] = None
        self._plain_step: Optional[PlainDecodeStep] = None
        self._catchup: Optional[DraftCatchup] = None
        self._timings: Optional[TimingFeed] = None
        self._decode_step = 0
        self._pending_catchup_tokens: Deque[int] = deque()
        self._last_step_plain = False

    # -- start-up -------------------------------------------------------

    def init_cuda_graphs(self) -> None:
        super().init_cuda_graphs()
        target_runner = self._target_worker.model_runner
        self._catchup = self._new_catchup()
        graphs_enabled = not check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)
        self._plain_graphs = PlainDecodeGraphs(
            target_runner,
            plain_decode_batch_sizes(self.server_args) if graphs_enabled else None,
        )
        self._plain_step = PlainDecodeStep(
            self._target_worker,
            self._draft_worker.draft_runner,
            self.topk,
            self._plain_graphs,
            self._catchup,
        )
        max_speculative_batch = self._speculative_graph_max_bs()
        self._policy = self._new_policy(max_speculative_batch)
        self._timings = TimingFeed(tp_max_reducer(target_runner.tp_group), self._on_step_time)
        logger.info(
            "EAGLE3_DYNAMIC: %s; speculative graphs up to batch %d, plain-decode graphs up "
            "to batch %d; catch-up ring of %d entries (%.0f MiB, at most %d positions per "
            "request).",
            self._policy_summary(),
            max_speculative_batch,
            self._plain_graphs.max_bs,
            self._catchup.ring_size,
            self._catchup.stash_bytes / 2**20,
            self._catchup.max_window,
        )

    def _policy_summary(self) -> str:
        report = self._policy.report()
        if report["policy"] == "throughput":
            return "automatic switching (predicted tokens per second of each mode)"
        return (
            f"fixed thresholds (disable above {report['disable_batch_threshold']}, re-enable "
            f"at <= {report['enable_batch_threshold']}, patience {report['switch_patience']})"
        )

    def _speculative_graph_max_bs(self) -> int:
        """Largest batch every speculative graph (verify, draft, draft extend) covers."""
        captured = [r.max_bs for r in self._speculative_graph_runners()]
        if captured:
            return min(captured)
        decode = self.server_args.cuda_graph_config.decode
        return speculative_graph_max_bs(
            self._flags.disable_batch_threshold, decode.max_bs or max(decode.bs)
        )

    def _speculative_graph_runners(self) -> list:
        """The graph runners of one speculative step, in the order the step runs them."""
        runners = (
            self._draft_worker.cuda_graph_runner,
            self._target_worker.model_runner.decode_cuda_graph_runner,
            self._draft_worker.cuda_graph_runner_for_draft_extend,
        )
        return [r for r in runners if r is not None]

    def _new_catchup(self) -> DraftCatchup:
        target_runner = self._target_worker.model_runner
        req_pool_size = target_runner.req_to_token_pool.req_to_token.shape[0]
        hidden_width = get_draft_input_from_target_hidden_dim(self._draft_worker.draft_runner)
        hidden_dtype = target_runner.model_config.dtype
        ring_size = choose_ring_size(
            catchup_budget_bytes(),
            req_pool_size,
            hidden_width,
            torch.tensor([], dtype=hidden_dtype).element_size(),
        )
        return DraftCatchup(
            req_pool_size=req_pool_size,
            ring_size=ring_size,
            max_window=catchup_max_window(),
            hidden_width=hidden_width,
            hidden_dtype=hidden_dtype,
            device=target_runner.device,
        )

    def _new_policy(self, max_speculative_batch: int) -> DecodePolicy:
        flags = self._flags
        if not flags.automatic:
            return ThresholdPolicy(ThresholdPolicyConfig(
                disable_batch_threshold=flags.disable_batch_threshold,
                enable_batch_threshold=flags.enable_batch_threshold,
                switch_patience=flags.switch_patience,
                max_speculative_batch=max_speculative_batch,
            ))
        target_runner = self._target_worker.model_runner
        draft_runner = self._draft_worker.draft_runner
        plain_runner = self._plain_graphs.graph_runner
        speculative_runners = self._speculative_graph_runners()
        speculative_sizes = (speculative_runners[0].capture_bs if speculative_runners
                             else self.server_args.cuda_graph_config.decode.bs)
        buckets = {
            DecodeMode.PLAIN: list(plain_runner.capture_bs if plain_runner is not None
                                   else plain_decode_batch_sizes(self.server_args)),
            DecodeMode.SPECULATIVE: [bs for bs in speculative_sizes if bs <= max_speculative_batch],
        }
        reduce_max = tp_max_reducer(target_runner.tp_group)
        calibration = calibrate(
            {DecodeMode.PLAIN: [plain_runner] if plain_runner is not None else [],
             DecodeMode.SPECULATIVE: speculative_runners},
            buckets,
        )
        # Identical priors on every rank: the slowest rank's replays and bandwidth.
        keys = [(m, b) for m in (DecodeMode.PLAIN, DecodeMode.SPECULATIVE) for b in buckets[m]]
        bandwidth = memory_bandwidth_gbps(target_runner.device)
        reduced = reduce_max([calibration.get(m, {}).get(b, 0.0) for m, b in keys]
                             + [-bandwidth])
        calibration = {m: {} for m in (DecodeMode.PLAIN, DecodeMode.SPECULATIVE)}
        for (mode, bucket), ms in zip(keys, reduced):
            if ms > 0:
                calibration[mode][bucket] = ms
        bytes_per_ms = -reduced[-1] * 1e6
        target_bytes = kv_bytes_per_token(target_runner)
        draft_bytes = kv_bytes_per_token(draft_runner)
        # A plain step reads the target's KV once; a speculative step once for the verify and
        # the draft's once per draft step and once for its extend.
        per_kv_token_ms = {
            DecodeMode.PLAIN: target_bytes / bytes_per_ms,
            DecodeMode.SPECULATIVE:
                (target_bytes + (self.speculative_num_steps + 1) * draft_bytes) / bytes_per_ms,
        }
        spec_one = calibration[DecodeMode.SPECULATIVE].get(min(buckets[DecodeMode.SPECULATIVE]), 0.0)
        config = ThroughputPolicyConfig(
            max_speculative_batch=max_speculative_batch,
            max_running_requests=max(1, int(getattr(target_runner, "max_running_requests", 0)
                                             or self.server_args.max_running_requests or 1)),
            kv_capacity_tokens=max(1, int(target_runner.max_total_num_tokens)),
            catchup_window=self._catchup.max_window,
            catchup_max_tokens=MAX_CATCHUP_TOKENS,
        )
        logger.info("EAGLE3_DYNAMIC: step model priors: calibrated step ms plain %s, speculative "
                    "%s; KV bytes per token %d (target) / %d (draft) at %.0f GB/s.",
                    calibration[DecodeMode.PLAIN], calibration[DecodeMode.SPECULATIVE],
                    target_bytes, draft_bytes, bytes_per_ms / 1e6)
        return new_throughput_policy(
            config, buckets, calibration, per_kv_token_ms,
            catchup_prior_fixed_ms=spec_one,
            max_acceptance=float(min(self.speculative_num_steps + 1,
                                     self.speculative_num_draft_tokens)),
        )

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
        if self.counters.record_result(num_correct_drafts_per_req) is DecodeMode.SPECULATIVE:
            self.request_acceptance.verified(num_correct_drafts_per_req)
            if isinstance(self._policy, ThroughputPolicy):
                self._policy.add_verify(num_correct_drafts_per_req)
            self._trace.verify(self.counters.verified_step, num_correct_drafts_per_req)
        super().on_verify_complete_cpu(num_correct_drafts_per_req, batch_size=batch_size)

    def forward_batch_generation(
        self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None
    ) -> GenerationBatchResult:
        is_extend = batch.forward_mode.is_extend() or batch.is_extend_in_batch
        if is_extend or batch.forward_mode.is_idle():
            self._last_step_plain = False
            self._timings.interrupt()
        if is_extend:
            self._catchup.forget(batch_req_pool_indices(batch))
            with self.host_syncs.watch("prefill"):
                return self._prefill(batch, on_publish, grammar_barrier)
        if batch.forward_mode.is_idle():
            return super().forward_batch_generation(batch, on_publish, grammar_barrier)

        self._decode_step += 1
        observation = observe(batch, self.queued, self.request_acceptance, self._decode_step)
        mode = self._decide(observation)
        with self.host_syncs.watch(mode.value):
            if mode is DecodeMode.PLAIN:
                result = self._plain_step.run(batch, on_publish)
            else:
                self._catch_up(batch)
                self.request_acceptance.launched(batch.reqs)
                result = super().forward_batch_generation(batch, on_publish, grammar_barrier)
        self._last_step_plain = mode is DecodeMode.PLAIN
        batch_size = observation.batch_size
        self.counters.record_step(mode, batch_size, ran_graph=bool(result.can_run_cuda_graph),
                                  step=self._decode_step)
        self._harvest_catchup_timings()
        self._timings.step_done(self._decode_step, mode, batch_size, observation.kv_tokens)
        return result

    def _prefill(
        self, batch: ScheduleBatch, on_publish, grammar_barrier
    ) -> GenerationBatchResult:
        """EAGLE-3's prefill, timed in two parts: sglang's worker publishes between the
        target extend and the draft extend (in non-overlap mode too, when given a callback)."""
        self.prefill_timer.harvest()  # keeps the pending events few without a report reading them
        events = self.prefill_timer.start(batch.extend_num_tokens or 0)

        def publish(new_seq_lens) -> None:
            self.prefill_timer.target_done(events)
            self._draft_prefill_choice.mark_target_end(events.target_end)
            if on_publish is not None:
                on_publish(new_seq_lens)

        result = super().forward_batch_generation(batch, publish, grammar_barrier)
        self._draft_prefill_choice.clear()
        self.prefill_timer.stop(events)
        return result

    # -- decode steps ----------------------------------------------------

    def _decide(self, observation) -> DecodeMode:
        previous = self._policy.mode
        mode = self._policy.decide(observation)
        if mode is not previous:
            self.counters.record_switch(mode)
            logger.info("EAGLE3_DYNAMIC: %s mode at batch %d (queue %d).", mode.value,
                        observation.batch_size, observation.queued)
        self._trace.step(observation, mode)
        return mode

    def _on_step_time(self, step: int, mode: DecodeMode, batch_size: int, kv_tokens: int,
                      ms: float) -> None:
        if isinstance(self._policy, ThroughputPolicy):
            self._policy.add_step_time(step, mode, batch_size, kv_tokens, ms)
        self._trace.time(step, ms)

    def _catch_up(self, batch: ScheduleBatch) -> None:
        plan = self._catchup.catch_up(self._draft_worker, batch, self.plan_stream)
        if plan is not None:
            self._timings.interrupt()
            self._pending_catchup_tokens.append(plan.num_tokens)
            self.counters.record_catchup(plan.num_tokens, plan.truncated_tokens)

    def _harvest_catchup_timings(self) -> None:
        """Feed the policy the catch-ups whose GPU timing has completed (no waiting)."""
        for catchup_ms in self._catchup.gpu_time.finished():
            tokens = self._pending_catchup_tokens.popleft() if self._pending_catchup_tokens else 0
            if isinstance(self._policy, ThroughputPolicy):
                self._policy.add_catchup(tokens, catchup_ms)
            self._trace.catchup(tokens, catchup_ms)

    # -- reporting -------------------------------------------------------

    @property
    def mode(self) -> DecodeMode:
        """The policy's mode: that of the latest decode step it decided (speculative before
        the first one)."""
        return self._policy.mode

    def crossover_batch(self) -> int:
        """Largest batch at which speculation is predicted to pay (short contexts)."""
        if not isinstance(self._policy, ThroughputPolicy):
            return 0
        return crossover_batch(self._policy)

    def report(self) -> Dict[str, ReportValue]:
        """Counters, policy state and static facts, for /server_info."""
        self._harvest_catchup_timings()
        return {
            **self.counters.snapshot(),
            **self._policy.report(),
            "queued": self.queued,
            "catchup_gpu_ms": round(self._catchup.gpu_time.total_ms, 3),
            "crossover_batch": self.crossover_batch(),
            "max_plain_graph_batch": self._plain_graphs.max_bs,
            "plain_graph_capture_s": round(self._plain_graphs.capture_seconds, 2),
            "plain_graph_memory_gib": round(self._plain_graphs.capture_gib, 3),
            "catchup_ring_entries": self._catchup.ring_size,
            "catchup_max_window": self._catchup.max_window,
            "catchup_stash_mib": round(self._catchup.stash_bytes / 2**20, 1),
            "draft_prefill": "last-position" if self._last_position_draft_mlp else "full",
            "draft_prefill_full_layer_gpu_caught_up": self._draft_prefill_choice.caught_up,
            "draft_prefill_last_position_gpu_behind": self._draft_prefill_choice.behind,
            "acceptance_mismatched_results": self.request_acceptance.mismatched,
            **self.prefill_timer.report(),
            **({"host_syncs": self.host_syncs.report()} if self.host_syncs.enabled else {}),
        }
