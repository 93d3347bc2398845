"""Pair statistics (benchmark/sweeplib/paired.py): ratios pair by pair, their intervals, the rounds of
run.py's runs as pairs, and the former paired.py's report (the whole schedule: test_benchmark_run.py)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib import paired  # noqa: E402
from benchmark_helpers import traffic_run  # noqa: E402


def wave(config: str, ttfts, tokens: int = 100, wall_s: float = 1.0, failed: int = 0) -> paired.Wave:
    return paired.Wave(config, tuple(ttfts), tokens, wall_s, failed)


def test_ratios_are_taken_pair_by_pair_so_a_slow_stretch_moves_both_sides() -> None:
    """Pair 2 ran in a slow stretch: both servers 1.6x slower. Pairwise, b stays 0.9x of a;
    a ratio of the two servers' overall medians would not see it as clearly."""
    pairs = [
        {"a": wave("a", [40.0]), "b": wave("b", [36.0], tokens=110)},
        {"a": wave("a", [40.0]), "b": wave("b", [36.0], tokens=110)},
        {"a": wave("a", [64.0]), "b": wave("b", [57.6], tokens=110)},
        {"a": wave("a", [40.0]), "b": wave("b", [10.0], failed=1)},  # left out: a request failed
    ]
    summary = paired.pair_summary(pairs, "a", "b")
    assert summary["pairs"] == 3
    assert summary["median_ttft_ratio_quartiles"] == pytest.approx((0.9, 0.9, 0.9))
    assert summary["throughput_ratio_quartiles"] == pytest.approx((1.1, 1.1, 1.1))
    assert summary["pairs_other_ttft_lower"] == 3
    assert summary["median_ttft_ms"] == {"a": 40.0, "b": 36.0}


def saved(measured: list[dict]) -> dict:
    return {"sources": [{"command_line": "paired.py", "created": "now", "gpu": "none",
                         "settings": {"configs": "a,b"}}], "pairs": measured}


def pair(label, index: int, a_ttft: float, b_ttft: float, b_failed: int = 0) -> dict:
    key = {"workload": label, "concurrency": 4} if isinstance(label, str) else {"concurrency": label}
    return {**key, "pair": index, "waves": {
        "a": dataclasses.asdict(wave("a", [a_ttft])), "b": dataclasses.asdict(wave("b", [b_ttft], failed=b_failed))}}


def test_the_former_paired_files_report_names_the_ratio_and_its_quartiles() -> None:
    text = paired.report_markdown(saved([pair(1, i, 40.0 + i, 38.0 + i) for i in range(5)]
                                        + [pair(4, 0, 40.0, 30.0, b_failed=1)]))
    assert "| requests | pairs |" in text
    assert ("| 1 | 5 | 0.951 / 0.952 / 0.954 | 0.952 [0.951, 0.954] | 1.000 / 1.000 / 1.000 | "
            "1.000 [1.000, 1.000] | 5 | 42.0 / 40.0 |") in text
    assert "| 4 | 0 |" + " n/a |" * 7 in text


def test_the_interval_excludes_one_only_where_the_pairs_show_a_difference() -> None:
    """Ratios scattered 0.8-1.25 around 1 give an interval across 1; the same scatter around
    0.9 gives one below 1; one ratio gives a point."""
    around_one = [0.8, 1.25] * 30
    low, centre, high = paired.geometric_mean_interval(around_one)
    assert low < 1.0 < high and centre == pytest.approx(1.0)
    low, centre, high = paired.geometric_mean_interval([0.9 * ratio for ratio in around_one])
    assert high < 1.0 and centre == pytest.approx(0.9)
    assert paired.geometric_mean_interval([1.1]) == pytest.approx((1.1, 1.1, 1.1))


def test_a_run_is_a_wave_of_its_requests():
    run = traffic_run("dynamic", "closed-4", 0.02, [0.01] * 4, duration=2.0)
    run["segments"][0]["requests"]["ok"][3] = False
    run["metrics"]["completed"] = 3
    result = paired.wave_of_run(run)
    assert result.ttfts_ms == pytest.approx((20.0, 20.0, 20.0)) and result.failed == 1
    assert result.throughput == pytest.approx(run["metrics"]["total_output_tokens"] / 2.0)
    # request 2's answer came in one chunk (TPOT 0): no first-token time, its tokens still counted
    run["segments"][0]["requests"]["tpot_s"][2], run["segments"][0]["requests"]["ttft_s"][2] = 0.0, 1.7
    assert paired.wave_of_run(run).ttfts_ms == pytest.approx((20.0, 20.0))


def test_rounds_pair_up_the_two_configurations_runs_of_each_workload():
    """Round 1's dynamic run is missing: rounds 0 and 2 make the pairs; plain in 2 ran slow, so
    did dynamic: the pair ratio stays 0.8."""
    runs = [traffic_run("plain", "closed-1", 0.050, [0.01], round_index=0),
            traffic_run("dynamic", "closed-1", 0.040, [0.01], round_index=0),
            traffic_run("plain", "closed-1", 0.050, [0.01], round_index=1),
            traffic_run("plain", "closed-1", 0.100, [0.01], round_index=2),
            traffic_run("dynamic", "closed-1", 0.080, [0.01], round_index=2),
            traffic_run("eagle3", "closed-1", 0.010, [0.01], round_index=2)]
    ((workload, summary),) = paired.round_pairs(runs, "plain", "dynamic")
    assert workload == "closed-1" and summary["pairs"] == 2
    assert summary["median_ttft_ratio_quartiles"] == pytest.approx((0.8, 0.8, 0.8))
    table = paired.pair_table([(workload, summary)], "plain", "dynamic", "workload")
    assert table[-1].startswith("| closed-1 | 2 | 0.800 / 0.800 / 0.800 | 0.800 [0.800, 0.800] |")
