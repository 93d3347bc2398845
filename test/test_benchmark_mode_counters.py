"""EAGLE3_DYNAMIC's counters as the benchmark reads them (benchmark/sweeplib/results.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib import results  # noqa: E402
from benchmark_helpers import counters, SPEC_COUNTS_BEFORE, SPEC_COUNTS_AFTER  # noqa: E402


def test_mode_counters_found_at_top_level_or_in_internal_states():
    top = {"dynamic_eagle": counters(10, 5)}
    nested = {"internal_states": [{"other": 1}, {"dynamic_eagle": counters(3, 4)}]}
    assert results.find_mode_counters(top)["speculative_steps"] == 10
    assert results.find_mode_counters(nested)["plain_steps"] == 4
    found = results.find_mode_counters(nested)
    found["plain_steps"] = 99
    assert nested["internal_states"][1]["dynamic_eagle"]["plain_steps"] == 4
    assert results.find_mode_counters({"internal_states": [{}]}) is None
    assert results.find_mode_counters(None) is None
    assert results.find_mode_counters({"dynamic_eagle": {"speculative_steps": 1}}) is None


@given(
    before=st.tuples(*[st.integers(0, 10**6)] * 5),
    increments=st.tuples(*[st.integers(0, 10**6)] * 5),
)
def test_counter_delta_is_the_increase(before, increments):
    b = counters(*before)
    a = counters(*(x + d for x, d in zip(before, increments)))
    delta = results.counter_delta(b, a)
    for field, increment in zip(results.COUNTER_FIELDS, increments):
        assert delta[field] == increment
    steps = increments[0] + increments[1]
    if steps:
        assert delta["speculative_step_fraction"] == pytest.approx(increments[0] / steps)
    else:
        assert delta["speculative_step_fraction"] is None
    assert delta["counters_reset_during_run"] is False


def test_counter_delta_after_a_reset_uses_the_new_values():
    delta = results.counter_delta(counters(100, 50, 2, 1), counters(7, 3, 1, 0))
    assert delta["speculative_steps"] == 7 and delta["plain_steps"] == 3
    assert delta["counters_reset_during_run"] is True


def test_optional_counters_and_policy_from_the_plugin_report():
    before = {**counters(10, 0), "catchup_forwards": 1, "catchup_gpu_ms": 1.5,
              "disable_batch_threshold": 24, "enable_batch_threshold": 16, "switch_patience": 4}
    after = {**counters(12, 40, 1, 0, 0), "catchup_forwards": 3, "catchup_gpu_ms": 4.0,
             "disable_batch_threshold": 24, "enable_batch_threshold": 16, "switch_patience": 4}
    delta = results.counter_delta(before, after)
    assert delta["catchup_forwards"] == 2 and delta["catchup_gpu_ms"] == pytest.approx(2.5)
    assert "plain_graph_steps" not in delta
    assert results.policy_settings(after) == {
        "disable_batch_threshold": 24, "enable_batch_threshold": 16, "switch_patience": 4}
    assert results.policy_settings(None) == {}


def test_counter_delta_needs_both_snapshots():
    assert results.counter_delta(None, counters(1, 1)) is None
    assert results.counter_delta(counters(1, 1), None) is None


def test_speculative_acceptance_and_batch_of_a_run_come_from_its_own_counts():
    delta = results.counter_delta(SPEC_COUNTS_BEFORE, SPEC_COUNTS_AFTER)
    assert delta["speculative_accept_length"] == pytest.approx(180 / 60)
    assert delta["mean_speculative_batch"] == pytest.approx(60 / 20)
    only_plain = results.counter_delta(SPEC_COUNTS_AFTER, {**SPEC_COUNTS_AFTER, "plain_steps": 50})
    without_counts = results.counter_delta(counters(1, 0), counters(2, 0))
    for field in ("speculative_accept_length", "mean_speculative_batch"):
        assert only_plain[field] is None and without_counts[field] is None


def test_probe_counters_are_counted_and_an_incomplete_section_is_kept_but_has_no_delta():
    before, after = {**counters(1, 1), "policy_probes": 2}, {**counters(5, 9), "policy_probes": 7, "probing": True}
    delta = results.counter_delta(before, after)
    assert delta["policy_probes"] == 5 and "probing" not in delta
    partial = {"internal_states": [{"dynamic_eagle": {"speculative_steps": 1, "policy_probes": 3}}]}
    assert results.find_mode_counters(partial) is None
    section = results.find_mode_counters(partial, complete=False)
    assert section == {"speculative_steps": 1, "policy_probes": 3}
    assert results.counter_delta(section, section) is None
