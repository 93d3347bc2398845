"""counters.py on its own: ModeCounters bookkeeping (pure Python, no sglang import).

Every expected value below is worked out by hand in the comments next to it.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple, Union

import pytest

from sglang_dynamic_eagle.observability.counters import ModeCounters
from sglang_dynamic_eagle.policy import DecodeMode

PLAIN = DecodeMode.PLAIN
SPEC = DecodeMode.SPECULATIVE

ZERO_SNAPSHOT: Dict[str, Union[int, float]] = {
    "speculative_steps": 0,
    "plain_steps": 0,
    "plain_graph_steps": 0,
    "switches_to_plain": 0,
    "switches_to_speculative": 0,
    "catchup_forwards": 0,
    "catchup_tokens": 0,
    "catchup_truncated_tokens": 0,
    "speculative_verified_requests": 0,
    "speculative_accepted_tokens": 0,
    "mean_accept_length": 0.0,
    "max_plain_batch": 0,
    "max_speculative_batch": 0,
    "mismatched_results": 0,
    "decided_at_batch_selection": 0,
    "host_dispatch_ms": 0.0,
    "host_before_launch_ms": 0.0,
    "host_speculative_step_ms": 0.0,
    "host_plain_step_ms": 0.0,
}


def _launch(counters: ModeCounters, steps: Sequence[Tuple[DecodeMode, int, bool]]) -> None:
    for mode, batch_size, ran_graph in steps:
        counters.record_step(mode, batch_size, ran_graph=ran_graph)


def _snapshot_with(**changes: Union[int, float]) -> Dict[str, Union[int, float]]:
    unknown = set(changes) - set(ZERO_SNAPSHOT)
    assert not unknown, f"test typo: {unknown}"
    return {**ZERO_SNAPSHOT, **changes}


# ---------------------------------------------------------------- fresh state


def test_fresh_counters_snapshot_is_all_zero() -> None:
    counters = ModeCounters()
    assert counters.snapshot() == ZERO_SNAPSHOT
    assert counters.mean_accept_length == 0.0


def test_host_seconds_add_up_per_part_in_milliseconds() -> None:
    counters = ModeCounters()
    counters.record_host(SPEC, 0.0001, 0.002, before_launch_s=0.00006)
    counters.record_host(PLAIN, 0.0002, 0.0015, before_launch_s=0.00015)
    counters.record_host(None, 0.00005)  # result processing: dispatch only
    assert counters.snapshot() == _snapshot_with(host_dispatch_ms=0.35, host_before_launch_ms=0.21,
                                                 host_speculative_step_ms=2.0, host_plain_step_ms=1.5)


def test_snapshot_keys_do_not_leak_the_pending_queue() -> None:
    counters = ModeCounters()
    counters.record_step(SPEC, 3, ran_graph=True)
    assert "_pending_modes" not in counters.snapshot()
    assert "_pending_modes" not in repr(counters)


# ---------------------------------------------------------------- record_step


def test_record_step_counts_modes_graph_steps_and_max_batches() -> None:
    counters = ModeCounters()
    _launch(
        counters,
        [
            (SPEC, 4, True),
            (SPEC, 9, False),
            (PLAIN, 40, True),
            (PLAIN, 64, False),
            (PLAIN, 33, True),
            (SPEC, 2, True),
        ],
    )
    # spec steps: 3 (max batch 9); plain steps: 3, two of them in a graph (max 64).
    assert counters.snapshot() == _snapshot_with(
        speculative_steps=3,
        plain_steps=3,
        plain_graph_steps=2,
        max_plain_batch=64,
        max_speculative_batch=9,
    )


def test_speculative_ran_graph_does_not_count_as_plain_graph_step() -> None:
    counters = ModeCounters()
    _launch(counters, [(SPEC, 1, True), (SPEC, 1, True)])
    assert counters.plain_graph_steps == 0
    assert counters.speculative_steps == 2


# ---------------------------------------------------------------- switches and catch-up


def test_record_switch_counts_each_direction() -> None:
    counters = ModeCounters()
    for mode in (PLAIN, SPEC, PLAIN, PLAIN, SPEC):
        counters.record_switch(mode)
    assert counters.switches_to_plain == 3
    assert counters.switches_to_speculative == 2


def test_record_catchup_accumulates_forwards_tokens_and_truncation() -> None:
    counters = ModeCounters()
    counters.record_catchup(tokens=12, truncated_tokens=0)
    counters.record_catchup(tokens=256, truncated_tokens=40)
    counters.record_catchup(tokens=1, truncated_tokens=3)
    assert counters.snapshot() == _snapshot_with(
        catchup_forwards=3, catchup_tokens=269, catchup_truncated_tokens=43
    )


# ---------------------------------------------------------------- record_result FIFO


def verified_and_accepted(counters: ModeCounters) -> tuple:
    return counters.speculative_verified_requests, counters.speculative_accepted_tokens


def test_results_are_attributed_in_launch_order() -> None:
    counters = ModeCounters()
    # Overlap scheduling: two steps are launched before the first result arrives.
    counters.record_step(SPEC, 3, ran_graph=True)
    counters.record_step(PLAIN, 4, ran_graph=True)
    counters.record_result([2, 0, 1])  # spec: 3 requests, 3 drafts + 3 bonus = 6 tokens
    counters.record_step(SPEC, 2, ran_graph=True)
    counters.record_result([0, 0, 0, 0])  # plain: no acceptance counted
    counters.record_result([3, 3])  # spec: 2 requests, 6 drafts + 2 bonus = 8 tokens
    assert verified_and_accepted(counters) == (5, 14)
    assert counters.mean_accept_length == pytest.approx(14 / 5)  # 2.8


def test_a_result_of_another_size_than_its_step_is_counted_as_mismatched() -> None:
    counters = ModeCounters()
    counters.record_step(SPEC, 3, ran_graph=True)
    counters.record_step(SPEC, 2, ran_graph=True)
    counters.record_result([1, 1])  # a slipped attribution: this is the second step's result
    counters.record_result([1, 1])
    assert counters.mismatched_results == 1


def test_plain_result_with_nonzero_drafts_is_still_ignored() -> None:
    counters = ModeCounters()
    counters.record_step(PLAIN, 2, ran_graph=False)
    counters.record_result([5, 5])
    assert verified_and_accepted(counters) == (0, 0)


def test_result_without_pending_step_changes_nothing() -> None:
    counters = ModeCounters()
    counters.record_result([3, 3, 3])
    assert counters.snapshot() == ZERO_SNAPSHOT
    # A later launch is still matched with its own result, not the stray one.
    counters.record_step(SPEC, 1, ran_graph=True)
    counters.record_result([1])
    assert verified_and_accepted(counters) == (1, 2)


def test_each_result_consumes_exactly_one_pending_step() -> None:
    counters = ModeCounters()
    counters.record_step(PLAIN, 1, ran_graph=True)
    counters.record_step(SPEC, 1, ran_graph=True)
    counters.record_result([])  # the plain step's (empty) result
    counters.record_result([2])  # the spec step: 2 drafts + 1 bonus
    counters.record_result([7])  # nothing pending any more: ignored
    assert verified_and_accepted(counters) == (1, 3)


def test_empty_speculative_result_pops_but_adds_nothing() -> None:
    counters = ModeCounters()
    counters.record_step(SPEC, 1, ran_graph=True)
    counters.record_step(SPEC, 1, ran_graph=True)
    counters.record_result([])
    counters.record_result([1])
    assert verified_and_accepted(counters) == (1, 2)
    assert counters.mean_accept_length == 2.0


# ---------------------------------------------------------------- the verified step


def test_record_result_returns_the_mode_of_the_step_it_belongs_to() -> None:
    counters = ModeCounters()
    counters.record_step(SPEC, 1, ran_graph=True, step=1)
    counters.record_step(PLAIN, 2, ran_graph=True, step=2)
    assert counters.record_result([1]) is SPEC
    assert counters.record_result([0, 0]) is PLAIN
    assert counters.record_result([0]) is None  # nothing pending


def test_verified_step_names_the_step_of_the_latest_attributed_result() -> None:
    counters = ModeCounters()
    assert counters.verified_step == 0
    # Overlap scheduling: steps 7 and 8 are launched before step 7's result arrives.
    counters.record_step(SPEC, 2, ran_graph=True, step=7)
    counters.record_step(PLAIN, 2, ran_graph=True, step=8)
    counters.record_result([1, 1])
    assert counters.verified_step == 7
    counters.record_step(SPEC, 3, ran_graph=True, step=9)
    counters.record_result([0, 0])
    assert counters.verified_step == 8
    counters.record_result([2, 2, 2])
    assert counters.verified_step == 9
    counters.record_result([5])  # a stray result: the last attributed step stays
    assert counters.verified_step == 9


# ---------------------------------------------------------------- snapshot and log line


def _counters_for_report() -> ModeCounters:
    counters = ModeCounters()
    counters.record_switch(PLAIN)
    counters.record_switch(SPEC)
    counters.record_catchup(tokens=7, truncated_tokens=2)
    steps: List[Tuple[DecodeMode, int, bool]] = [
        (SPEC, 3, True),
        (PLAIN, 30, True),
        (PLAIN, 31, False),
    ]
    _launch(counters, steps)
    # The last step decided when the scheduler chose its batch.
    counters.record_step(SPEC, 3, ran_graph=True, decided_at_selection=True)
    counters.record_result([1, 2, 0])  # 3 requests, 3 + 3 = 6 tokens
    counters.record_result([0] * 30)
    counters.record_result([0] * 31)
    counters.record_result([0, 0, 1])  # 3 requests, 1 + 3 = 4 tokens
    return counters


def test_snapshot_reports_every_counter_and_rounds_accept_length() -> None:
    counters = _counters_for_report()
    # 10 accepted tokens / 6 verified requests = 1.6666... -> 1.6667
    assert counters.snapshot() == {
        "speculative_steps": 2,
        "plain_steps": 2,
        "plain_graph_steps": 1,
        "switches_to_plain": 1,
        "switches_to_speculative": 1,
        "catchup_forwards": 1,
        "catchup_tokens": 7,
        "catchup_truncated_tokens": 2,
        "speculative_verified_requests": 6,
        "speculative_accepted_tokens": 10,
        "mean_accept_length": 1.6667,
        "max_plain_batch": 31,
        "max_speculative_batch": 3,
        "mismatched_results": 0,
        "decided_at_batch_selection": 1,
        "host_dispatch_ms": 0.0,
        "host_before_launch_ms": 0.0,
        "host_speculative_step_ms": 0.0,
        "host_plain_step_ms": 0.0,
    }


def test_log_line_text() -> None:
    counters = _counters_for_report()
    assert counters.log_line() == (
        "EAGLE3_DYNAMIC: spec steps 2, plain steps 2 (1 graph), "
        "switches to plain 1, to spec 1, catch-up tokens 7, spec accept len 1.67"
    )


def test_log_line_of_fresh_counters() -> None:
    assert ModeCounters().log_line() == (
        "EAGLE3_DYNAMIC: spec steps 0, plain steps 0 (0 graph), "
        "switches to plain 0, to spec 0, catch-up tokens 0, spec accept len 0.00"
    )
