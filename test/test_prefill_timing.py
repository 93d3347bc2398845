"""PrefillTimer's bookkeeping with stand-in events (a clock in milliseconds, completion on demand)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from sglang_dynamic_eagle.observability import prefill_timing
from sglang_dynamic_eagle.observability.prefill_timing import PrefillTimer


@dataclass
class FakeEvent:
    at_ms: float
    done: bool = False

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: "FakeEvent") -> float:
        return end.at_ms - self.at_ms


@pytest.fixture
def events(monkeypatch):
    recorded = []
    clock = itertools.count(start=0, step=5)

    def record() -> FakeEvent:
        recorded.append(FakeEvent(float(next(clock))))
        return recorded[-1]

    monkeypatch.setattr(prefill_timing, "_event", record)
    return recorded


def timed_prefill(timer: PrefillTimer, num_tokens: int) -> None:
    batch = timer.start(num_tokens)
    timer.target_done(batch)
    timer.stop(batch)


def test_only_completed_batches_are_counted_target_and_draft_apart(events) -> None:
    timer = PrefillTimer()
    timed_prefill(timer, 512)  # events at 0, 5, 10 ms
    timed_prefill(timer, 100)  # events at 15, 20, 25 ms
    for event in events[:3]:
        event.done = True
    assert timer.report() == {
        "prefill_batches": 1,
        "prefill_tokens": 512,
        "prefill_target_gpu_ms": 5.0,
        "prefill_draft_gpu_ms": 5.0,
    }
    for event in events[3:]:
        event.done = True
    report = timer.report()
    assert (report["prefill_batches"], report["prefill_tokens"]) == (2, 612)
    assert report["prefill_target_gpu_ms"] == report["prefill_draft_gpu_ms"] == 10.0


def test_a_prefill_that_never_reached_the_draft_is_not_counted(events) -> None:
    timer = PrefillTimer()
    timer.stop(timer.start(64))
    for event in events:
        event.done = True
    assert timer.report()["prefill_batches"] == 0


def test_each_completed_batch_goes_to_the_sink_once(events) -> None:
    """Per-prefill times for the trace, as the batches complete, the totals unchanged."""
    timer, seen = PrefillTimer(), []
    timer.sink = lambda tokens, target_ms, draft_ms: seen.append((tokens, target_ms, draft_ms))
    timed_prefill(timer, 512)  # events at 0, 5, 10 ms
    timed_prefill(timer, 100)  # events at 15, 20, 25 ms
    timer.report()
    assert seen == []
    for event in events:
        event.done = True
    timer.report()
    timer.report()
    assert seen == [(512, 5.0, 5.0), (100, 5.0, 5.0)]
    assert timer.report()["prefill_draft_gpu_ms"] == 10.0


def test_a_keyed_batch_hands_its_draft_time_to_the_key_sink(events) -> None:
    """The timing feed names each prefill it is told of; the draft part reaches it under that
    name once complete, and an unnamed batch (no feed yet) reaches only the trace's sink."""
    timer = PrefillTimer()
    keyed, traced = [], []
    timer.key_sink = lambda key, ms: keyed.append((key, ms))
    timer.sink = lambda tokens, target_ms, draft_ms: traced.append(tokens)
    timer.timed(512, None, lambda publish: publish(None), key=7)  # events at 0, 5, 10 ms
    timer.timed(100, None, lambda publish: publish(None))  # events at 15, 20, 25 ms
    for event in events:
        event.done = True
    timer.harvest()
    assert keyed == [(7, 5.0)]
    assert traced == [512, 100]
