"""The worker's decode loop on CPU, with stand-ins for EAGLE's own step, the plain step, the
catch-up, the timing feed and the prefill timer's events, and real policies
(the threshold policy for the paths, the throughput policy where its inputs matter): which path
each step took, what the policy was told, what was forgotten, caught up, counted, timed, traced
and fed to the acceptance records."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import List, Optional, Sequence, Tuple

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

from sglang_dynamic_eagle.config import TRACE_ENV, load_config
from sglang_dynamic_eagle.engine.draft_catchup import CatchupPlan, batch_req_pool_indices
from sglang_dynamic_eagle.engine.early_first_token import EarlyFirstToken
from sglang_dynamic_eagle.engine.observations import PolicyFeed, RequestAcceptance
from sglang_dynamic_eagle.engine.step_costs import TimingFeed
from sglang_dynamic_eagle.engine.worker import DynamicEagleWorker
from sglang_dynamic_eagle.observability.counters import ModeCounters
from sglang_dynamic_eagle.observability.prefill_timing import PrefillTimer
from sglang_dynamic_eagle.observability.trace import TracedFeed, traced
from sglang_dynamic_eagle.policy import DecodeMode, StepObservation, ThresholdPolicy
from sglang_dynamic_eagle.policy import ThresholdPolicyConfig
from sglang_dynamic_eagle.policy.replay import TraceStep, load_trace
from sglang_dynamic_eagle.policy.throughput import ThroughputPolicyConfig, new_throughput_policy
from sglang_dynamic_eagle.sglang_compat.spec_algo import DynamicEagleSpecAlgo

SPEC = DecodeMode.SPECULATIVE
PLAIN = DecodeMode.PLAIN
KV_PER_REQUEST = 100  # a request's kv_committed_len unless a test says otherwise


def catchup_ms(tokens: int) -> float:
    """The GPU time the stand-in catch-up reports for a catch-up of ``tokens`` positions."""
    return 2.0 + 0.25 * tokens


@dataclass
class FakeGpuTime:
    """GpuIntervals without events: every interval has completed by the next read."""

    pending: List[Tuple[int, float]] = field(default_factory=list)
    total_ms: float = 0.0

    def finished(self) -> List[Tuple[int, float]]:
        done, self.pending = self.pending, []
        self.total_ms += sum(ms for _, ms in done)
        return done


@dataclass
class FakeCatchup:
    """Counts plain steps per request slot like DraftCatchup, without tensors."""

    missed: dict = field(default_factory=dict)
    forgotten: List[List[int]] = field(default_factory=list)
    caught_up: List[List[int]] = field(default_factory=list)
    gpu_time: FakeGpuTime = field(default_factory=FakeGpuTime)

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
        self.gpu_time.pending.append((sum(lengths), catchup_ms(sum(lengths))))
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
class FakeTimings:
    """TimingFeed's interface, recorded: (step, mode, batch size, KV tokens) per decode step."""

    steps: List[Tuple[int, DecodeMode, int, int]] = field(default_factory=list)
    interrupts: int = 0
    catchups: List[Tuple[int, int]] = field(default_factory=list)  # (launching step, tokens)
    catchup_times: List[float] = field(default_factory=list)
    prefills: List[int] = field(default_factory=list)  # tokens, by launch
    prefill_times: List[Tuple[int, float]] = field(default_factory=list)  # (key, draft ms)

    def step_done(self, step: int, mode: DecodeMode, batch_size: int, kv_tokens: int) -> None:
        self.steps.append((step, mode, batch_size, kv_tokens))

    def catchup_launched(self, step: int, tokens: int) -> None:
        self.catchups.append((step, tokens))

    def catchup_timed(self, ms: float) -> None:
        self.catchup_times.append(ms)

    def prefill_launched(self, tokens: int) -> int:
        self.prefills.append(tokens)
        return len(self.prefills) - 1

    def prefill_timed(self, key: int, draft_ms: float) -> None:
        self.prefill_times.append((key, draft_ms))

    def interrupt(self) -> None:
        self.interrupts += 1


class ImmediateTimer:
    """A StepTimer stand-in (CUDA events need a GPU): every step is timed at once, at
    ``ms_of(step)``."""

    def __init__(self, ms_of) -> None:
        self._ms_of, self._pending = ms_of, []

    def step_done(self, step, mode, batch_size, kv_tokens) -> None:
        self._pending.append(SimpleNamespace(step=step))

    def finished(self):
        done, self._pending = self._pending, []
        return iter([(p, self._ms_of(p.step)) for p in done])

    def interrupt(self) -> None:
        pass


class FakePrefillTimer(PrefillTimer):
    """PrefillTimer with its events recorded in order instead of recorded on a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: List[str] = []

    def harvest(self) -> None:
        self.calls.append("harvest")

    def start(self, num_tokens: int, key=None) -> SimpleNamespace:
        self.calls.append(f"start {num_tokens}" + ("" if key is None else f" key {key}"))
        return SimpleNamespace(target_end=None)

    def target_done(self, events: SimpleNamespace) -> None:
        self.calls.append("target done")
        events.target_end = f"target end {len(self.calls)}"

    def stop(self, events: SimpleNamespace) -> None:
        self.calls.append("stop")


class ObservedPolicy:
    """A policy with every observation it was asked about kept (a ``DecodePolicy``)."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.observations: List[StepObservation] = []
        self.decisions: list = []  # the automatic policy's decisions

    mode = property(lambda self: self.policy.mode)
    max_speculative_batch = property(lambda self: self.policy.max_speculative_batch)

    def decide(self, observation: StepObservation) -> DecodeMode:
        self.observations.append(observation)
        mode = self.policy.decide(observation)
        self.decisions.append(getattr(self.policy, "latest", None))
        return mode

    def report(self) -> dict:
        return self.policy.report()


def throughput_policy():
    """The automatic policy on a made-up calibration: a plain step costs about 10 ms whatever
    the batch, a speculative one 12 + 3 ms per request, and up to 4 tokens per request, so
    speculation pays at batch 1 and not at 32."""
    plain_buckets, spec_buckets = [1, 2, 4, 8, 16, 32, 64], [1, 2, 4, 8, 16, 32]
    return new_throughput_policy(
        ThroughputPolicyConfig(max_speculative_batch=32, max_running_requests=64,
                               kv_capacity_tokens=1_000_000, catchup_window=16),
        {PLAIN: plain_buckets, SPEC: spec_buckets},
        {PLAIN: {b: 10.0 + 0.05 * b for b in plain_buckets},
         SPEC: {b: 12.0 + 3.0 * b for b in spec_buckets}},
        {PLAIN: 0.0, SPEC: 0.0},
        catchup_prior_fixed_ms=1.0,
        max_acceptance=4.0,
    )


@pytest.fixture
def worker(monkeypatch):
    return new_worker(monkeypatch)


def new_worker(monkeypatch):
    """A DynamicEagleWorker without a GPU: EAGLE's own step and verify hook are recorded; the
    policy is the threshold policy with N = 2, M = 2, patience 1 and speculative graphs up to
    48, its observations kept in ``worker._policy.observations``."""
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
    monkeypatch.delenv(TRACE_ENV, raising=False)
    instance = object.__new__(DynamicEagleWorker)
    catchup = FakeCatchup()
    instance.counters = ModeCounters()
    instance.request_acceptance = RequestAcceptance()
    instance.queued = 0
    instance._selected = None
    use_policy(instance, ObservedPolicy(ThresholdPolicy(ThresholdPolicyConfig(2, 2, 1, 48))))
    instance._catchup = catchup
    instance._plain_step = FakePlainStep(catchup)
    instance._timings = FakeTimings()
    instance._decode_step = 0
    instance.prefill_timer = FakePrefillTimer()
    instance.early_first_token = EarlyFirstToken(False)  # test_early_first_token.py: turned on
    instance._draft_worker = None
    instance.plan_stream = None
    instance._last_step_plain = False
    instance.eagle_calls = eagle_calls
    instance.verify_calls = verify_calls
    return instance


def use_policy(worker, policy) -> None:
    """The worker's policy and its feed, traced as the environment says (as ``startup``
    builds them)."""
    learner = policy.policy if isinstance(policy, ObservedPolicy) else policy
    worker._policy, worker._feed = traced(policy, PolicyFeed(learner), load_config().trace_path)


class FakeReq:
    """Stands for sglang's Req: the fields the worker reads, weakly referenceable like the real
    one (each acceptance record holds a weak reference to its request)."""

    def __init__(self, slot: int, kv_committed_len: int, max_new_tokens: Optional[int],
                 output_len: int) -> None:
        self.req_pool_idx = slot
        self.kv_committed_len = kv_committed_len
        self.sampling_params = SimpleNamespace(max_new_tokens=max_new_tokens)
        self.output_ids = [7] * output_len


# The requests of one test by slot: sglang's Req objects persist across batches.
REQUESTS: dict = {}


@pytest.fixture(autouse=True)
def fresh_requests():
    REQUESTS.clear()


def request_in(slot: int, kv: int = KV_PER_REQUEST, max_new_tokens: Optional[int] = 128,
               output_len: int = 0) -> FakeReq:
    """The slot's request (made with these fields on first use)."""
    if slot not in REQUESTS:
        REQUESTS[slot] = FakeReq(slot, kv, max_new_tokens, output_len)
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


def prefill(worker, slots: Sequence[int], on_publish=None) -> None:
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, slots), on_publish)


# --------------------------------------------------------------------------- paths


def test_batch_sizes_1_40_1_take_each_path_and_catch_up(worker) -> None:
    decode(worker, [0])  # speculative
    prefill(worker, range(1, 40))
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
    kv_40 = 40 * KV_PER_REQUEST
    assert worker._timings.steps == [
        (1, SPEC, 1, KV_PER_REQUEST), (2, PLAIN, 40, kv_40), (3, PLAIN, 40, kv_40),
        (4, PLAIN, 40, kv_40), (5, SPEC, 1, KV_PER_REQUEST),
    ]
    # The prefill and the catch-up both break the run of step timings.
    assert worker._timings.interrupts == 2
    # The catch-up's GPU time was read back in the step that launched it.
    assert not worker._catchup.gpu_time.pending
    assert worker._catchup.gpu_time.total_ms == catchup_ms(3)


def test_prefill_forgets_what_plain_steps_left_to_catch_up(worker) -> None:
    decode(worker, [0, 1, 2])
    decode(worker, [0, 1, 2])  # plain
    prefill(worker, [1])  # slot 1 re-prefilled
    decode(worker, [0, 1])  # speculative: only slot 0 still misses draft KV
    assert worker._catchup.caught_up == [[0]]
    assert worker.counters.catchup_tokens == 2


def test_a_prefill_takes_eagles_path_in_either_mode(worker) -> None:
    prefill(worker, [0])
    decode(worker, [0, 1, 2])  # plain
    prefill(worker, [3, 4])
    worker.forward_batch_generation(make_batch(ForwardMode.MIXED, [5]))
    assert worker.eagle_calls == ["EXTEND", "EXTEND", "MIXED"]
    assert worker._plain_step.runs == [3]
    assert worker.counters.plain_steps == 1 and worker.counters.speculative_steps == 0


@pytest.mark.parametrize("scheduler_publishes", [True, False], ids=["overlap", "non-overlap"])
def test_a_prefill_is_timed_in_two_parts_and_published_once(worker, scheduler_publishes) -> None:
    published: List[str] = []
    prefill(worker, [1, 2], published.append if scheduler_publishes else None)
    assert worker.prefill_timer.calls == [
        "harvest", "start 20 key 0", "target extend", "target done", "draft extend", "stop"
    ]
    assert worker._timings.prefills == [20]  # its draft part is keyed for the catch-up bound
    assert published == (["new seq lens"] if scheduler_publishes else [])
    assert worker.counters.speculative_steps == worker.counters.plain_steps == 0


def test_decode_steps_are_not_timed_as_prefills(worker) -> None:
    """...but each reads the prefills that completed, so a burst's last prefill reaches the
    policy without waiting for another prefill."""
    decode(worker, [0])
    decode(worker, range(10))
    assert worker.prefill_timer.calls == ["harvest", "harvest"]


def test_idle_batches_take_eagles_path_and_break_timing(worker) -> None:
    worker.forward_batch_generation(make_batch(ForwardMode.IDLE, []))
    assert worker.eagle_calls == ["IDLE"]
    assert worker._timings.steps == [] and worker._timings.interrupts == 1
    assert worker.counters.speculative_steps == worker.counters.plain_steps == 0
    assert worker._policy.observations == []


def test_war_barrier_runner_follows_the_last_step(worker) -> None:
    target_runner, draft_runner = object(), object()
    worker._target_worker = SimpleNamespace(model_runner=target_runner)
    worker._draft_worker = SimpleNamespace(draft_runner=draft_runner)
    decode(worker, [0])
    assert not worker._last_step_plain and worker.war_fastpath_runner is draft_runner
    decode(worker, [0, 1, 2])
    assert worker._last_step_plain and worker.war_fastpath_runner is target_runner
    prefill(worker, [3])
    assert not worker._last_step_plain and worker.war_fastpath_runner is draft_runner


def test_mode_property_reports_the_latest_step(worker) -> None:
    assert worker.mode is SPEC  # before any decode step
    decode(worker, [0])
    assert worker.mode is SPEC
    decode(worker, range(10))
    assert worker.mode is PLAIN


class FakeClock:
    """``perf_counter`` for the worker: time moves only when a test's stand-in says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_host_time_splits_into_dispatch_and_each_modes_step(worker, monkeypatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr("sglang_dynamic_eagle.engine.worker.perf_counter", clock)

    def slow(seconds, call):
        def run(*args, **kwargs):
            clock.now += seconds
            return call(*args, **kwargs)
        return run

    catchup = worker._catchup

    def catch_up(draft_worker, batch, plan_stream):
        plan = FakeCatchup.catch_up(catchup, draft_worker, batch, plan_stream)
        clock.now += 0.001 if plan is not None else 0.0  # a catch-up's launches: the step's
        return plan

    monkeypatch.setattr(EAGLEWorkerV2, "forward_batch_generation",
                        slow(0.004, EAGLEWorkerV2.forward_batch_generation))
    monkeypatch.setattr(worker._plain_step, "run", slow(0.002, worker._plain_step.run))
    monkeypatch.setattr(catchup, "catch_up", catch_up)
    # The worker's own work: the policy, the acceptance records at launch and at the result.
    monkeypatch.setattr(worker._policy, "decide", slow(0.0001, worker._policy.decide))
    for name in ("launched", "verified"):
        monkeypatch.setattr(worker.request_acceptance, name,
                            slow(0.00002, getattr(worker.request_acceptance, name)))
    # ... and after the step's launch, its count.
    monkeypatch.setattr(worker.counters, "record_step", slow(0.00003, worker.counters.record_step))
    decode(worker, [0])  # speculative
    worker.on_verify_complete_cpu([2])  # its result
    decode(worker, range(10))  # plain
    decode(worker, range(10))  # plain
    prefill(worker, [11])  # EAGLE's path: not a decode step
    decode(worker, [0])  # speculative again, after catching slot 0 up
    assert worker._catchup.caught_up == [[0]]
    snapshot = worker.counters.snapshot()
    assert snapshot["host_speculative_step_ms"] == pytest.approx(4.0 + 1.0 + 4.0)
    assert snapshot["host_plain_step_ms"] == pytest.approx(4.0)
    # 4 decisions, 2 launches, 4 step counts and 1 result recorded
    assert snapshot["host_dispatch_ms"] == pytest.approx(0.4 + 0.04 + 0.12 + 0.02)
    # Before each mode's step was called: the decisions and the launches, not the counts or the result.
    assert snapshot["host_before_launch_ms"] == pytest.approx(0.4 + 0.04)


def select_and_run(worker, batch, queued: int = 0) -> None:
    """As the scheduler: the hook on its batch choice, then the worker's call."""
    worker.batch_selected(batch, queued)
    worker.forward_batch_generation(batch)


def test_a_decode_batch_is_decided_when_the_scheduler_selects_it(worker, monkeypatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr("sglang_dynamic_eagle.engine.worker.perf_counter", clock)

    def decide(observation):
        clock.now += 0.0001
        return ObservedPolicy.decide(worker._policy, observation)

    monkeypatch.setattr(worker._policy, "decide", decide)
    batch = make_batch(ForwardMode.DECODE, [0, 1])
    worker.batch_selected(batch, 3)
    [observation] = worker._policy.observations  # decided at the choice, with the queue
    assert (observation.batch_size, observation.queued, observation.step) == (2, 3, 1)
    worker.forward_batch_generation(batch)
    assert len(worker._policy.observations) == 1 and worker.counters.decided_at_batch_selection == 1
    assert worker._timings.steps == [(1, SPEC, 2, 2 * KV_PER_REQUEST)]
    snapshot = worker.counters.snapshot()
    # The decision's host time is the plugin's, but not in the window before the launch.
    assert snapshot["host_dispatch_ms"] == pytest.approx(0.1)
    assert snapshot["host_before_launch_ms"] == pytest.approx(0.0)


def test_other_batches_than_the_selected_decode_batch_are_decided_at_the_call(worker) -> None:
    for mode in (ForwardMode.EXTEND, ForwardMode.IDLE):  # nothing to decide at the choice
        worker.batch_selected(make_batch(mode, [0]), 0)
        worker.batch_selected(None, 0)
    assert worker._policy.observations == []
    worker.batch_selected(make_batch(ForwardMode.DECODE, [0, 1]), 0)
    other = make_batch(ForwardMode.DECODE, [0, 1])  # another batch object: decided again
    worker.forward_batch_generation(other)
    assert [o.step for o in worker._policy.observations] == [1, 2]
    assert worker.counters.decided_at_batch_selection == 0 and worker._timings.steps[-1][0] == 2
    selected = make_batch(ForwardMode.DECODE, [0, 1])
    worker.batch_selected(selected, 0)
    selected.reqs.pop()  # the same object with a request fewer: decided again
    worker.forward_batch_generation(selected)
    assert worker.counters.decided_at_batch_selection == 0 and len(worker._policy.observations) == 4
    decode(worker, [0])  # no hook call at all: decided at the call
    assert worker.counters.decided_at_batch_selection == 0 and len(worker._policy.observations) == 5
    # sglang's running batch is one object from step to step: a decision made for it at one
    # choice is not used after a later choice of another batch (or of none).
    running = make_batch(ForwardMode.DECODE, [0, 1])
    for later in (None, make_batch(ForwardMode.EXTEND, [2])):
        worker.batch_selected(running, 0)
        worker.batch_selected(later, 0)
        worker.forward_batch_generation(running)
    assert worker.counters.decided_at_batch_selection == 0 and len(worker._policy.observations) == 9
    # A choice is used by the next call only: after another batch's call, the same decode batch
    # reaching the worker without a hook call is decided again.
    worker.batch_selected(running, 0)
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [2]))
    worker.forward_batch_generation(running)
    assert worker.counters.decided_at_batch_selection == 0 and len(worker._policy.observations) == 11


def test_deciding_at_the_choice_gives_the_decisions_of_deciding_at_the_call(monkeypatch) -> None:
    """The scheduler processes a step's result after the next step's launch, so between its
    choice of a batch and the worker's call nothing the policy reads changes: over steps with
    results, a queue, a prefill and switches both give the same views and decisions."""
    # (slots, queue) per scheduler loop; a decode step's result is processed after the next launch.
    loops = [([0], 0), ([0, 1], 0), ([0, 1], 31), ([0, 1], 31), ([0, 1], 0), ("prefill", 0),
             ([0, 1, 2], 0), ([0, 1, 2], 0), ([1, 2], 0)]
    runs = []
    for at_choice in (False, True):
        REQUESTS.clear()
        request_in(2, max_new_tokens=20, output_len=18)
        worker = new_worker(monkeypatch)
        use_policy(worker, ObservedPolicy(throughput_policy()))
        pending, running = None, {}
        for slots, queued in loops:
            if slots == "prefill":
                batch = make_batch(ForwardMode.EXTEND, [2])
            else:  # one object while its requests stay, as sglang's running batch
                batch = running.setdefault(tuple(slots), make_batch(ForwardMode.DECODE, slots))
            if at_choice:
                select_and_run(worker, batch, queued)
            else:
                worker.queued = queued
                worker.forward_batch_generation(batch)
            if pending is not None:
                worker.on_verify_complete_cpu(pending)
            pending = None if slots == "prefill" else [len(slots) % 3] * len(slots)
        assert worker.counters.decided_at_batch_selection == (8 if at_choice else 0)
        runs.append(([(o.batch_size, o.kv_tokens, o.queued, o.step, list(o.verifies or ()),
                       list(o.accepted or ()), list(o.remaining or ()))
                      for o in worker._policy.observations],
                     [(d.mode, d.reason) for d in worker._policy.decisions],
                     worker._timings.steps))
    assert runs[0] == runs[1]
    modes = [mode for _, mode, _, _ in runs[0][2]]
    assert PLAIN in modes and SPEC in modes  # the sequence switched
    assert any(o[4] for o in runs[0][0])  # and the views held acceptance records


def test_grammar_batches_run_without_overlap() -> None:
    # The plain step never calls the scheduler's grammar barrier; sglang passes it only when
    # the algorithm supports grammar overlap, which EAGLE3 does and EAGLE3_DYNAMIC must not.
    assert DynamicEagleSpecAlgo.supports_grammar_overlap(object.__new__(DynamicEagleSpecAlgo)) is False


# --------------------------------------------------------------------------- what the policy sees


def test_the_observation_carries_kv_tokens_queue_and_remaining_tokens(worker) -> None:
    request_in(0, kv=120, max_new_tokens=50, output_len=10)
    request_in(1, kv=300, max_new_tokens=None)  # no limit
    request_in(2, kv=7, max_new_tokens=4, output_len=4)  # its last token: at least 1
    worker._feed.per_request_up_to = 48  # read the records, as for the throughput policy
    worker.queued = 5
    decode(worker, [0, 1, 2])
    [observation] = worker._policy.observations
    assert (observation.batch_size, observation.kv_tokens, observation.queued) == (3, 427, 5)
    assert list(observation.remaining) == [40, 1 << 30, 1]
    assert (list(observation.verifies), list(observation.accepted)) == ([0, 0, 0], [0, 0, 0])
    assert worker._timings.steps == [(1, PLAIN, 3, 427)]


def test_decode_steps_are_numbered_and_every_record_carries_the_number(worker) -> None:
    decode(worker, [0])
    prefill(worker, [1])
    worker.forward_batch_generation(make_batch(ForwardMode.IDLE, []))
    decode(worker, [0, 1, 2])
    decode(worker, [0, 1])
    assert [o.step for o in worker._policy.observations] == [1, 2, 3]
    assert [s[0] for s in worker._timings.steps] == [1, 2, 3]
    verified = []
    for result in ([1], [0, 0, 0], [0, 0]):
        worker.on_verify_complete_cpu(result)
        verified.append(worker.counters.verified_step)
    assert verified == [1, 2, 3]


def test_per_request_acceptance_comes_from_speculative_results_only(worker) -> None:
    worker._feed.per_request_up_to = 48  # read the records, as for the throughput policy
    decode(worker, [0])  # speculative
    decode(worker, [0, 1])  # speculative (N = 2), launched before the first result
    decode(worker, [0, 1, 2])  # plain
    worker.on_verify_complete_cpu([2])  # slot 0: 1 verify, 3 tokens
    worker.on_verify_complete_cpu([1, 0])  # slot 0: 2 verifies, 5 tokens; slot 1: 1, 1
    worker.on_verify_complete_cpu([3, 3, 3])  # the plain step's result: no acceptance
    decode(worker, [0, 1, 2])
    observation = worker._policy.observations[-1]
    assert list(observation.verifies) == [2, 1, 0]
    assert list(observation.accepted) == [5, 1, 0]
    assert worker.counters.speculative_verified_requests == 3
    assert worker.counters.speculative_accepted_tokens == 3 + 3
    assert worker.verify_calls == [1, 2, 3]  # EAGLE's own hook still sees every result
    assert worker.request_acceptance.mismatched == 0


# --------------------------------------------------------------------------- the throughput policy


def test_the_threshold_policy_is_not_handed_per_request_records(worker) -> None:
    request_in(0, kv=120, max_new_tokens=50, output_len=10)
    decode(worker, [0])
    [observation] = worker._policy.observations
    assert observation.kv_tokens == 120 and not observation.remaining


def test_the_queue_and_the_remaining_tokens_reach_the_throughput_policy(worker) -> None:
    """At batch 1 speculation pays; with 31 requests queued the batch heads for 32, where it
    does not (a burst leaves speculation at its first step); and a request with one token
    left gains nothing from speculating."""
    use_policy(worker, ObservedPolicy(throughput_policy()))
    decode(worker, [0])
    worker.queued = 31
    decode(worker, [0])
    worker.queued = 0
    decode(worker, [0])  # back to speculation, after a catch-up of slot 0's plain step
    request_in(1, max_new_tokens=20, output_len=19)
    decode(worker, [1])
    assert [o.queued for o in worker._policy.observations] == [0, 31, 0, 0]
    assert [s[1] for s in worker._timings.steps] == [SPEC, PLAIN, SPEC, PLAIN]
    assert worker._catchup.caught_up == [[0]]
    reasons = [d.reason for d in worker._policy.decisions]
    assert reasons == ["stay", "predicted gain", "predicted gain", "predicted gain"]


@pytest.mark.parametrize("trace", [False, True], ids=["untraced", "traced"])
def test_verifies_catchups_and_step_times_reach_the_throughput_policy(worker, trace, tmp_path,
                                                                      monkeypatch) -> None:
    if trace:  # the traced feed must pass everything on, and report as the feed does
        monkeypatch.setenv(TRACE_ENV, str(tmp_path / "trace.jsonl"))
    policy = throughput_policy()
    use_policy(worker, policy)
    catchups = []
    add_catchup = policy.add_catchup
    policy.add_catchup = lambda tokens, ms: catchups.append((tokens, ms)) or add_catchup(tokens, ms)
    worker._timings = TimingFeed(list, worker._feed.step_time, feed_steps=2,
                                 catchup_sink=worker._feed.catchup)
    worker._timings._timer = ImmediateTimer(lambda step: 10.0 + step)

    decode(worker, [0])  # step 1: speculative
    worker.queued = 31
    decode(worker, [0])  # step 2: plain (the burst)
    worker.on_verify_complete_cpu([2])  # step 1's result: 3 tokens
    first = policy.acceptance.server_mean
    assert first is not None and 3.0 < first < policy.acceptance.max_acceptance  # shrunk to the prior
    worker.on_verify_complete_cpu([3])  # step 2's (plain) result: not an acceptance
    assert policy.acceptance.server_mean == first
    worker.queued = 0
    decode(worker, [0])  # step 3: speculative, after catching up slot 0's one plain position
    decode(worker, [0])  # step 4: steps [0, 2) are handed over
    decode(worker, [0])
    assert catchups == []  # the catch-up of step 3 travels with that step's window
    decode(worker, [0])  # step 6: steps [2, 4)
    assert catchups == [(1, catchup_ms(1))]
    # /server_info lists the decisions whose time came back, then the latest one.
    measured = {d["step"]: d["measured_ms"] for d in worker._feed.report()["recent_decisions"]}
    assert measured == {1: 11.0, 2: 12.0, 3: 13.0, 6: None}


# --------------------------------------------------------------------------- the trace


def test_the_trace_records_steps_times_verifies_and_catchups(worker, tmp_path, monkeypatch
                                                              ) -> None:
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(TRACE_ENV, str(path))
    use_policy(worker, worker._policy)
    decode(worker, [0])  # step 1: speculative
    worker.queued = 4
    decode(worker, [0, 1, 2])  # step 2: plain
    worker.on_verify_complete_cpu([2])  # step 1's result: 3 tokens
    worker.on_verify_complete_cpu([1, 1, 1])  # step 2's: plain, not traced
    worker._feed.step_time(2, PLAIN, 3, 3 * KV_PER_REQUEST, 4.5)
    worker.queued = 0
    decode(worker, [0])  # step 3: speculative, after catching up one position
    worker._feed.catchup(1, catchup_ms(1))  # as the timing feed hands it over
    records = [json.loads(line) for line in path.read_text().splitlines()]
    hosts = [r for r in records if r["k"] == "host"]
    records = [r for r in records if r["k"] != "host"]
    assert [r["k"] for r in records] == ["step", "step", "verify", "time", "step", "catchup"]
    assert records[1] == {**records[1], "step": 2, "mode": "plain", "b": 3, "kv": 300, "q": 4}
    assert records[2] == {"k": "verify", "step": 1, "tokens": 3, "requests": 1,
                          "first_requests": 1, "first_tokens": 3}
    assert records[5] == {**records[5], "tokens": 1, "ms": catchup_ms(1)}
    # After each decode step, its host time: the worker's own work and the mode's step call.
    assert [h["step"] for h in hosts] == [1, 2, 3]
    assert all(h["us"] >= 0 and h["step_us"] >= 0 for h in hosts)
    assert [s.host_us for s in load_trace(path)] == [(h["us"], h["step_us"]) for h in hosts]
    assert load_trace(path) == [
        TraceStep(batch=1, kv_tokens=100, queued=0, mode=SPEC, spec_tokens=3),
        TraceStep(batch=3, kv_tokens=300, queued=4, mode=PLAIN, ms=4.5),
        TraceStep(batch=1, kv_tokens=100, queued=0, mode=SPEC),
    ]


def test_without_the_variable_nothing_is_traced(worker, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_config().trace_path is None and not isinstance(worker._feed, TracedFeed)
    decode(worker, [0])
    worker.on_verify_complete_cpu([1])
    assert list(tmp_path.iterdir()) == []


def test_acceptance_records_go_with_their_requests_and_never_match_another_object() -> None:
    """Records are keyed by the request's id: one is dropped when sglang lets its request go,
    and an object under an id whose record belongs to another never reads it."""
    acceptance = RequestAcceptance()
    first, second = FakeReq(0, 10, 100, 0), FakeReq(1, 10, 100, 0)
    acceptance.launched([first, second])
    acceptance.verified([2, 0])
    acceptance.launched([first])
    acceptance.verified([1])
    assert acceptance.of([first, second]) == ([2, 1], [5, 1])
    del second
    assert len(acceptance) == 1  # the callback dropped the finished request's record
    stranger = FakeReq(2, 10, 100, 0)
    acceptance._record[id(stranger)] = acceptance._record.pop(id(first))  # an id reused
    assert acceptance.of([stranger]) == ([0], [0])
    acceptance.launched([stranger])
    acceptance.verified([3])
    assert acceptance.of([stranger, first]) == ([1, 0], [4, 0])
