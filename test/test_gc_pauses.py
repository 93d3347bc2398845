"""The scheduler's garbage-collection pauses (observability.gc_pauses)."""

from __future__ import annotations

import gc

from sglang_dynamic_eagle.observability.gc_pauses import GcPauses


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_each_collection_is_timed_from_its_start_to_its_stop_and_counted_by_generation() -> None:
    clock = Clock()
    pauses = GcPauses(clock)
    for generation, seconds in ((0, 0.0005), (1, 0.002), (2, 0.040), (2, 0.085)):
        pauses("start", {"generation": generation})
        clock.now += seconds
        pauses("stop", {"generation": generation, "collected": 0, "uncollectable": 0})
        clock.now += 1.0  # time between collections is not a pause
    assert pauses.report() == {
        "gc_gen2_collections": 2, "gc_gen2_pause_ms": 125.0,
        "gc_young_collections": 2, "gc_young_pause_ms": 2.5, "gc_longest_pause_ms": 85.0,
    }
    # A stop without its start (installed mid-collection) is not counted.
    pauses("stop", {"generation": 2})
    assert pauses.report()["gc_gen2_collections"] == 2


def test_installed_it_sees_the_interpreters_collections_and_uninstalled_it_does_not() -> None:
    pauses = GcPauses().install()
    try:
        assert pauses.install() is pauses and gc.callbacks.count(pauses) == 1  # once only
        gc.collect(2)
        gc.collect(0)
        report = pauses.report()
        assert report["gc_gen2_collections"] >= 1 and report["gc_young_collections"] >= 1
        assert report["gc_longest_pause_ms"] > 0.0
    finally:
        pauses.uninstall()
    assert pauses not in gc.callbacks
    counted = pauses.report()["gc_gen2_collections"]
    gc.collect(2)
    assert pauses.report()["gc_gen2_collections"] == counted
