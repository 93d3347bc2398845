"""DynamicEagleWorker: EAGLE-3 while speculation pays, plain decoding while it does not.

A dispatcher. Every decode step it asks the switching policy (``policy.DecodePolicy``) for a
mode, from the running batch size, the measured step costs and the measured acceptance (all
identical on every tensor-parallel rank, so every rank takes the same branch and issues the
same collectives), then runs

* speculative: the draft-KV catch-up for requests that decoded plainly since their last
  speculative step (``draft_catchup``), then sglang's EAGLE-3 step unchanged;
* plain: one target DECODE forward through the plain-decode graphs (``plain_step``).

After the step it hands the step's end to the cost tracker (``step_costs``), and verify results
to the acceptance estimate. Prefill batches take EAGLE-3's path (target extend + draft
extend), so new requests start with a correct draft context in either mode; the draft extend
runs the draft's output projection and MLP only at each request's last position while the GPU
is behind the host (``draft_prefill``), and ``prefill_timing`` measures both parts. A prefill of
requests that ask for at most two tokens skips the draft in either mode (``short_requests``),
and a decode batch of such requests alone runs plain without asking the policy. Optionally
(``deferred_draft_prefill``), a prefill whose requests join a batch the policy expects to
decode plainly runs the target extend alone and leaves the draft KV to the catch-up.
"""

from __future__ import annotations

import logging
from typing import Dict, Optional

import torch
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend
from sglang.srt.speculative.eagle_utils import get_draft_input_from_target_hidden_dim
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

from sglang_dynamic_eagle import upstream_internals
from sglang_dynamic_eagle.auto_policy import (AcceptanceEstimate, CostPolicy, CostPolicyConfig,
                                             max_accepted_tokens)
from sglang_dynamic_eagle.cost_model import (
    CrossoverLogGate,
    MeasuredCosts,
    calibration_table,
    calibration_vector,
    crossover_batch,
)
from sglang_dynamic_eagle.counters import ModeCounters
from sglang_dynamic_eagle.deferred_draft_prefill import (
    DeferredDraftPrefill,
    NoDeferral,
    decode_at_most_once,
    deferred_prefill_window,
)
from sglang_dynamic_eagle.draft_catchup import (
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
from sglang_dynamic_eagle.plain_step import PlainDecodeStep
from sglang_dynamic_eagle.policy import (
    DecodeMode,
    DecodePolicy,
    ReportValue,
    StepObservation,
    ThresholdPolicy,
    ThresholdPolicyConfig,
)
from sglang_dynamic_eagle.prefill_timing import PrefillTimer
from sglang_dynamic_eagle.prometheus_metrics import MetricsExport
from sglang_dynamic_eagle.short_requests import ShortPrefill, short_prefill
from sglang_dynamic_eagle.spec_algo import speculative_graph_max_bs
from sglang_dynamic_eagle.step_costs import DecodeCostTracker, calibrate, tp_max_reducer

logger = logging.getLogger(__name__)


class DynamicEagleWorker(EAGLEWorkerV2):
    """See the module docstring."""

    def __init__(self, server_args, gpu_id, ps, nccl_port, target_worker) -> None:
        upstream_internals.check_hooks_in_effect()
        super().__init__(server_args, gpu_id, ps, nccl_port, target_worker)
        self.counters = ModeCounters()
        self.acceptance = AcceptanceEstimate()
        self.metrics_export = MetricsExport()  # used with --enable-metrics
        self.prefill_timer = PrefillTimer()
        self.host_syncs = HostSyncCounter(sync_check_enabled())
        draft_tp_size = getattr(self._draft_worker.draft_runner.tp_group, "world_size", 1)
        self._draft_prefill_choice = DraftPrefillChoice(follows_gpu=draft_tp_size == 1)
        self._last_position_draft_mlp = use_last_position_mlp(
            self._draft_worker.draft_runner.model, self._draft_prefill_choice)
        self._flags = current_flags()
        self._policy: Optional[DecodePolicy] = None
        self._plain_graphs: Optional[PlainDecodeGraphs] = None
        self._plain_step: Optional[PlainDecodeStep] = None
        self._catchup: Optional[DraftCatchup] = None
        self._deferral: NoDeferral = NoDeferral()
        self._costs: Optional[DecodeCostTracker] = None
        self._crossover_log = CrossoverLogGate()
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
        window, short = deferred_prefill_window(), short_prefill()
        if window or short is not ShortPrefill.WITH_DRAFT:
            self._deferral = DeferredDraftPrefill(
                self._target_worker, self._catchup, self._plain_step, window, short
            )
        max_speculative_batch = self._speculative_graph_max_bs()
        self._costs = self._new_cost_tracker(max_speculative_batch)
        self._policy = self._new_policy(max_speculative_batch)
        logger.info(
            "EAGLE3_DYNAMIC: %s; speculative graphs up to batch %d, plain-decode graphs up "
            "to batch %d; catch-up ring of %d entries (%.0f MiB, at most %d positions per "
            "request); calibrated step costs "
            "(ms) plain %s, speculative %s.",
            self._policy_summary(),
            max_speculative_batch,
            self._plain_graphs.max_bs,
            self._catchup.ring_size,
            self._catchup.stash_bytes / 2**20,
            self._catchup.max_window,
            self._costs.table.plain.as_dict(),
            self._costs.table.speculative.as_dict(),
        )

    def _policy_summary(self) -> str:
        report = self._policy.report()
        if report["policy"] == "auto":
            return f"automatic switching (patience {report['switch_patience']} steps)"
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

    def _new_cost_tracker(self, max_speculative_batch: int) -> DecodeCostTracker:
        """Costs per CUDA-graph bucket; without graphs (eager steps), per the sizes sglang
        would have captured, so that eager steps are timed in the same buckets."""
        plain_runner = self._plain_graphs.graph_runner
        speculative_runners = self._speculative_graph_runners()
        speculative_sizes = (
            speculative_runners[0].capture_bs
            if speculative_runners
            else self.server_args.cuda_graph_config.decode.bs
        )
        buckets = {
            DecodeMode.PLAIN: list(
                plain_runner.capture_bs
                if plain_runner is not None
                else plain_decode_batch_sizes(self.server_args)
            ),
            DecodeMode.SPECULATIVE: [bs for bs in speculative_sizes if bs <= max_speculative_batch],
        }
        reduce_max = tp_max_reducer(self._target_worker.model_runner.tp_group)
        calibration = calibrate(
            {
                DecodeMode.PLAIN: [plain_runner] if plain_runner is not None else [],
                DecodeMode.SPECULATIVE: speculative_runners,
            },
            buckets,
        )
        calibration = calibration_table(
            buckets, reduce_max(calibration_vector(buckets, calibration))
        )
        return DecodeCostTracker(MeasuredCosts(buckets, calibration), reduce_max)

    def _new_policy(self, max_speculative_batch: int) -> DecodePolicy:
        flags = self._flags
        if flags.automatic:
            return CostPolicy(
                CostPolicyConfig(
                    switch_patience=flags.switch_patience,
                    max_speculative_batch=max_speculative_batch,
                    max_acceptance=float(max_accepted_tokens(self.speculative_num_steps,
                                                             self.speculative_num_draft_tokens)),
                )
            )
        return ThresholdPolicy(
            ThresholdPolicyConfig(
                disable_batch_threshold=flags.disable_batch_threshold,
                enable_batch_threshold=flags.enable_batch_threshold,
                switch_patience=flags.switch_patience,
                max_speculative_batch=max_speculative_batch,
            )
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
            decode_steps = self.counters.speculative_steps + self.counters.plain_steps
            self.acceptance.add_step(self._deferral.drafted(num_correct_drafts_per_req),
                                     decode_steps)
        super().on_verify_complete_cpu(num_correct_drafts_per_req, batch_size=batch_size)

    def forward_batch_generation(
        self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None
    ) -> GenerationBatchResult:
        is_extend = batch.forward_mode.is_extend() or batch.is_extend_in_batch
        if is_extend or batch.forward_mode.is_idle():
            self._last_step_plain = False
            self._costs.interrupt()
        if is_extend:
            self._catchup.forget(batch_req_pool_indices(batch))
            with self.host_syncs.watch("prefill"):
                return self._prefill(batch, on_publish, grammar_barrier)
        if batch.forward_mode.is_idle():
            return super().forward_batch_generation(batch, on_publish, grammar_barrier)

        batch_size = batch.batch_size()
        self._deferral.decoded(batch)
        # Speculation cannot shorten requests that all finish in this step (scoring and
        # classification loads ask for one or two tokens): plain, without asking the policy.
        finishing = decode_at_most_once(batch)
        mode = DecodeMode.PLAIN if finishing else self._decide(batch_size)
        with self.host_syncs.watch(mode.value):
            if mode is DecodeMode.PLAIN:
                result = self._plain_step.run(batch, on_publish)
            else:
                self._catch_up(batch)
                result = super().forward_batch_generation(batch, on_publish, grammar_barrier)
        self._last_step_plain = mode is DecodeMode.PLAIN
        self.counters.record_step(mode, batch_size, ran_graph=bool(result.can_run_cuda_graph))
        if mode is DecodeMode.SPECULATIVE:
            self._deferral.speculative_step(batch)
        self._measure(mode, batch_size, refresh=not finishing and self._policy.wants_fresh_costs())
        return result

    def _prefill(
        self, batch: ScheduleBatch, on_publish, grammar_barrier
    ) -> GenerationBatchResult:
        """EAGLE-3's prefill, timed in two parts: sglang's worker publishes between the
        target extend and the draft extend (in non-overlap mode too, when given a callback)."""
        self.prefill_timer.harvest()  # keeps the pending events few without a report reading them
        events = self.prefill_timer.start(batch.extend_num_tokens or 0)
        window = self._deferral.window_for(batch, self._expects_plain)

        def publish(new_seq_lens) -> None:
            self.prefill_timer.target_done(events)
            if window is None:  # the draft's prefill follows
                self._draft_prefill_choice.mark_target_end(events.target_end)
            if on_publish is not None:
                on_publish(new_seq_lens)

        if window is None:
            result = super().forward_batch_generation(batch, publish, grammar_barrier)
            self._draft_prefill_choice.clear()
        else:
            result = self._deferral.run(batch, publish, window)
        self.prefill_timer.stop(events)
        return result

    def _expects_plain(self, batch_size: int) -> bool:
        return self._policy.expects_plain(
            StepObservation(batch_size, self._costs.table, self.acceptance.value))

    # -- decode steps ----------------------------------------------------

    def _decide(self, batch_size: int) -> DecodeMode:
        previous = self._policy.mode
        observation = StepObservation(batch_size, self._costs.table, self.acceptance.value)
        mode = self._policy.decide(observation)
        if mode is not previous:
            self.counters.record_switch(mode)
            logger.info("EAGLE3_DYNAMIC: %s mode at batch %d.", mode.value, batch_size)
        return mode

    def _catch_up(self, batch: ScheduleBatch) -> None:
        plan = self._catchup.catch_up(self._draft_worker, batch, self.plan_stream)
        if plan is not None:
            self._costs.interrupt()
            self.counters.record_catchup(plan.num_tokens, plan.truncated_tokens)

    def _harvest_catchup_timings(self) -> None:
        """Feed the cost tracker the catch-ups whose GPU timing has completed (no waiting)."""
        for catchup_ms in self._catchup.gpu_time.finished():
            self._costs.add_catchup(catchup_ms)

    def _measure(self, mode: DecodeMode, batch_size: int, refresh: bool) -> None:
        """``refresh``: the policy asked for fresh costs at the step it decided (only its next
        decision clears the ask)."""
        self._harvest_catchup_timings()
        if self._costs.step_done(mode, batch_size, refresh=refresh):
            self._log_crossover_change()

    def _log_crossover_change(self) -> None:
        crossover = self.crossover_batch()
        if self._crossover_log.should_log(crossover):
            logger.info(
                "EAGLE3_DYNAMIC: speculation pays up to batch %d (acceptance %s, step costs "
                "in ms: plain %s, speculative %s).",
                crossover,
                _rounded(self.acceptance.value),
                self._costs.table.plain.as_dict(),
                self._costs.table.speculative.as_dict(),
            )

    # -- reporting -------------------------------------------------------

    @property
    def mode(self) -> DecodeMode:
        """The policy's mode: that of the latest decode step it decided (speculative before
        the first one); a batch whose requests all finish in their step runs plain without it."""
        return self._policy.mode

    def crossover_batch(self) -> int:
        """Largest batch at which speculation pays at the current acceptance estimate."""
        acceptance = self.acceptance.value
        if acceptance is None:
            return 0
        return crossover_batch(self._costs.table, acceptance)

    def report(self) -> Dict[str, ReportValue]:
        """Counters, policy state, cost table and static facts, for /server_info."""
        self._harvest_catchup_timings()
        table = self._costs.table
        return {
            **self.counters.snapshot(),
            **self._policy.report(),
            "catchup_gpu_ms": round(self._catchup.gpu_time.total_ms, 3),
            "acceptance_estimate": _rounded(self.acceptance.value),
            "crossover_batch": self.crossover_batch(),
            "plain_step_ms": table.plain.as_dict(),
            "speculative_step_ms": table.speculative.as_dict(),
            "plain_buckets_measured": table.plain.measured_buckets(),
            "speculative_buckets_measured": table.speculative.measured_buckets(),
            "catchup_ms": round(table.catchup_ms, 3),
            "max_plain_graph_batch": self._plain_graphs.max_bs,
            "plain_graph_capture_s": round(self._plain_graphs.capture_seconds, 2),
            "plain_graph_memory_gib": round(self._plain_graphs.capture_gib, 3),
            "catchup_ring_entries": self._catchup.ring_size,
            "catchup_max_window": self._catchup.max_window,
            "catchup_stash_mib": round(self._catchup.stash_bytes / 2**20, 1),
            "draft_prefill": "last-position" if self._last_position_draft_mlp else "full",
            "draft_prefill_full_layer_gpu_caught_up": self._draft_prefill_choice.caught_up,
            "draft_prefill_last_position_gpu_behind": self._draft_prefill_choice.behind,
            **self.prefill_timer.report(),
            **self._deferral.report(),
            **({"host_syncs": self.host_syncs.report()} if self.host_syncs.enabled else {}),
        }


def _rounded(value: Optional[float]) -> float:
    return round(value, 4) if value is not None else 0.0
