"""The parts of step_costs that run without a GPU: which graphs start-up calibration may replay,
the tensor-parallel reducer for one rank, and how timed steps reach the policy (identical on
every rank)."""

from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace

from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

from sglang_dynamic_eagle.engine import step_costs
from sglang_dynamic_eagle.policy import DecodeMode


class _NotFullBackend:
    """Stands for sglang's breakable or piecewise graph backends: replaying one would fail."""

    def replay_session(self):
        raise AssertionError("a graph that is not a full CUDA graph must not be replayed")

    def replay(self, key, forward_batch):
        raise AssertionError("a graph that is not a full CUDA graph must not be replayed")


def test_calibration_skips_graphs_that_are_not_full_cuda_graphs() -> None:
    runner = SimpleNamespace(backend=_NotFullBackend(), capture_bs=[1, 2, 4])
    table = step_costs.calibrate(
        {DecodeMode.PLAIN: [runner], DecodeMode.SPECULATIVE: []},
        {DecodeMode.PLAIN: [1, 2, 4], DecodeMode.SPECULATIVE: [1]},
    )
    assert table == {DecodeMode.PLAIN: {}, DecodeMode.SPECULATIVE: {}}


class _RefusingFullBackend(FullCudaGraphBackend):
    """A full CUDA graph backend that fails any replay."""

    def __init__(self) -> None:
        pass

    @contextlib.contextmanager
    def replay_session(self):
        yield

    def replay(self, key, forward_batch, **kwargs):
        raise AssertionError("replayed without the metadata sglang prepares for a replay")


def _recording_runner():
    return SimpleNamespace(backend=_RefusingFullBackend(), capture_bs=[1, 2, 4],
                           _make_graph_key=lambda size: size)


def test_plain_graphs_are_priced_from_the_times_recorded_at_their_capture(monkeypatch) -> None:
    """A plain runner that timed each graph at its capture is never replayed again at start-up
    (on fa3 such a replay reads another batch size's scheduler metadata): its buckets take the
    recorded time of the smallest captured graph that fits, and a size it did not time stays
    uncalibrated."""
    monkeypatch.setattr(step_costs.torch.cuda, "synchronize", lambda: None)
    runner = _recording_runner()
    table = step_costs.calibrate(
        {DecodeMode.PLAIN: [runner], DecodeMode.SPECULATIVE: []},
        {DecodeMode.PLAIN: [1, 2, 3, 4], DecodeMode.SPECULATIVE: [1]},
        recorded={DecodeMode.PLAIN: {1: 5.0, 4: 6.0}})
    assert table[DecodeMode.PLAIN] == {1: 5.0, 3: 6.0, 4: 6.0}


def test_a_runner_without_recorded_times_would_be_replayed(monkeypatch) -> None:
    """The negative control of the test above: the same runner without recorded times goes to
    a replay (the refusing backend raises, calibration logs it and leaves the mode empty)."""
    monkeypatch.setattr(step_costs.torch.cuda, "synchronize", lambda: None)
    runner = _recording_runner()
    table = step_costs.calibrate(
        {DecodeMode.PLAIN: [runner], DecodeMode.SPECULATIVE: []},
        {DecodeMode.PLAIN: [1, 2], DecodeMode.SPECULATIVE: [1]})
    assert table[DecodeMode.PLAIN] == {}


def test_only_full_cuda_graph_backends_count_as_replayable() -> None:
    full = SimpleNamespace(backend=object.__new__(FullCudaGraphBackend))
    assert step_costs.replays_whole_graphs(full)
    assert not step_costs.replays_whole_graphs(SimpleNamespace(backend=_NotFullBackend()))


def test_graph_keys_by_batch_size_or_by_tokens_for_ragged_verify() -> None:
    runner = SimpleNamespace(_make_graph_key=lambda size: ("key", size), captured_req_width=4)
    assert step_costs._graph_key(runner, 8) == ("key", 8)
    runner.ragged_verify_mode = True
    assert step_costs._graph_key(runner, 8) == ("key", 32)


def test_one_rank_reduces_to_a_copy() -> None:
    reduce = step_costs.tp_max_reducer(SimpleNamespace(world_size=1))
    values = [1.0, -2.0]
    assert reduce(values) == values and reduce(values) is not values
    assert step_costs.tp_max_reducer(None)([3.0]) == [3.0]


class _FakeTimer:
    """A StepTimer stand-in (CUDA events need a GPU): every step is timed at once, at
    ``ms_of(step)``; ``lagging`` steps are not complete yet on this rank."""

    def __init__(self, ms_of, lagging=()) -> None:
        self._ms_of, self._lagging, self._pending = ms_of, set(lagging), []

    def step_done(self, step, mode, batch_size, kv_tokens) -> None:
        self._pending.append(SimpleNamespace(step=step, mode=mode, batch_size=batch_size,
                                             kv_tokens=kv_tokens))

    def finished(self):
        done = [p for p in self._pending if p.step not in self._lagging]
        self._pending = [p for p in self._pending if p.step in self._lagging]
        return iter([(p, self._ms_of(p.step)) for p in done])

    def interrupt(self) -> None:
        pass


def _feed(ms_of, reduce_max=list, lagging=()):
    received = []
    feed = step_costs.TimingFeed(reduce_max, lambda *args: received.append(args), feed_steps=4)
    feed._timer = _FakeTimer(ms_of, lagging)
    return feed, received


def test_timings_reach_the_policy_one_feed_period_late_with_their_batch() -> None:
    feed, received = _feed(lambda step: float(step))
    for step in range(1, 13):
        feed.step_done(step, DecodeMode.PLAIN, batch_size=step % 3 + 1, kv_tokens=10 * step)
    # Feeds at steps 4, 8, 12 cover [s - 8, s - 4): steps 1-3 at 8, 4-7 at 12.
    assert [r[0] for r in received] == [1, 2, 3, 4, 5, 6, 7]
    assert received[0] == (1, DecodeMode.PLAIN, 2, 10, 1.0)


class _AllReduceMax:
    """An element-wise MAX all-reduce between threads (one per emulated rank)."""

    def __init__(self, ranks: int) -> None:
        self._barrier = threading.Barrier(ranks)
        self._vectors = {}

    def for_rank(self, rank: int):
        def reduce(vector):
            self._vectors[rank] = list(vector)
            self._barrier.wait()
            result = [max(values) for values in zip(*self._vectors.values())]
            self._barrier.wait()
            return result
        return reduce


def _run_ranks(timers, steps=24, catchup_ms=None, catchups=None, prefill_ms=None,
               prefills=None):
    """Ranks in threads; ``catchup_ms[rank](step)``: that rank's GPU time of a catch-up launched
    at ``step`` (catch-ups at steps 3 and 9, timed one step later, 10 tokens each);
    ``prefill_ms[rank](key)``: that rank's draft time of prefill ``key`` (None: not timed
    there), prefills of 100 * (key + 1) tokens launched before steps 2, 5, 5 and 21, timed
    a step later."""
    all_reduce = _AllReduceMax(len(timers))
    received = [[] for _ in timers]
    feeds = []
    for rank, timer in enumerate(timers):
        feed = step_costs.TimingFeed(
            all_reduce.for_rank(rank), lambda *args, rank=rank: received[rank].append(args),
            feed_steps=4, catchup_sink=None if catchups is None
            else lambda tokens, ms, rank=rank: catchups[rank].append((tokens, ms)),
            prefill_sink=None if prefills is None
            else lambda tokens, ms, rank=rank: prefills[rank].append((tokens, ms)))
        feed._timer = timer
        feed.rank = rank
        feeds.append(feed)

    def run(feed):
        launched = []
        for step in range(1, steps + 1):
            for key in launched:
                ms = prefill_ms[feed.rank](key)
                if ms is not None:
                    feed.prefill_timed(key, ms)
            launched = []
            if prefill_ms is not None:
                for _ in range({2: 1, 5: 2, 21: 1}.get(step, 0)):
                    launched.append(feed.prefill_launched(100 * (feed._prefills + 1)))
            if catchup_ms is not None and step in (3, 9):
                feed.catchup_launched(step, 10)
            if catchup_ms is not None and step in (4, 10):
                feed.catchup_timed(catchup_ms[feed.rank](step - 1))
            feed.step_done(step, DecodeMode.SPECULATIVE, 4, 100 * step)

    threads = [threading.Thread(target=run, args=(feed,)) for feed in feeds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return received


def test_ranks_hand_the_policy_identical_timings() -> None:
    """Two ranks time the same steps differently, and one has some steps still pending: after
    the all-reduce both hand the policy the same steps at the slower rank's time."""
    received = _run_ranks([_FakeTimer(lambda step: 10.0 + step),
                           _FakeTimer(lambda step: 30.0 - step, lagging={2, 6})])
    assert received[0] == received[1]
    times = {args[0]: args[4] for args in received[0]}
    assert times[1] == 29.0 and times[12] == 22.0  # the slower rank's
    assert times[2] == 12.0  # timed on one rank only: that rank's time


def test_identical_timings_control_without_the_all_reduce() -> None:
    """The negative control: ranks that do not reduce hand the policy different times."""
    a, b = _FakeTimer(lambda step: 10.0 + step), _FakeTimer(lambda step: 30.0 - step)
    received = [[], []]
    for rank, timer in enumerate((a, b)):
        feed = step_costs.TimingFeed(list, lambda *args, rank=rank: received[rank].append(args),
                                     feed_steps=4)
        feed._timer = timer
        for step in range(1, 25):
            feed.step_done(step, DecodeMode.SPECULATIVE, 4, 100 * step)
    assert received[0] != received[1]


def test_ranks_hand_the_policy_identical_catchup_costs() -> None:
    """A catch-up's GPU time differs by rank; the policy gets the slower one on every rank, in
    the same feed."""
    catchups = [[], []]
    _run_ranks([_FakeTimer(lambda step: 10.0), _FakeTimer(lambda step: 10.0)],
               catchup_ms=[lambda step: 2.0 + step, lambda step: 5.0 - step / 10],
               catchups=catchups)
    assert catchups[0] == catchups[1] == [(10, 5.0), (10, 11.0)]


def test_ranks_hand_the_policy_identical_draft_prefill_costs() -> None:
    """A prefill's draft time differs by rank, and one rank has not timed one of them: every
    rank hands the policy the same prefills at the slower rank's time, each once, and none
    launched since the previous feed (its events may not have completed on every rank)."""
    prefills = [[], []]
    _run_ranks([_FakeTimer(lambda step: 10.0), _FakeTimer(lambda step: 10.0)],
               prefill_ms=[lambda key: 1.0 + key, lambda key: None if key == 1 else 3.0],
               prefills=prefills)
    assert prefills[0] == prefills[1] == [(100, 3.0), (200, 2.0), (300, 3.0)]


def test_prefill_keys_are_bounded_without_decode_steps() -> None:
    """A load of prefills that never decodes (one-token requests) keeps at most PREFILL_KEEP."""
    feed = step_costs.TimingFeed(list, lambda *args: None, prefill_sink=lambda *args: None)
    for key in range(3 * step_costs.PREFILL_KEEP):
        assert feed.prefill_launched(10) == key
        feed.prefill_timed(key, 1.0)
    assert len(feed._prefill_tokens) == len(feed._prefill_ms) == step_costs.PREFILL_KEEP


def test_a_plain_graph_is_timed_once_right_after_its_capture(monkeypatch) -> None:
    """Only the one graph per batch size the calibration reads is timed at capture: not a
    LoRA variant, a per-stream copy, a graph that is not a full CUDA graph, nor any graph under
    tensor parallelism (its all-reduce buffers are registered after the capture context); a
    failed timing leaves every size to online measurement and the capture going."""
    from sglang.srt.model_executor.runner import DecodeCudaGraphRunner

    from sglang_dynamic_eagle.engine import plain_decode_graphs

    captured, timed = [], []
    monkeypatch.setattr(DecodeCudaGraphRunner, "capture_one_shape",
                        lambda self, size, forward, stream_idx=None, variant_label=None:
                        captured.append(size))

    def fake_time(runners, sizes, repeats):
        if sizes[0] == 3:
            raise RuntimeError("timing failed")
        timed.append(sizes[0])
        return 2.5

    monkeypatch.setattr(plain_decode_graphs, "time_replays", fake_time)

    def runner(world_size=1):
        made = object.__new__(plain_decode_graphs.PlainDecodeCudaGraphRunner)
        made.replay_ms, made._timing_failed = {}, False
        made.backend = _RefusingFullBackend()
        made.model_runner = SimpleNamespace(tp_group=SimpleNamespace(world_size=world_size))
        return made

    one = runner()
    one.capture_one_shape(8, None)
    one.capture_one_shape(4, None, None, "lora")
    one.capture_one_shape(2, None, 1, None)
    one.backend = _NotFullBackend()
    one.capture_one_shape(1, None)
    assert captured == [8, 4, 2, 1] and timed == [8] and one.replay_ms == {8: 2.5}
    two_gpus = runner(world_size=2)
    two_gpus.capture_one_shape(8, None)
    assert timed == [8] and two_gpus.replay_ms == {}
    failing = runner()
    for size in (8, 3, 2):
        failing.capture_one_shape(size, None)
    assert captured[-3:] == [8, 3, 2] and failing.replay_ms == {} and timed == [8, 8]


def test_a_size_timed_dearer_than_a_larger_one_takes_the_larger_ones_time() -> None:
    """The plain graphs of the 8B-shaped suite's automatic server, timed while three other
    servers captured their graphs (H200, 2026-12-05): batch 8 read 8.48 ms between 4.55 ms at 4
    and 4.65 ms at 12, and the policy speculated at batch 8 with acceptance 1.0."""
    timed = {1: 4.51, 2: 4.57, 4: 4.55, 8: 8.48, 12: 4.65, 16: 4.83, 64: 6.36, 72: 12.21, 80: 9.26,
             128: 8.34}
    capped = step_costs.no_dearer_than_larger(timed)
    assert capped == {1: 4.51, 2: 4.55, 4: 4.55, 8: 4.65, 12: 4.65, 16: 4.83, 64: 6.36, 72: 8.34,
                      80: 8.34, 128: 8.34}
    assert list(capped) == sorted(timed)
    # Negative control: the table as timed has a size dearer than a larger one.
    assert any(timed[a] > timed[b] for a in timed for b in timed if a < b)
    assert step_costs.no_dearer_than_larger({}) == {}


def test_calibration_caps_each_size_by_the_larger_ones(monkeypatch) -> None:
    monkeypatch.setattr(step_costs.torch.cuda, "synchronize", lambda: None)
    runner = _recording_runner()
    table = step_costs.calibrate(
        {DecodeMode.PLAIN: [runner], DecodeMode.SPECULATIVE: []},
        {DecodeMode.PLAIN: [1, 2, 4], DecodeMode.SPECULATIVE: [1]},
        recorded={DecodeMode.PLAIN: {1: 5.0, 2: 9.0, 4: 6.0}})
    assert table[DecodeMode.PLAIN] == {1: 5.0, 2: 6.0, 4: 6.0}


def test_the_capped_calibration_keeps_the_policy_plain_at_acceptance_one() -> None:
    """The 8B-shaped suite's automatic server (fa3, H200, 2026-12-05) at acceptance 1.0, in
    waves of 8 requests draining to 2, replayed on CPU with its start-up table as logged (plain
    8.48 ms at batch 8, speculative 10.38 ms at 1, both timed while other servers captured their
    graphs) and capped; the steps themselves cost what the other sizes say (plain 4.5 ms,
    speculative 6.2 ms with its host work). As timed, the policy speculates on hundreds of
    steps, as the server did; capped, only while it learns the acceptance and on its probes."""
    import numpy as np

    from sglang_dynamic_eagle.policy.replay import World, simulate
    from sglang_dynamic_eagle.policy.throughput import ThroughputPolicyConfig, new_throughput_policy

    sizes = [1, 2, 4, 8, 12, 16, 24, 32]
    plain = {1: 4.51, 2: 4.57, 4: 4.55, 8: 8.48, 12: 4.65, 16: 4.83, 24: 4.89, 32: 4.98}
    spec = {1: 10.38, 2: 5.39, 4: 5.27, 8: 5.39, 12: 5.51, 16: 5.55, 24: 5.86, 32: 5.96}
    batch = np.array(([8] * 20 + [6] * 10 + [4] * 10 + [2] * 10) * 40)
    world = World(batch, 300 * batch, 0 * batch, 4.5 + 0.01 * batch, 6.2 + 0.02 * batch,
                  1.0 * batch, 1.5, 0.0008)
    kv_ms = {DecodeMode.PLAIN: 131072 / 4e9, DecodeMode.SPECULATIVE: 147456 / 4e9}

    def speculative_steps(plain_ms, spec_ms) -> int:
        config = ThroughputPolicyConfig(max_speculative_batch=32, max_running_requests=256,
                                        kv_capacity_tokens=49152, catchup_window=256)
        policy = new_throughput_policy(
            config, {DecodeMode.PLAIN: sizes, DecodeMode.SPECULATIVE: sizes},
            {DecodeMode.PLAIN: plain_ms, DecodeMode.SPECULATIVE: spec_ms}, kv_ms,
            catchup_prior_fixed_ms=6.2, max_acceptance=4.0)
        return simulate(policy, world, 256).speculative_steps

    assert speculative_steps(plain, spec) > 0.1 * len(batch)  # as timed: the fault
    capped = speculative_steps(step_costs.no_dearer_than_larger(plain),
                               step_costs.no_dearer_than_larger(spec))
    assert capped < 0.03 * len(batch)
