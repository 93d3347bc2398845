"""The early first token on CPU: streams and events are stand-ins that log every GPU operation
with the stream it was issued on; a stand-in scheduler runs a prefill and a decode step in the
order of sglang 0.5.17's overlap ``run_batch`` and ``_apply_war_barrier``, and
:func:`violations` checks the orderings the module's docstring lists. Each check fails on a
variant broken in its way."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace
from typing import List, Optional

import pytest
from sglang.srt.managers.overlap_utils import RelayPayload

from sglang_dynamic_eagle.config import EARLY_FIRST_TOKEN_ENV, load_config
from sglang_dynamic_eagle.engine.early_first_token import EarlyFirstToken
from sglang_dynamic_eagle.sglang_compat.startup_errors import StartupError


class FakeStream:
    def __init__(self, name: str, log: list) -> None:
        self.name, self._log = name, log

    def wait_stream(self, other: "FakeStream") -> None:
        self._log.append((self.name, f"wait {other.name}"))


class FakeStreams:
    """The CudaStreams interface over a log of (stream, operation)."""

    def __init__(self) -> None:
        self.log: List[tuple] = []
        self.stack = [FakeStream("forward", self.log)]

    def new_stream(self) -> FakeStream:
        return FakeStream("side", self.log)

    def current(self) -> FakeStream:
        return self.stack[-1]

    @contextmanager
    def use(self, stream):
        self.stack.append(stream)
        try:
            yield
        finally:
            self.stack.pop()

    def mark(self, stream) -> str:
        event = f"event {len(self.log)}"
        self.log.append((stream.name, event))
        return event

    def op(self, what: str) -> None:
        self.log.append((self.current().name, what))


class FakeFutureMap:
    def __init__(self, streams: FakeStreams) -> None:
        self.streams = streams

    def publish(self, new_seq_lens) -> None:
        self.streams.op("publish")

    def stash(self, future_indices, payload) -> None:
        self.streams.op(f"stash {future_indices}")


def scheduler_for(streams: FakeStreams, **overrides) -> SimpleNamespace:
    fields = dict(enable_overlap=True, _war_barrier_enabled=True,
                  future_map=FakeFutureMap(streams))
    fields.update(overrides)
    return SimpleNamespace(**fields)


def run_batch(streams: FakeStreams, scheduler, early: EarlyFirstToken, prefill: bool) -> None:
    """One launch as sglang's overlap loop does it, on the forward stream: the worker's forward
    (for a prefill: target extend, publish, draft extend; else one decode step), the stash of
    the draft input, the copy stream's wait for the forward stream; then the barrier."""
    draft_input = SimpleNamespace(topk_p=object(), bonus_tokens=object(), topk_index=None,
                                  hidden_states=None, dsa_topk_indices=None)
    with streams.use(streams.stack[0]):
        if prefill:
            with early.prefill(scheduler.future_map.publish) as publish:
                streams.op("target extend")
                publish("seq lens")
                streams.op("draft extend")
                early.launched(SimpleNamespace(next_draft_input=draft_input))
        else:
            streams.op("decode step")
        scheduler.future_map.stash("prefill" if prefill else "decode",
                                   RelayPayload.from_draft_input(draft_input))
        streams.op("copy stream waits")
    event = early.war_fastpath_read_done_event
    early.war_fastpath_read_done_event = None  # as Scheduler._apply_war_barrier does
    streams.log.append(("schedule", f"barrier {event or 'forward stream'}"))


def violations(log: List[tuple]) -> List[str]:
    """The orderings of the module docstring that ``log`` (one prefill, then one decode step)
    breaks."""
    where = {op: (index, stream) for index, (stream, op) in enumerate(log)}
    index = {op: i for op, (i, _) in where.items()}
    stream = {op: s for op, (_, s) in where.items()}
    found = []
    if stream["target extend"] != "forward" or stream["publish"] != "forward":
        found.append("the target extend and the publish run on the forward stream")
    if stream["draft extend"] != "side":
        found.append("the draft extend runs on the side stream")
    if not index["publish"] < index.get("wait forward", -1) < index["draft extend"]:
        found.append("the side stream waits for the forward stream after the publish, before "
                     "the draft extend")
    if stream["stash prefill"] != "side" or index["stash prefill"] < index["draft extend"]:
        found.append("the prefill's stash runs on the side stream after the draft extend")
    barrier = [op for _, op in log if op.startswith("barrier")][0]
    event = barrier.split(" ", 1)[1]
    if stream.get(event) != "side" or index[event] < index["stash prefill"]:
        found.append("the barrier after the prefill waits for the side stream's end, after "
                     "the stash")
    copy = [i for i, (_, op) in enumerate(log) if op == "copy stream waits"][0]
    if any(s == "forward" and op == "draft extend" for s, op in log[:copy]):
        found.append("the first token's copy does not wait for the draft extend")
    if stream["stash decode"] != "forward" or stream["decode step"] != "forward":
        found.append("a decode step and its stash stay on the forward stream")
    if log[-1] != ("schedule", "barrier forward stream"):
        found.append("the barrier after a decode step is sglang's own")
    return found


def run_prefill_then_decode(early: EarlyFirstToken, streams: FakeStreams, scheduler) -> list:
    early.attach(scheduler)
    run_batch(streams, scheduler, early, prefill=True)
    run_batch(streams, scheduler, early, prefill=False)
    return streams.log


def test_the_draft_extend_and_its_stash_move_to_the_side_stream_behind_the_barrier() -> None:
    streams = FakeStreams()
    early = EarlyFirstToken(True, streams=streams, coarse_barrier=lambda: False)
    log = run_prefill_then_decode(early, streams, scheduler_for(streams))
    assert early.active and violations(log) == []
    assert [s.name for s in streams.stack] == ["forward"]  # back on the forward stream


class NoStashMove(EarlyFirstToken):
    def launched(self, result) -> None:
        pass


class NoWait(EarlyFirstToken):
    def attach(self, scheduler) -> None:
        super().attach(scheduler)
        if self.active:
            self._stream.wait_stream = lambda other: None


class EventBeforeStash(EarlyFirstToken):
    def _stash(self, original, future_indices, payload) -> None:
        self._stash_for = None
        original(future_indices, payload)


@pytest.mark.parametrize("broken, rule", [
    (NoStashMove, "the prefill's stash runs on the side stream after the draft extend"),
    (NoWait, "the side stream waits for the forward stream after the publish, before the "
     "draft extend"),
    (EventBeforeStash, "the prefill's stash runs on the side stream after the draft extend"),
])
def test_each_ordering_fails_on_a_variant_broken_in_its_way(broken, rule) -> None:
    streams = FakeStreams()
    early = broken(True, streams=streams, coarse_barrier=lambda: False)
    assert rule in violations(run_prefill_then_decode(early, streams, scheduler_for(streams)))


def test_a_barrier_without_the_side_streams_end_is_found() -> None:
    streams = FakeStreams()
    early = EarlyFirstToken(True, streams=streams, coarse_barrier=lambda: False)
    log = run_prefill_then_decode(early, streams, scheduler_for(streams))
    first_barrier = next(i for i, (s, _) in enumerate(log) if s == "schedule")
    log[first_barrier] = ("schedule", "barrier forward stream")
    assert any("side stream's end" in v for v in violations(log))


SGLANG_ORDER = [("forward", "target extend"), ("forward", "publish"), ("forward", "draft extend"),
                ("forward", "stash prefill"), ("forward", "copy stream waits"),
                ("schedule", "barrier forward stream"), ("forward", "decode step"),
                ("forward", "stash decode"), ("forward", "copy stream waits"),
                ("schedule", "barrier forward stream")]


@pytest.mark.parametrize("why, enabled, tp_size, coarse, overrides", [
    ("SGLANG_DYNAMIC_EAGLE_EARLY_FIRST_TOKEN=0", False, 1, False, {}),
    ("tensor parallelism", True, 2, False, {}),
    ("no overlap scheduler", True, 1, False, {"enable_overlap": False}),
    ("the scheduler has no future map", True, 1, False, {"future_map": None}),
    ("sglang's barrier after a launch is off", True, 1, False, {"_war_barrier_enabled": False}),
    ("SGLANG_FORCE_COARSE_WAR_BARRIER is set", True, 1, True, {}),
    ("sglang's unified memory pool (its forward-done event misses the side stream)", True,
     1, False, {"enable_unified_memory": True}),
])
def test_where_it_cannot_keep_its_orderings_sglangs_order_stays(why, enabled, tp_size, coarse,
                                                                 overrides) -> None:
    streams = FakeStreams()
    early = EarlyFirstToken(enabled, tp_size, streams=streams, coarse_barrier=lambda: coarse)
    early.attach(scheduler_for(streams, **overrides))
    log = run_prefill_then_decode(early, streams, scheduler_for(streams))  # attached already
    assert not early.active and early.why_off == why
    assert early.report() == {"early_first_token": False, "early_first_token_off": why}
    assert log == SGLANG_ORDER


def test_without_a_publish_callback_the_prefill_stays_on_the_forward_stream() -> None:
    streams = FakeStreams()
    early = EarlyFirstToken(True, streams=streams, coarse_barrier=lambda: False)
    early.attach(scheduler_for(streams))
    with early.prefill(None) as publish:
        assert publish is None
        streams.op("draft extend")
        early.launched(SimpleNamespace(next_draft_input=SimpleNamespace(bonus_tokens=object())))
    assert streams.log == [("forward", "draft extend")]
    assert early.war_fastpath_read_done_event is None


def test_it_attaches_once_and_an_error_inside_the_prefill_leaves_the_forward_stream() -> None:
    streams = FakeStreams()
    early = EarlyFirstToken(True, streams=streams, coarse_barrier=lambda: False)
    scheduler = scheduler_for(streams)
    early.attach(scheduler)
    wrapped = scheduler.future_map.stash
    early.attach(scheduler)
    assert scheduler.future_map.stash is wrapped
    with pytest.raises(RuntimeError):
        with early.prefill(scheduler.future_map.publish) as publish:
            publish("seq lens")
            assert streams.current().name == "side"
            raise RuntimeError("draft extend failed")
    assert [s.name for s in streams.stack] == ["forward"]


def worker_with(early: EarlyFirstToken, streams: FakeStreams, monkeypatch):
    """The test_worker_loop worker (EAGLE's prefill: target extend, publish, draft extend),
    its prefill timer logging on the fake streams."""
    from test_worker_loop import new_worker

    worker = new_worker(monkeypatch)
    worker.early_first_token = early
    timer_calls = worker.prefill_timer.calls

    class Logged(list):
        def append(self, what) -> None:
            super().append(what)
            streams.op(what)

    worker.prefill_timer.calls = Logged(timer_calls)
    return worker


def test_the_workers_prefill_times_the_draft_part_on_the_side_stream(monkeypatch) -> None:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from test_worker_loop import make_batch

    streams = FakeStreams()
    early = EarlyFirstToken(True, streams=streams, coarse_barrier=lambda: False)
    scheduler = scheduler_for(streams)
    worker = worker_with(early, streams, monkeypatch)
    worker.attach_scheduler(scheduler)
    worker.forward_batch_generation(make_batch(ForwardMode.EXTEND, [1, 2]),
                                    scheduler.future_map.publish)
    ops = [(s, op) for s, op in streams.log if not op.startswith("harvest")]
    assert ops[:4] == [("forward", "start 20 key 0"), ("forward", "target extend"),
                       ("forward", "target done"), ("forward", "publish")]
    assert ops[4:7] == [("side", "wait forward"), ("side", "draft extend"), ("side", "stop")]
    assert ops[7][0] == "side" and ops[7][1].startswith("event")
    assert worker.war_fastpath_runner is early  # the scheduler's barrier reads the side's end
    early.war_fastpath_read_done_event = None
    worker._last_step_plain = True
    worker._target_worker = SimpleNamespace(model_runner="target runner")
    assert worker.war_fastpath_runner == "target runner"


@pytest.mark.parametrize("raw, on", [(None, True), ("", True), ("1", True), ("0", False)])
def test_the_switch_reads_its_variable(raw, on) -> None:
    environ = {} if raw is None else {EARLY_FIRST_TOKEN_ENV: raw}
    assert load_config(environ).early_first_token is on


def test_a_bad_switch_value_names_the_variable_and_the_fix() -> None:
    with pytest.raises(StartupError, match=f"{EARLY_FIRST_TOKEN_ENV}='yes'.*1 \\(on\\) or 0"):
        load_config({EARLY_FIRST_TOKEN_ENV: "yes"})
