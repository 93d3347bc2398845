"""The worker's decode loop on CPU, with stand-ins for the target, the plain step, the catch-up
and the cost tracker, and the real threshold policy: which path each step took, what was
forgotten, caught up, counted, timed and fed to the acceptance estimate."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import List, Optional, Sequence, Tuple

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

from sglang_dynamic_eagle.auto_policy import AcceptanceEstimate
from sglang_dynamic_eagle.counters import ModeCounters
from sglang_dynamic_eagle.deferred_draft_prefill import DeferredDraftPrefill, NoDeferral
from sglang_dynamic_eagle.short_requests import ShortPrefill, namespace_short_request
from sglang_dynamic_eagle.draft_catchup import CatchupPlan, batch_req_pool_indices
from sglang_dynamic_eagle.host_syncs import HostSyncCounter
from sglang_dynamic_eagle.policy import DecodeMode, ThresholdPolicy, ThresholdPolicyConfig
from sglang_dynamic_eagle.spec_algo import DynamicEagleSpecAlgo
from sglang_dynamic_eagle.worker import DynamicEagleWorker

SPEC = DecodeMode.SPECULATIVE
PLAIN = DecodeMode.PLAIN


@dataclass
class FakeCatchup:
    """Counts plain steps per request slot like DraftCatchup, without tensors."""

    missed: dict = field(default_factory=dict)
    forgotten: List[List[int]] = field(default_factory=list)
    caught_up: List[List[int]] = field(default_factory=list)
    gpu_time: SimpleNamespace = field(
        default_factory=lambda: SimpleNamespace(finished=lambda: [3.0], total_ms=0.0)
    )

    def record(self, indices: Sequence[int]) -> None:
        for index in indices:
            self.missed[index] = self.missed.get(index, 0) + 1

    def forget(self, indices: Sequence[int]) -> None:
        self.forgotten.append(list(indices))
        for index in indices:
            self.missed.pop(index, None)

    def catch_up(self, draft_worker, batch, plan_stream) -> Optional[CatchupPlan]:
        indices = batch_req_pool_indices(batch)
        rows = [row for row, index in enumerate(indices) if self.missed.get(index)]
        if not rows:
            return None
        self.caught_up.append([indices[row] for row in rows])
        lengths = [self.missed.pop(indices[row]) for row in rows]
        return CatchupPlan(rows=rows, lengths=lengths, truncated_tokens=0)


@dataclass
class FakePlainStep:
    catchup: FakeCatchup
    runs: List[int] = field(default_factory=list)

    def run(self, batch, on_publish):
        self.runs.append(batch.batch_size())
        self.catchup.record(batch_req_pool_indices(batch))
        return SimpleNamespace(can_run_cuda_graph=True)


@dataclass
class FakeCosts:
    table: None = None
    steps: List[Tuple[DecodeMode, int]] = field(default_factory=list)
    interrupts: int = 0
    catchup_samples: List[float] = field(default_factory=list)
    refreshes_asked: List[bool] = field(default_factory=list)

    def step_done(self, mode: DecodeMode, batch_size: int, refresh: bool = False) -> bool:
        self.steps.append((mode, batch_size))
        self.refreshes_asked.append(refresh)
        return False

    def interrupt(self) -> None:
        self.interrupts += 1

    def add_catchup(self, catchup_ms: float) -> None:
        self.catchup_samples.append(catchup_ms)


@dataclass
class FakePrefillTimer:
    """Records the order of PrefillTimer calls."""

    calls: List[str] = field(default_factory=list)

    def harvest(self) -> None:
        self.calls.append("harvest")

    def start(self, num_tokens: int) -> SimpleNamespace:
        self.calls.append(f"start {num_tokens}")
        return SimpleNamespace(target_end=None)

    def target_done(self, events: SimpleNamespace) -> None:
        self.calls.append("target done")
        events.target_end = f"target end {len(self.calls)}"

    def stop(self, events: SimpleNamespace) -> None:
        self.calls.append("stop")


@dataclass
class RecordingDraftPrefillChoice:
    """The target-extend ends the worker marked for the draft layer's choice."""

    marks: List[str] = field(default_factory=list)
    pending: Optional[str] = None

    def mark_target_end(self, event: str) -> None:
        self.marks.append(event)
        self.pending = event

    def clear(self) -> None:
        self.pending = None


@pytest.fixture
def worker(monkeypatch):
    """A DynamicEagleWorker without a GPU: EAGLE's own step and verify hook are recorded."""
    eagle_calls: List[str] = []
    verify_calls: List[int] = []

    def eagle_step(self, batch, on_publish=None, grammar_barrier=None):
        eagle_calls.append(batch.forward_mode.name)
        if batch.forward_mode.is_extend() and on_publish is not None:
            # Like EAGLEWorkerV2: publish between the target extend and the draft extend.
            self.prefill_timer.calls.append("target extend")
            on_publish("new seq lens")
            self.prefill_timer.calls.append("draft extend")
        return SimpleNamespace(can_run_cuda_graph=True)

    def eagle_verify_hook(self, num_correct_drafts_per_req, batch_size=0):
        verify_calls.append(len(num_correct_drafts_per_req))

    monkeypatch.setattr(EAGLEWorkerV2, "forward_batch_generation", eagle_step)
    monkeypatch.setattr(EAGLEWorkerV2, "on_verify_complete_cpu", eagle_verify_hook)
    instance = object.__new__(DynamicEagleWorker)
    catchup = FakeCatchup()
    instance.counters = ModeCounters()
    instance.acceptance = AcceptanceEstimate()
    instance._policy = ThresholdPolicy(ThresholdPolicyConfig(2, 2, 1, 48))
    instance._catchup = catchup
    instance._plain_step = FakePlainStep(catchup)
    instance._deferral = NoDeferral()
    instance._costs = FakeCosts()
    instance.prefill_timer = FakePrefillTimer()
    instance._draft_prefill_choice = RecordingDraftPrefillChoice()
    instance.host_syncs = HostSyncCounter(enabled=False)
    instance._draft_worker = None
    instance.plan_stream = None
    instance._last_step_plain = False
    instance.eagle_calls = eagle_calls
    instance.verify_calls = verify_calls
    return instance


# The requests of one test by slot (sglang's Req objects persist across batches) and the
# slots whose requests have finished.
REQUESTS: dict = {}
FINISHED: set = set()


@pytest.fixture(autouse=True)
def fresh_requests():
    REQUESTS.clear()
    FINISHED.clear()


DYNAMIC_SCHEDULER = SimpleNamespace(server_args=SimpleNamespace(speculative_algorithm="EAGLE3_DYNAMIC"))


def request_in(slot: int, max_new_tokens: int = 128, namespaced: bool = True) -> SimpleNamespace:
    """The slot's request; a new one is namespaced as the scheduler's hook does it, unless
    ``namespaced`` is False (a request whose length sglang capped after the hook ran)."""
    if slot not in REQUESTS:
        request = SimpleNamespace(req_pool_idx=slot, finished=lambda: slot in FINISHED,
                                  sampling_params=SimpleNamespace(max_new_tokens=max_new_tokens),
                                  extra_key=None)
        if namespaced:
            namespace_short_request(None, DYNAMIC_SCHEDULER, request)
        REQUESTS[slot] = request
    return REQUESTS[slot]


def make_batch(mode: ForwardMode, slots: Sequence[int]) -> SimpleNamespace:
    reqs = [request_in(slot) for slot in slots]
    return SimpleNamespace(
        forward_mode=mode,
        input_embeds=None,
        multimodal_inputs=[None] * len(reqs),
        is_extend_in_batch=mode.is_extend(),
        reqs=reqs,
        req_pool_indices_cpu=torch.tensor(list(slots), dtype=torch.int64),
        extend_num_tokens=10 * len(reqs) if mode.is_extend() else None,
        batch_size=lambda: len(reqs),
        spec_info=object(),
    )


def decode(worker, slots: Sequence[int]) -> None:
    worker.forward_batch_generation(make_batch(ForwardMode.DECODE, slots))


def test_batch_sizes_1_40_1_take_each_path_and_catch_up(worker) -> None:
    decode(worker, [0])  # speculative
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, range(1, 40)))
    assert worker._catchup.forgotten == [list(range(1, 40))]
    for _ in range(3):
        decode(worker, range(40))  # above N = 2: plain
    decode(worker, [0])  # at M = 2, patience 1: speculative again, after a catch-up of slot 0

    assert worker._plain_step.runs == [40, 40, 40]
    assert worker.eagle_calls == ["DECODE", "EXTEND", "DECODE"]
    assert worker._catchup.caught_up == [[0]]
    counters = worker.counters
    assert (counters.speculative_steps, counters.plain_steps, counters.plain_graph_steps) == (2, 3, 3)
    assert (counters.switches_to_plain, counters.switches_to_speculative) == (1, 1)
    assert (counters.catchup_forwards, counters.catchup_tokens) == (1, 3)
    assert (counters.max_plain_batch, counters.max_speculative_batch) == (40, 1)
    assert worker._costs.steps == [(SPEC, 1), (PLAIN, 40), (PLAIN, 40), (PLAIN, 40), (SPEC, 1)]
    # The prefill and the catch-up both break the run of step timings.
    assert worker._costs.interrupts == 2
    assert worker._costs.catchup_samples == [3.0] * 5


def test_prefill_forgets_what_plain_steps_left_to_catch_up(worker) -> None:
    decode(worker, [0, 1, 2])
    decode(worker, [0, 1, 2])  # plain
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [1]))  # slot 1 re-prefilled
    decode(worker, [0, 1])  # speculative: only slot 0 still misses draft KV
    assert worker._catchup.caught_up == [[0]]
    assert worker.counters.catchup_tokens == 2


@pytest.mark.parametrize("scheduler_publishes", [True, False], ids=["overlap", "non-overlap"])
def test_a_prefill_is_timed_in_two_parts_and_published_once(worker, scheduler_publishes) -> None:
    published: List[str] = []
    on_publish = published.append if scheduler_publishes else None
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [1, 2]), on_publish)
    assert worker.prefill_timer.calls == [
        "harvest", "start 20", "target extend", "target done", "draft extend", "stop"
    ]
    assert published == (["new seq lens"] if scheduler_publishes else [])
    assert worker.counters.speculative_steps == worker.counters.plain_steps == 0


def test_decode_steps_are_not_timed_as_prefills(worker) -> None:
    decode(worker, [0])
    decode(worker, range(10))
    assert worker.prefill_timer.calls == []


def test_idle_batches_take_eagles_path_and_break_timing(worker) -> None:
    worker.forward_batch_generation(make_batch(ForwardMode.IDLE, []))
    assert worker.eagle_calls == ["IDLE"]
    assert worker._costs.steps == [] and worker._costs.interrupts == 1
    assert worker.counters.speculative_steps == worker.counters.plain_steps == 0


def test_war_barrier_runner_follows_the_last_step(worker) -> None:
    target_runner = object()
    worker._target_worker = SimpleNamespace(model_runner=target_runner)
    decode(worker, [0, 1, 2])
    decode(worker, [0, 1, 2])
    assert worker._last_step_plain and worker.war_fastpath_runner is target_runner
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [3]))
    assert not worker._last_step_plain


def test_verify_results_feed_acceptance_only_for_speculative_steps(worker) -> None:
    decode(worker, [0])  # speculative
    decode(worker, [0, 1])  # speculative (N = 2)
    decode(worker, [0, 1, 2])  # plain
    worker.on_verify_complete_cpu([2])
    assert worker.acceptance.value == pytest.approx(3.0)
    worker.on_verify_complete_cpu([1, 0])
    estimate = worker.acceptance.value
    assert 1.5 < estimate < 3.0
    worker.on_verify_complete_cpu([0, 0, 0])  # the plain step's result
    assert worker.counters.speculative_verified_requests == 3
    assert worker.counters.speculative_accepted_tokens == 3 + 3
    assert worker.verify_calls == [1, 2, 3]  # EAGLE's own hook still sees every result
    assert worker.acceptance.value == estimate


def test_mode_property_reports_the_latest_step(worker) -> None:
    decode(worker, [0])
    assert worker.mode is SPEC
    decode(worker, range(10))
    assert worker.mode is PLAIN


def test_grammar_batches_run_without_overlap() -> None:
    # The plain step never calls the scheduler's grammar barrier; sglang passes it only when
    # the algorithm supports grammar overlap, which EAGLE3 does and EAGLE3_DYNAMIC must not.
    assert DynamicEagleSpecAlgo.supports_grammar_overlap(object.__new__(DynamicEagleSpecAlgo)) is False


def test_the_cost_table_is_refreshed_when_the_policy_asks(worker) -> None:
    """A probe's last step asks for a refresh, so the next decision reads what it measured."""
    asks = iter([False, True, False])
    worker._policy.wants_fresh_costs = lambda: next(asks)
    for _ in range(3):
        decode(worker, [1])
    assert worker._costs.refreshes_asked == [False, True, False]


class RecordingDeferral(DeferredDraftPrefill):
    """The deferral's decisions, with a run that records the prefills it was given and
    publishes like the target half of EAGLE's prefill."""

    def __init__(self, timer: FakePrefillTimer, window: int = 64,
                 short_prefill: ShortPrefill = ShortPrefill.SEPARATE_CACHE) -> None:
        super().__init__(target_worker=None, catchup=None, plain_step=None, window=window,
                         short_prefill=short_prefill)
        self.timer = timer
        self.ran: List[List[int]] = []
        self.windows: List[int] = []

    def run(self, batch, on_publish, window):
        self.timer.calls.append("target extend")
        on_publish("new seq lens")
        self.ran.append(batch_req_pool_indices(batch))
        self.windows.append(window)
        return SimpleNamespace(can_run_cuda_graph=False)


def test_with_deferral_a_prefill_in_plain_mode_runs_the_target_alone(worker) -> None:
    deferred = RecordingDeferral(worker.prefill_timer)
    worker._deferral = deferred
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [0]))  # before any decode
    decode(worker, [0, 1, 2])  # above N = 2 with patience 1: plain
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [3, 4]))
    worker.forward_batch_generation(make_batch(ForwardMode.MIXED, [5]))
    assert deferred.ran == [[3, 4]]
    assert worker.eagle_calls == ["EXTEND", "MIXED"]
    eagle_prefill = ["target extend", "target done", "draft extend", "stop"]
    assert worker.prefill_timer.calls == (
        ["harvest", "start 10"] + eagle_prefill
        + ["harvest", "start 20", "target extend", "target done", "stop"]
        + ["harvest", "start 10"] + eagle_prefill
    )


def test_only_a_prefill_whose_draft_extend_follows_marks_the_target_end(worker) -> None:
    """The draft layer chooses from the mark of the prefill it runs in; a deferred prefill
    runs no draft, and a mark it left would be read by the next catch-up."""
    worker._deferral = RecordingDeferral(worker.prefill_timer)
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [0]))  # EAGLE's prefill
    decode(worker, [0, 1, 2])  # plain
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [3, 4]))  # deferred
    assert worker._draft_prefill_choice.marks == ["target end 4"]
    assert worker._draft_prefill_choice.pending is None  # unread marks do not reach a catch-up


def test_without_deferral_a_prefill_in_plain_mode_takes_eagles_path(worker) -> None:
    decode(worker, [0, 1, 2])
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [3, 4]))
    assert worker.eagle_calls == ["EXTEND"]


def test_a_prefill_that_joins_a_batch_small_enough_to_speculate_is_not_deferred(worker) -> None:
    deferred = RecordingDeferral(worker.prefill_timer)
    worker._deferral = deferred
    worker._policy = ThresholdPolicy(ThresholdPolicyConfig(2, 2, 2, 48))
    for _ in range(2):
        decode(worker, [0, 1, 2])  # plain after a patience of 2
    decode(worker, [0])  # one step of the streak back: still plain
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [3]))  # joins 1: 2 <= M
    decode(worker, [0, 1, 2, 4])  # the streak breaks
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [5]))  # joins 4: 5 > M
    assert deferred.ran == [[5]]


def test_the_joined_batch_counts_prefills_since_the_last_decode_and_not_finished_requests(
    worker,
) -> None:
    deferred = RecordingDeferral(worker.prefill_timer)
    worker._deferral = deferred
    decode(worker, [0, 1, 2])  # plain
    FINISHED.update({0, 1, 2})
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [3]))  # 1 <= M = 2
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [4, 5]))  # 3 > M
    assert deferred.ran == [[4, 5]]


def test_from_speculation_only_a_batch_above_the_graph_limit_defers(worker) -> None:
    deferred = RecordingDeferral(worker.prefill_timer)
    worker._deferral = deferred
    decode(worker, [0])  # speculative
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, range(1, 11)))  # 11 > N
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, range(11, 51)))  # 51 > 48
    assert deferred.ran == [list(range(11, 51))]


def test_while_speculating_a_prefill_of_requests_that_decode_once_defers_and_stashes_nothing(
    worker,
) -> None:
    deferred = RecordingDeferral(worker.prefill_timer)
    worker._deferral = deferred
    decode(worker, [0])  # speculative
    for slot, max_new_tokens in ((1, 2), (2, 1), (3, 3)):
        request_in(slot, max_new_tokens)
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [1, 2]))
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [2, 3]))
    worker.forward_batch_generation(make_batch(ForwardMode.MIXED, [1]))
    assert (deferred.ran, deferred.windows) == ([[1, 2]], [0])


@pytest.mark.parametrize("short_prefill, deferred_slots", [
    (ShortPrefill.SEPARATE_CACHE, [[1, 2]]),
    (ShortPrefill.SHARED_CACHE, [[1, 2], [4]]),
    (ShortPrefill.WITH_DRAFT, []),
], ids=lambda value: getattr(value, "value", None))
def test_which_prefills_of_short_requests_skip_the_draft(worker, short_prefill, deferred_slots
                                                          ) -> None:
    """With the separate cache the key decides: slot 4 asks for two tokens but was not put
    into the short requests' namespace (sglang capped its length after the hook), so its
    prefix may be shared with a request that speculates and its prefill keeps the draft."""
    deferred = RecordingDeferral(worker.prefill_timer, window=0, short_prefill=short_prefill)
    worker._deferral = deferred
    decode(worker, [0])  # speculative
    request_in(1, 2)
    request_in(2, 1)
    request_in(4, 2, namespaced=False)
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [1, 2]))
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [4]))
    assert deferred.ran == deferred_slots
    assert deferred.windows == [0] * len(deferred_slots)


def test_without_a_window_a_prefill_in_plain_mode_of_long_requests_keeps_the_draft(worker
                                                                                     ) -> None:
    deferred = RecordingDeferral(worker.prefill_timer, window=0)
    worker._deferral = deferred
    decode(worker, [0, 1, 2])  # plain
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [3, 4]))
    assert deferred.ran == [] and worker.eagle_calls == ["EXTEND"]


def test_stub_proposals_stay_out_of_the_acceptance_estimate(worker) -> None:
    """Slot 1 asked for two tokens, its prefill stashed nothing: in the speculative step that
    follows it proposes from the stub, and only slot 0's verification is an acceptance."""
    worker._deferral = RecordingDeferral(worker.prefill_timer)
    decode(worker, [0])  # speculative
    request_in(1, max_new_tokens=2)
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [1]))
    decode(worker, [0, 1])
    worker.on_verify_complete_cpu([3])  # the first step's result
    worker.on_verify_complete_cpu([3, 0])
    assert worker.acceptance.value == pytest.approx(4.0)
    assert worker.counters.speculative_verified_requests == 3


@pytest.mark.parametrize("deferral", [False, True], ids=["without deferral", "with deferral"])
def test_a_batch_of_requests_that_finish_in_this_step_decodes_plainly(worker, deferral) -> None:
    asked = []
    decide = worker._policy.decide
    worker._policy.decide = lambda observation: asked.append(observation.batch_size) or decide(
        observation)
    if deferral:
        worker._deferral = RecordingDeferral(worker.prefill_timer)
    for slot, max_new_tokens in ((0, 2), (1, 1), (2, 3)):
        request_in(slot, max_new_tokens)
    decode(worker, [0, 1])  # speculation cannot shorten either: plain, policy not asked
    decode(worker, [0, 2])  # slot 2 has more to decode: the policy's speculation
    assert worker._plain_step.runs == [2]
    assert worker.counters.plain_steps == 1 and worker.counters.speculative_steps == 1
    assert asked == [2]


def test_a_step_the_policy_did_not_decide_asks_no_cost_refresh(worker) -> None:
    """The policy's ask for fresh costs stands until its next decision: steps it does not
    decide must not refresh the cost table each time."""
    worker._policy.wants_fresh_costs = lambda: True
    request_in(0, max_new_tokens=2)
    decode(worker, [0])
    decode(worker, [1])
    assert worker._costs.refreshes_asked == [False, True]


def test_a_prefill_in_plain_mode_stashes_the_window(worker) -> None:
    deferred = RecordingDeferral(worker.prefill_timer)
    worker._deferral = deferred
    decode(worker, [0, 1, 2])  # plain
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [3, 4]))
    assert deferred.windows == [64]


def test_the_policy_is_asked_with_the_measured_costs_and_acceptance(worker) -> None:
    asked = []
    policy = worker._policy

    class AskedPolicy:
        mode = property(lambda self: policy.mode)
        decide = staticmethod(policy.decide)

        def expects_plain(self, observation):
            asked.append(observation)
            return False

    worker._policy = AskedPolicy()
    worker._deferral = RecordingDeferral(worker.prefill_timer)
    worker._costs.table = "the cost table"
    worker.acceptance.add_step([2, 2], 1)
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [0, 1]))
    [observation] = asked
    assert (observation.batch_size, observation.costs) == (2, "the cost table")
    assert observation.acceptance == worker.acceptance.value is not None
