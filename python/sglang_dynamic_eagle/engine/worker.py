"""DynamicEagleWorker: EAGLE-3 while speculation pays, plain decoding while it does not.

A dispatcher. Every decode step it builds the policy's view of the batch (``observations``:
KV tokens, queue, the acceptance of its requests) and asks the policy (``policy``) for a mode,
when the scheduler chooses the batch (``batch_selected``, from a hook) or else when it is called
(every input identical on every tensor-parallel rank, so every rank takes the same branch and
issues the same collectives); then it runs

* speculative: the draft-KV catch-up for requests that decoded plainly since their last
  speculative step (``draft_catchup``), then sglang's EAGLE-3 step unchanged;
* plain: one target DECODE forward through the plain-decode graphs (``plain_step``).

After the step it hands the step's end to the timing feed (``step_costs``), which gives the
policy the measured times a few steps later, and verify results to the acceptance records and
the policy (``observations.PolicyFeed``); with a step trace (``observability.trace``) the policy
and its feed come wrapped. Prefill batches take EAGLE-3's path (target extend +
draft extend, sglang's own layers), so new requests start with a correct draft context in either
mode; ``observability.prefill_timing`` measures both parts. What the worker needs besides
sglang's step is built once the graphs are captured (``startup``).
"""

from __future__ import annotations

import logging
from time import perf_counter
from typing import Dict, Optional, Tuple

from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

from sglang_dynamic_eagle.config import load_config
from sglang_dynamic_eagle.engine.draft_catchup import DraftCatchup, batch_req_pool_indices
from sglang_dynamic_eagle.engine.early_first_token import EarlyFirstToken
from sglang_dynamic_eagle.engine.observations import PolicyFeed, RequestAcceptance, observe
from sglang_dynamic_eagle.engine.plain_decode_graphs import PlainDecodeGraphs
from sglang_dynamic_eagle.engine.plain_step import PlainDecodeStep
from sglang_dynamic_eagle.engine.startup import build_decode_parts
from sglang_dynamic_eagle.engine.step_costs import TimingFeed
from sglang_dynamic_eagle.observability.counters import ModeCounters
from sglang_dynamic_eagle.observability.prefill_timing import PrefillTimer
from sglang_dynamic_eagle.observability.prometheus_metrics import MetricsExport
from sglang_dynamic_eagle.policy import DecodeMode, DecodePolicy, ReportValue, StepObservation

logger = logging.getLogger(__name__)


class DynamicEagleWorker(EAGLEWorkerV2):
    """See the module docstring."""

    def __init__(self, server_args, gpu_id, ps, nccl_port, target_worker) -> None:
        super().__init__(server_args, gpu_id, ps, nccl_port, target_worker)
        self.config = load_config()
        self.counters = ModeCounters()
        self.request_acceptance = RequestAcceptance()
        self.metrics_export = MetricsExport()  # used with --enable-metrics
        self.prefill_timer = PrefillTimer()
        self.early_first_token = EarlyFirstToken(self.config.early_first_token, server_args.tp_size)
        self.queued = 0  # requests waiting to be admitted; set by the scheduler hook
        # The decision made when the scheduler chose the batch: (batch, its size, view, mode).
        self._selected: Optional[Tuple[ScheduleBatch, int, StepObservation, DecodeMode]] = None
        self._policy: Optional[DecodePolicy] = None
        self._feed: Optional[PolicyFeed] = None
        self._plain_graphs: Optional[PlainDecodeGraphs] = None
        self._plain_step: Optional[PlainDecodeStep] = None
        self._catchup: Optional[DraftCatchup] = None
        self._timings: Optional[TimingFeed] = None
        self._decode_step = 0
        self._last_step_plain = False

    def init_cuda_graphs(self) -> None:
        super().init_cuda_graphs()
        parts = build_decode_parts(self, self.config)
        self._catchup, self._plain_graphs, self._plain_step = (
            parts.catchup, parts.plain_graphs, parts.plain_step)
        self._policy, self._feed, self._timings = parts.policy, parts.feed, parts.timings
        self.prefill_timer.sink = getattr(self._feed, "prefill", None)  # traced servers only
        self.prefill_timer.key_sink = self._timings.prefill_timed

    # -- scheduler-facing overrides ---------------------------------------

    @property
    def war_fastpath_runner(self):
        # A prefill whose draft extend ran on the side stream: its end on that stream.
        if self.early_first_token.war_fastpath_read_done_event is not None:
            return self.early_first_token
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
        start = perf_counter()
        if self.counters.record_result(num_correct_drafts_per_req) is DecodeMode.SPECULATIVE:
            before = self.request_acceptance.verified(num_correct_drafts_per_req)
            self._feed.verified(self.counters.verified_step, num_correct_drafts_per_req, before)
        self.counters.record_host(None, perf_counter() - start)
        super().on_verify_complete_cpu(num_correct_drafts_per_req, batch_size=batch_size)

    def attach_scheduler(self, scheduler) -> None:
        """The scheduler, at its first batch choice (its hook): the early first token wraps its
        future map."""
        self.early_first_token.attach(scheduler)

    def batch_selected(self, batch: Optional[ScheduleBatch], queued: int) -> None:
        """The scheduler chose its next batch (its hook, ``sglang_compat.hooks``), with
        ``queued`` requests left waiting: for a decode batch the policy decides now. The
        scheduler then waits for the previous step's verify, and on a backend that needs its
        sequence lengths on the host (flashinfer) launches this step only after that wait;
        deciding here keeps the decision's host time out of that window, where the GPU has only
        the previous draft extend left. What the decision reads is the same at both points (the
        previous step's result is processed after this step's launch), except in a batch for
        which sglang turns overlap off (grammar), whose decision misses that one result."""
        self.queued = queued
        self._selected = None
        if self._policy is None or batch is None or not _is_decode(batch):
            return
        start = perf_counter()
        observation, mode = self._observe_and_decide(batch)
        self._selected = (batch, len(batch.reqs), observation, mode)
        self.counters.record_host(None, perf_counter() - start)

    def forward_batch_generation(
        self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None
    ) -> GenerationBatchResult:
        selected, self._selected = self._selected, None  # a choice is used by the next call only
        if not _is_decode(batch):
            self._last_step_plain = False
            self._timings.interrupt()
            if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
                self._catchup.forget(batch_req_pool_indices(batch))
                return self._prefill(batch, on_publish, grammar_barrier)
            return super().forward_batch_generation(batch, on_publish, grammar_barrier)  # idle

        start = perf_counter()
        at_selection = (selected is not None and selected[0] is batch
                        and selected[1] == len(batch.reqs))
        if at_selection:
            observation, mode = selected[2], selected[3]
        else:  # no hook call for this batch (another scheduler loop): decide here
            observation, mode = self._observe_and_decide(batch)
        result, step_s, launched_at = self._decode(mode, batch, on_publish, grammar_barrier)
        self._last_step_plain = mode is DecodeMode.PLAIN
        self.counters.record_step(mode, observation.batch_size,
                                  ran_graph=bool(result.can_run_cuda_graph), step=self._decode_step,
                                  decided_at_selection=at_selection)
        self._harvest_catchup_timings()
        self._timings.step_done(self._decode_step, mode, observation.batch_size,
                                observation.kv_tokens)
        dispatch_s = perf_counter() - start - step_s
        self.counters.record_host(mode, dispatch_s, step_s, before_launch_s=launched_at - start)
        self._feed.step_end(self._decode_step, dispatch_s, step_s)
        return result

    # -- the steps -------------------------------------------------------

    def _prefill(self, batch: ScheduleBatch, on_publish, grammar_barrier) -> GenerationBatchResult:
        """EAGLE-3's prefill, timed in two parts: sglang's worker publishes between the
        target extend and the draft extend; from there the draft extend runs beside the first
        token's copy to the host (``early_first_token``)."""
        eagle_forward = super().forward_batch_generation
        tokens = batch.extend_num_tokens or 0
        key = self._timings.prefill_launched(tokens) if self._timings is not None else None
        with self.early_first_token.prefill(on_publish) as publish:
            result = self.prefill_timer.timed(
                tokens, publish, lambda publish: eagle_forward(batch, publish, grammar_barrier),
                key)
            self.early_first_token.launched(result)
        return result

    def _decode(self, mode: DecodeMode, batch: ScheduleBatch, on_publish,
                grammar_barrier) -> Tuple[GenerationBatchResult, float, float]:
        """The mode's step, the host seconds it took (a speculative step's with its catch-up;
        the bookkeeping around them is the dispatch's) and the host clock when it was called,
        less a catch-up: the dispatch before that is what a backend that waits for the previous
        verify before the worker runs (flashinfer) can expose as GPU idle time."""
        start = perf_counter()
        if mode is DecodeMode.PLAIN:
            return self._plain_step.run(batch, on_publish), perf_counter() - start, start
        plan = self._catchup.catch_up(self._draft_worker, batch, self.plan_stream)
        step_s = perf_counter() - start
        if plan is not None:
            self._timings.interrupt()
            self._timings.catchup_launched(self._decode_step, plan.num_tokens)
            self.counters.record_catchup(plan.num_tokens, plan.truncated_tokens)
        self.request_acceptance.launched(batch.reqs)
        start = perf_counter()
        result = super().forward_batch_generation(batch, on_publish, grammar_barrier)
        return result, step_s + perf_counter() - start, start - step_s

    def _observe_and_decide(self, batch: ScheduleBatch) -> Tuple[StepObservation, DecodeMode]:
        self._decode_step += 1
        observation = observe(batch, self.queued, self.request_acceptance, self._decode_step,
                              self._feed.per_request_up_to)
        return observation, self._decide(observation)

    def _decide(self, observation: StepObservation) -> DecodeMode:
        previous = self._policy.mode
        mode = self._policy.decide(observation)
        if mode is not previous:
            self.counters.record_switch(mode)
            logger.info("EAGLE3_DYNAMIC: %s mode at batch %d (queue %d).", mode.value,
                        observation.batch_size, observation.queued)
        return mode

    def _harvest_catchup_timings(self) -> None:
        """Hand the timing feed the catch-ups and prefills whose GPU time has completed (no
        waiting); it gives them to the policy identical on every rank."""
        for _, catchup_ms in self._catchup.gpu_time.finished():
            self._timings.catchup_timed(catchup_ms)
        self.prefill_timer.harvest()

    # -- reporting -------------------------------------------------------

    @property
    def mode(self) -> DecodeMode:
        """The policy's mode: that of the latest decode step it decided (speculative before
        the first one)."""
        return self._policy.mode

    def report(self) -> Dict[str, ReportValue]:
        """Counters, policy state and static facts, for /server_info."""
        self._harvest_catchup_timings()
        return {
            **self.counters.snapshot(),
            **self._policy.report(),
            "queued": self.queued,
            **self._feed.report(),
            **self._catchup.report(),
            **self._plain_graphs.report(),
            "acceptance_mismatched_results": self.request_acceptance.mismatched,
            **self.prefill_timer.report(),
            **self.early_first_token.report(),
        }


def _is_decode(batch: ScheduleBatch) -> bool:
    mode = batch.forward_mode
    return not (mode.is_extend() or batch.is_extend_in_batch or mode.is_idle())
