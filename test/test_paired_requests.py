"""tools/paired_requests.py: first tokens of two configurations compared request by request."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import paired_requests  # noqa: E402
from sweeplib.results import READABLE_SCHEMAS  # noqa: E402  (on the path through the tool)


def run(config: str, round_index: int, ttfts_ms, ok=None, workload: str = "poisson-10@20") -> dict:
    ok = ok or [True] * len(ttfts_ms)
    return {"config": config, "workload": workload, "round": round_index,
            "segments": [{"requests": {"ok": ok[:2], "ttft_s": [t / 1000 for t in ttfts_ms[:2]]}},
                         {"requests": {"ok": ok[2:], "ttft_s": [t / 1000 for t in ttfts_ms[2:]]}}]}


PLAIN = [30, 30, 30, 30, 30, 30, 30, 30]
# Requests 2 and 4 slowed together (one event: a gap of one request is joined), 7 alone; 5 at
# 1.9x is below the factor.
DYNAMIC = [31, 32, 90, 33, 100, 57, 31, 61]


def test_clusters_join_neighbours_and_leave_out_requests_below_the_factor() -> None:
    assert paired_requests.slow_clusters(PLAIN, DYNAMIC, 2.0) == [
        [(2, 90, 30), (4, 100, 30)], [(7, 61, 30)]]
    assert paired_requests.slow_clusters(PLAIN, DYNAMIC, 1.9) == [
        [(2, 90, 30), (4, 100, 30), (5, 57, 30), (7, 61, 30)]]
    # a long cluster is shown by its first requests and its span
    long = paired_requests.slow_clusters([10] * 9, [30] * 9, 2.0)
    assert paired_requests._cluster_text(long[0]) == "0: 30 / 10, 1: 30 / 10, 2: 30 / 10, 3: 30 / 10 ... 9 requests to 8"
    # a failed request (None) is never slow
    assert paired_requests.slow_clusters(PLAIN, [None] * 8, 2.0) == []


def test_a_request_without_a_first_token_time_drops_out_of_the_pairing() -> None:
    """Request 1's output came in one chunk on the second server (TPOT 0, several tokens): no first-token
    time there, so no pair; the other requests pair as before."""
    def timed(config: str, ttfts_ms, tpots) -> dict:
        return {"config": config, "workload": "w", "round": 0, "segments": [{"requests": {
            "ok": [True] * 3, "ttft_s": [t / 1000 for t in ttfts_ms], "output_len": [9] * 3, "tpot_s": tpots}}]}
    document = {"runs": [timed("plain", [30, 30, 30], [0.01] * 3), timed("dynamic", [33, 1740, 36], [0.005, 0, 0.005])]}
    assert paired_requests.ttfts_by_round(document, "dynamic", "w") == {0: [33, None, 36]}
    assert paired_requests.slow_clusters(paired_requests.ttfts_by_round(document, "plain", "w")[0],
                                         paired_requests.ttfts_by_round(document, "dynamic", "w")[0], 2.0) == []


def test_the_report_pairs_rounds_and_refuses_runs_of_other_requests(tmp_path, capsys) -> None:
    document = {"schema_version": sorted(READABLE_SCHEMAS)[-1], "runs": [
        run("plain", 0, PLAIN), run("dynamic", 0, DYNAMIC),
        run("plain", 1, PLAIN), run("dynamic", 1, DYNAMIC[:6]),
        run("plain", 0, [10, 10, 10], workload="closed-4")]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    assert paired_requests.main([str(path), "plain", "dynamic"]) == 0
    out = capsys.readouterr().out
    assert "closed-4" not in out  # dynamic never ran it
    assert ("round 0: median ratio 1.500 over 8 requests; 3 2x or slower (dynamic / plain): "
            "2: 90 / 30, 4: 100 / 30; 7: 61 / 30") in out
    assert "round 1: 8 against 6 requests, not the same requests" in out


def test_a_round_run_twice_is_refused_and_a_round_without_answers_said_so(tmp_path, capsys) -> None:
    twice = {"runs": [run("plain", 0, PLAIN), run("plain", 0, PLAIN)]}
    try:
        paired_requests.ttfts_by_round(twice, "plain", "poisson-10@20")
    except ValueError as error:
        assert "two runs of round 0" in str(error)
    else:
        raise AssertionError("two runs of one round were taken")
    failed = {"runs": [run("plain", 0, PLAIN), run("dynamic", 0, DYNAMIC, ok=[False] * 8)]}
    assert "round 0: no request answered by both" in paired_requests.report(
        failed, "plain", "dynamic", "poisson-10@20", 2.0)


def ratio_interval(*args, **kwargs):
    """(pooled ratio, 5th, 95th) of ``ratio_summary``."""
    point, _, low, high = paired_requests.ratio_summary(*args, **kwargs)
    return point, low, high


def test_pooled_ratios_and_their_block_bootstrap_interval() -> None:
    first = [[30.0 + i % 7 for i in range(100)], [40.0 + i % 5 for i in range(100)]]
    # a constant ratio is its own interval
    rounds = [[(x, 1.5 * x) for x in r] for r in first]
    assert ratio_interval(rounds, 99, draws=200) == (1.5, 1.5, 1.5)
    # one cluster of five slow consecutive requests in the second configuration: the p99
    # ratio's interval is wide and holds the point; the median barely moves
    slowed = [[(x, 3 * x if r == 0 and 40 <= i < 45 else x) for i, x in enumerate(xs)]
              for r, xs in enumerate(first)]
    point, low, high = ratio_interval(slowed, 99, draws=400)
    assert low < point <= high and high / low > 1.5
    assert ratio_interval(slowed, 50, draws=400)[0] < 1.06
    # deterministic for a seed
    assert ratio_interval(slowed, 99, draws=50, seed=3) == ratio_interval(
        slowed, 99, draws=50, seed=3)


def test_blocks_keep_a_cluster_together() -> None:
    # A cluster of 10 slow requests among 200: drawn in blocks of 10 it is often missed or taken
    # whole, so p99's interval reaches down to 1 (no slow request); drawn one request at a time
    # (block 1) nearly every draw holds about 10 slow requests and the interval stays high.
    rounds = [[(10.0, 50.0 if 100 <= i < 110 else 10.0) for i in range(200)]]
    assert ratio_interval(rounds, 99, draws=400)[1] == 1.0
    assert ratio_interval(rounds, 99, draws=400, block=1)[1] > 1.0


def test_the_report_ends_with_the_pooled_ratios(tmp_path, capsys) -> None:
    document = {"schema_version": sorted(READABLE_SCHEMAS)[-1], "runs": [
        run("plain", 0, PLAIN), run("dynamic", 0, DYNAMIC), run("plain", 1, PLAIN),
        run("dynamic", 1, DYNAMIC, ok=[i != 3 for i in range(8)])]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    assert paired_requests.main([str(path), "plain", "dynamic"]) == 0
    out = capsys.readouterr().out
    assert "pooled over 2 round(s), 15 requests, TTFT ratio (dynamic / plain)" in out


def test_the_interval_is_the_bootstraps_5th_and_95th_percentiles() -> None:
    rounds = [[(30.0 + (i * 31) % 17 + i / 100, 30.0 + (i * 7919) % 23 + i / 70) for i in range(120)]]
    samples = paired_requests.bootstrap_ratios(rounds, 50, draws=300, seed=5)
    _, low, high = ratio_interval(rounds, 50, draws=300, seed=5)
    assert (low, high) == (paired_requests.percentile(samples, 5), paired_requests.percentile(samples, 95))
    # the samples spread: a 2.5-97.5% interval would differ
    assert paired_requests.percentile(samples, 2.5) < low < high < paired_requests.percentile(samples, 97.5)


def test_each_round_is_resampled_on_its_own() -> None:
    # Round A: the same time in both; round B: three times as long in the second. Redrawn round
    # by round every resample holds 20 of each, so the pooled median ratio is 2 in every draw;
    # redrawn from the merged rounds it would swing between 1 and 3.
    rounds = [[(10.0, 10.0)] * 20, [(10.0, 30.0)] * 20]
    assert ratio_interval(rounds, 50, draws=300) == (2.0, 2.0, 2.0)


def test_a_request_at_a_rounds_end_is_drawn_as_often_as_one_in_its_middle() -> None:
    # With q = 100 a resample's ratio exceeds 1 exactly when it holds the one slow request.
    def share_holding(slow: int) -> float:
        rounds = [[(10.0, 50.0 if i == slow else 10.0) for i in range(100)]]
        samples = paired_requests.bootstrap_ratios(rounds, 100, draws=1000, seed=1)
        return sum(ratio > 1 for ratio in samples) / len(samples)

    middle, end = share_holding(50), share_holding(99)
    assert 0.55 < middle < 0.75  # 1 - (1 - 10/100) ** 10 = 0.65
    assert abs(end - middle) < 0.08


def test_a_percentile_on_a_step_of_the_curve_is_flagged_and_the_bootstraps_median_given() -> None:
    # A queue's ramp with a step: plain's TTFTs jump from 300 to 400 ms right at its median
    # while the other's rise smoothly 1.08x plain's below and above. The ratio at exactly the
    # median reads the step (0.93x, not the 1.08x around it): outside the bootstrap's
    # interval, so the report says so and gives the bootstrap's median.
    plain = [100.0 + i for i in range(200)] + [400.0 + i for i in range(200)]
    other = [1.08 * x for x in plain]
    other[199], other[200] = 1.08 * 299, 1.08 * 301  # the other's own curve has no step there
    rounds = [list(zip(plain, other))]
    point, median, low, high = paired_requests.ratio_summary(rounds, 50, draws=400)
    assert point < low and abs(median - 1.08) < 0.03
    assert "outside its interval" in paired_requests._summary_text("p50", point, median, low, high)
    # a ratio inside its interval: no such words
    constant = [[(x, 1.5 * x) for x in plain]]
    assert "outside" not in paired_requests._summary_text("p50", *paired_requests.ratio_summary(constant, 50, draws=200))
    assert paired_requests._summary_text("p50", 1.5, 1.5, 1.5, 1.5) == "p50 1.500 [1.500, 1.500], bootstrap median 1.500"
