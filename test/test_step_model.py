"""The step-cost model (policy/step_model.py): what its fit learns from timed steps."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_dynamic_eagle.policy import step_model
from sglang_dynamic_eagle.policy.step_model import CatchupCost, ModeCost

BUCKETS = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128]
KV_PRIOR_MS = 131072 / 4e9  # 8B-shaped target: KV bytes per token over 4 TB/s


def bucket_of(b: int) -> int:
    return next(x for x in BUCKETS if x >= b)


def plain_replay(bucket: int) -> float:
    return 4.6 + 0.01 * bucket


def new_cost() -> ModeCost:
    return ModeCost(BUCKETS, {b: plain_replay(b) for b in BUCKETS}, KV_PRIOR_MS)


def test_a_per_request_cost_shown_across_batch_sizes_is_learned() -> None:
    """A speculative step's host work, 0.31 ms per request beyond its replay (H200, 8B-shaped,
    triton), seen over batches of 1-64, predicts a step of 120 requests within 10%."""
    rng = np.random.default_rng(4)
    cost = new_cost()
    for _ in range(300):
        b = int(rng.integers(1, 65))
        kv = 700 * b
        cost.add(bucket_of(b), kv, plain_replay(bucket_of(b)) + 2.4 + 0.31 * b + KV_PRIOR_MS * kv,
                 batch_size=b)
    truth = plain_replay(120) + 2.4 + 0.31 * 120 + KV_PRIOR_MS * 120 * 700
    assert cost.predict(120, 120 * 700) == pytest.approx(truth, rel=0.10)


def _light_then_predict(seed: int, steps: int = 64, jitter: float = 0.03) -> float:
    """Relative error at 72 requests after ``steps`` speculative steps at 1-8 requests with 0.31
    ms of host work per request (triton, H200, 8B-shaped) and ``jitter`` per step."""
    rng = np.random.default_rng(seed)
    cost = new_cost()
    for _ in range(steps):
        b = int(rng.integers(1, 9))
        ms = plain_replay(bucket_of(b)) + 2.4 + 0.31 * b + KV_PRIOR_MS * 700 * b
        cost.add(bucket_of(b), 700 * b, ms * float(np.exp(rng.normal(0.0, jitter))), batch_size=b)
    truth = plain_replay(72) + 2.4 + 0.31 * 72 + KV_PRIOR_MS * 72 * 700
    return cost.predict(72, 72 * 700) / truth - 1.0


def test_host_work_per_request_seen_at_light_load_carries_to_a_burst() -> None:
    """64 steps of light traffic (about half a second) with 0.31 ms of host work per request:
    a step of 72 requests is predicted within 15% (a ridge prior pulling the per-request cost to
    0 with the weight of 4 steps spread 16 requests apart predicted 13.5 ms for 32.7)."""
    assert max(abs(_light_then_predict(seed)) for seed in range(10)) <= 0.15


def _narrow_then_predict(seed: int) -> float:
    """Relative error at 117 requests after 14 plain steps at 29-30 requests (3% jitter): what a
    server that left speculation for a moment at one batch size knows of plain steps."""
    rng = np.random.default_rng(seed)
    cost = new_cost()
    for _ in range(14):
        b = int(rng.integers(29, 31))
        ms = plain_replay(bucket_of(b)) + 0.5 + KV_PRIOR_MS * 630 * b
        cost.add(bucket_of(b), 630 * b, ms * float(np.exp(rng.normal(0.0, 0.03))), batch_size=b)
    truth = plain_replay(120) + 0.5 + KV_PRIOR_MS * 117 * 630
    return cost.predict(117, 117 * 630) / truth - 1.0


def test_steps_at_one_batch_size_do_not_invent_a_per_request_cost() -> None:
    """Without a prior on the per-request cost such steps fitted up to 0.27 ms per request (noise)
    and priced a plain step at 117 requests at 2.3x its cost in the worst of these seeds; the
    traffic model (tools/serving_model.py, triton-shaped costs, one seed of Poisson 20 req/s)
    then kept speculating at 100+ requests for 300 steps, median E2E 1.6x plain's."""
    assert max(abs(_narrow_then_predict(seed)) for seed in range(20)) <= 0.25


def test_one_unlucky_verify_does_not_set_the_acceptance() -> None:
    """A request accepting 1.6 tokens per verify shows 0 or 1 drafts at a time. Its first verify
    with none (1 token) leaves the estimate near the prior; 28 verifies (a probe of 7 steps at 4
    requests) bring it within 0.1 of 1.6. (Taken alone, that first verify read 1.0, and the
    policy left speculation for good on a load where it was 4% better.)"""
    from sglang_dynamic_eagle.policy.acceptance import Acceptance

    acceptance = Acceptance(max_acceptance=4.0)
    acceptance.add_verify([0], decode_step=1)
    assert acceptance.server_mean > 2.5
    rng = np.random.default_rng(6)
    for step in range(2, 9):
        acceptance.add_verify(list((rng.random(4) < 0.6).astype(int)), decode_step=step)
    assert acceptance.server_mean == pytest.approx(1.6, abs=0.15)



def _prior_is(estimator: str):
    """The acceptance estimator whose verified requests shrink towards ``estimator``: "others"
    (the server mean with the request's own first verifies taken out: the policy's), "recent"
    (the server mean, its first verifies counted twice), "weight" (the recent evidence weighed
    less by the request's share, its mean unchanged) or "long-run" (the long-run mean alone)."""
    from sglang_dynamic_eagle.policy.acceptance import REQUEST_PRIOR_VERIFIES as K, Acceptance

    class Shrunk(Acceptance):
        def _request_means(self, verifies, accepted, prior):
            if estimator == "others":
                return Acceptance._request_means(self, verifies, accepted, prior)
            recent, n = self._sums[0]

            def weight(verifies, tokens):
                others = max(0.0, n - min(verifies, K)) / n
                return (others * recent + K * self.long_run_mean) / (others * n + K)

            own = {"weight": weight, "recent": lambda verifies, tokens: self.server_mean,
                   "long-run": lambda verifies, tokens: self.long_run_mean}[estimator]
            return [min(self.max_acceptance, max(1.0, (a + K * own(v, a)) / (v + K))) if v > 0 else prior
                    for v, a in zip(verifies, accepted)]

    return Shrunk(max_acceptance=4.0)


def _lone_request_after_an_unlucky_stretch(estimator: str) -> float:
    """Tokens per verify the policy expects of a lone request accepting 2.3 on average whose
    first 11 verifies drew 15 tokens (a chain of 3 drafts, as the serving model drew on closed
    loop 1, triton-shaped, half the requests at 2.3 and half at 3.47; its speculation pays above
    1.6), after 400 earlier requests at 2.9; fed as the worker feeds it (each request's verifies
    before each verify)."""
    acceptance = _prior_is(estimator)
    for step in range(1, 401):
        acceptance.add_verify([2 if step % 10 else 1], decode_step=step, prior_verifies=[0])  # 2.9 a verify
    draws = [0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1]  # 15 tokens over 11 verifies
    for n, drafts in enumerate(draws):
        acceptance.add_verify([drafts], decode_step=2000 + n, prior_verifies=[n])
    return acceptance.batch_tokens(1, [len(draws)], [sum(draws) + len(draws)])


def test_a_lone_requests_unlucky_stretch_is_not_counted_twice() -> None:
    """Shrunk towards the recent server mean, which at one running request is its own first
    verifies, the request reads 1.56 (it read 1.50 fed every verify, as the worker fed it then,
    and left speculation for 56 steps: 0.967x the better mode over the load); with its own share
    left out of the recent mean it reads 1.77, as shrunk towards the long-run mean."""
    assert _lone_request_after_an_unlucky_stretch("others") >= 1.7
    assert _lone_request_after_an_unlucky_stretch("recent") < 1.6  # counted twice


def _two_requests_apart(estimator: str) -> float:
    """Tokens per verify expected of the request accepting 1.0 in a batch of two, the other at
    3.0, each verified four times, long after 400 earlier requests' first verifies at 2.5."""
    acceptance = _prior_is(estimator)
    for step in range(1, 401):
        acceptance.add_verify([1 if step % 2 else 2], decode_step=step, prior_verifies=[0])  # 2.5 a verify
    for n in range(4):
        acceptance.add_verify([0, 2], decode_step=2000 + n, prior_verifies=[n, n])
    return acceptance.batch_tokens(2, [4, 4], [4.0, 12.0]) - acceptance.batch_tokens(1, [4], [12.0])


def test_a_request_is_not_priced_at_its_own_first_verifies() -> None:
    """Two requests running, one accepting 1.0 and one 3.0: the recent mean holds both, 2.0.
    The first one's prior is the other's level shrunk towards the long-run mean, and it reads
    1.91 after four verifies (1.875 with its share taken out exactly; its four verifies count in
    full though they have decayed a little); weighing the recent evidence less but keeping its
    mean, which holds the request itself, it reads 1.64."""
    assert _two_requests_apart("others") == pytest.approx(1.9, abs=0.04)
    assert _two_requests_apart("weight") < 1.7


def _after_a_change_of_task_mix(estimator: str) -> float:
    """Tokens per verify expected of a batch of 128 requests accepting 1.6 (0 or 1 draft, 60%
    ones), each verified 7 times (one probe), after 1,000 steps of 24 requests accepting 3.0
    (each request 64 steps long)."""
    acceptance = _prior_is(estimator)
    rng = np.random.default_rng(8)
    for step in range(1, 1001):
        acceptance.add_verify([2] * 24, decode_step=step, prior_verifies=[step % 64] * 24)
    accepted = np.zeros(128)
    for n in range(7):
        drafts = (rng.random(128) < 0.6).astype(int)
        acceptance.add_verify(list(drafts), decode_step=1500 + n, prior_verifies=[n] * 128)
        accepted += drafts + 1
    return acceptance.batch_tokens(128, [7] * 128, list(accepted)) / 128


def test_verified_requests_follow_a_change_of_task_mix() -> None:
    """Shrunk towards the long-run mean (the traffic before), the batch reads 1.99; with each
    request's share left out of the recent mean, 1.62 (its draws' mean).
    On an H100 (2026-12-05) requests at 1.6 after traffic at 3.0 read 1.71: speculation looked
    even with plain decoding at 128 requests where it was 7% slower, and the server decoded 22%
    of its steps speculatively (0.956x plain's throughput)."""
    assert _after_a_change_of_task_mix("others") == pytest.approx(1.6, abs=0.05)
    assert _after_a_change_of_task_mix("long-run") > 1.9


def _after_a_stretch_in_the_other_mode(with_steps: bool) -> float:
    """Relative error of a bucket's prediction when its cost fell from 10 to 7.6 ms while the
    server decoded in the other mode for 150 steps, after a probe's six timed steps."""
    cost = new_cost()
    for step in range(1, 65):
        cost.add(32, 32 * 700, 10.0, batch_size=32, step=step if with_steps else None)
    for step in range(215, 221):
        cost.add(32, 32 * 700, 7.6, batch_size=32, step=step if with_steps else None)
    return cost.predict(32, 32 * 700) / 7.6 - 1.0


def test_a_probe_after_a_stretch_in_the_other_mode_outweighs_old_steps() -> None:
    """A bucket forgets by decode steps, not by its own samples (the GPU run of 2026-12-05,
    closed loop 32 at acceptance 1.6: speculative steps went from 10 to 7.6 ms while the server
    decoded plainly, and a probe's steps were outweighed by 64 old ones)."""
    assert abs(_after_a_stretch_in_the_other_mode(True)) <= 0.15
    assert _after_a_stretch_in_the_other_mode(False) > 0.2  # forgetting by samples: stale


# Catch-ups of an H100 server (fa3, 2026-12-05, acceptance 1.6): the first one (JIT, not counted),
# five of 1-8 tokens near 0.6 ms, then 288 tokens in 49.6 ms (two catch-ups, taken here as one;
# most likely a compile at a new shape: 9,880 tokens later took 22 ms over many catch-ups).
WARM_CATCHUPS = [(1, 4.9), (1, 0.58), (2, 0.59), (4, 0.6), (6, 0.6), (8, 0.61)]


@pytest.mark.parametrize("stall_factor", [step_model.STALL_FACTOR, float("inf")])
def test_one_catch_up_that_compiles_does_not_set_the_switch_cost(monkeypatch, stall_factor) -> None:
    """Left in the fit, that one catch-up made the next switch to speculation at 64 requests cost
    8,192 tokens x 0.17 ms (1.4 s of predicted loss to pay first): the server decoded plainly on
    769 of 770 steps where it predicted speculation 27% faster. As a stall it is left out; the
    negative control (no stall rule) shows the blow-up."""
    monkeypatch.setattr(step_model, "STALL_FACTOR", stall_factor)
    cost = CatchupCost(prior_fixed_ms=8.4)
    for tokens, ms in WARM_CATCHUPS:
        cost.add(tokens, ms)
    before = cost.predict(8192)
    cost.add(288, 49.6)
    if stall_factor == float("inf"):
        assert cost.predict(8192) > 1000.0 > 30 * before
    else:
        assert cost.predict(8192) == before


def test_catch_ups_that_keep_costing_more_are_a_cost() -> None:
    """STALL_RUN costly catch-ups in a row are what catch-ups cost now, not stalls."""
    cost = CatchupCost(prior_fixed_ms=8.4)
    for tokens, ms in WARM_CATCHUPS:
        cost.add(tokens, ms)
    before = cost.predict(300)
    for _ in range(step_model.STALL_RUN - 1):
        cost.add(300, 12.0)
    assert cost.predict(300) == before  # stalls so far
    cost.add(300, 12.0)
    assert cost.predict(300) > 2 * before


def test_a_step_that_stalls_is_left_out_until_stalls_are_the_cost() -> None:
    """A step over STALL_FACTOR x its prediction (a compile, a host hiccup) does not move the
    fit; STALL_RUN of them in a row at one bucket do: that is what the bucket costs now."""
    cost = new_cost()
    for step in range(64):
        cost.add(16, 16 * 600, plain_replay(16) + 0.3, 16, step)
    before = cost.predict(16, 16 * 600)
    for run in range(step_model.STALL_RUN - 1):
        cost.add(16, 16 * 600, 10 * before, 16, 100 + run)
        assert cost.predict(16, 16 * 600) == pytest.approx(before)
    cost.add(16, 16 * 600, 10 * before, 16, 200)
    assert cost.predict(16, 16 * 600) > 1.5 * before


def _new_request_prior(tell_verify_counts: bool) -> float:
    """The acceptance a request not yet verified is priced at, after a server has speculated on
    traffic where half the requests accept 1.3 tokens per verify and half 4.0 (chain of 3 drafts),
    every request 300 tokens long, 8 running at a time, a new one taking each finished one's place
    (arrivals alternate between the halves)."""
    from sglang_dynamic_eagle.policy.acceptance import Acceptance

    acceptance = Acceptance(max_acceptance=4.0)
    rng = np.random.default_rng(3)
    arrivals = iter(range(10 ** 6))
    running = [[next(arrivals) % 2, 0, 0] for _ in range(8)]  # [half, verifies, tokens]
    for step in range(1, 4001):
        drafts = [3 if half else int(rng.random() < 0.3) for half, _, _ in running]
        before = [n for _, n, _ in running]
        acceptance.add_verify(drafts, decode_step=step,
                              prior_verifies=before if tell_verify_counts else None)
        for r, d in zip(running, drafts):
            r[1] += 1
            r[2] += d + 1
        running = [r if r[2] < 300 else [next(arrivals) % 2, 0, 0] for r in running]
    return acceptance.batch_tokens(1, [0], [0])


def test_a_new_request_is_priced_at_the_mean_over_requests_not_over_verifies() -> None:
    """A request that accepts little runs for more steps, so most verifies (and most of a running
    batch) are of the half at 1.3: over verifies the mean is their harmonic mean, 1.96, and the
    recent verifies read as low as the batch's survivors. A new request is one of either half:
    2.65. Priced at the verify mean, a new arrival looked like the survivors, and on an H100 at 5
    requests/s of that mixture the server decoded plainly on 55% of its steps where speculation
    yielded 1.1-1.4x (2026-12-05). Counted once per request (each one's first verifies), a later
    run of that load, paired with EAGLE3, speculated on 88-99% of them, median E2E equal to
    EAGLE3's (docs/results.md)."""
    assert _new_request_prior(True) == pytest.approx(2.65, abs=0.2)
    assert _new_request_prior(False) < 2.2  # the estimator that weighed requests by their steps


# The catch-ups of an H100 server with flashinfer attention before its closed loop of 64
# (2026-12-05, 8B-shaped pair): the first is left out (a server's first compiles); the 32-token
# one compiled at a new shape. Then the draft prefills the trace recorded beside them.
FLASHINFER_CATCHUPS = [(1, 13.89), (2, 2.78), (8, 3.02), (16, 3.76), (32, 24.16)]
FLASHINFER_DRAFT_PREFILLS = [(566, 3.81), (631, 3.02), (2048, 3.36), (8192, 10.6)]


def test_draft_prefill_times_bound_the_catch_up_per_token_cost() -> None:
    """Four timed catch-ups, one of them a compile, fit 0.74 ms per token: a return to
    speculation at 64 requests after 128 plain steps (8,192 tokens) would be priced at 6 s and
    the server decoded plainly for 512 steps where speculation was predicted 23% faster. The
    draft's prefill is the same extend over a prompt's positions: its ms per token bounds the
    catch-up's."""
    unbounded, bounded = CatchupCost(prior_fixed_ms=7.4), CatchupCost(prior_fixed_ms=7.4)
    for tokens, ms in FLASHINFER_CATCHUPS:
        unbounded.add(tokens, ms)
        bounded.add(tokens, ms)
    for tokens, ms in FLASHINFER_DRAFT_PREFILLS:
        bounded.add_draft_prefill(tokens, ms)
    assert unbounded.predict(8192) > 5000.0  # the negative control: the compile sets the slope
    tokens, ms = (sum(column) for column in zip(*FLASHINFER_DRAFT_PREFILLS))
    assert bounded.per_token_bound == pytest.approx(ms / tokens)  # 1.8 us, pooled
    assert bounded.predict(8192) < 30.0  # 8,192 positions took 16.2 ms in the next load
    assert bounded.predict(64) < 10.0


def test_the_bound_prices_catch_ups_before_a_slope_of_their_own() -> None:
    """With fewer than four catch-ups timed, one of them a compile, a large catch-up is priced
    at the mean's fixed part plus the prefills' per-token cost, not at the mean alone."""
    cost = CatchupCost(prior_fixed_ms=7.4)
    for tokens, ms in FLASHINFER_CATCHUPS[:4]:
        cost.add(tokens, ms)
    unbounded = cost.predict(8192)
    for tokens, ms in FLASHINFER_DRAFT_PREFILLS:
        cost.add_draft_prefill(tokens, ms)
    assert cost.predict(8192) > cost.predict(64) > 0
    assert cost.predict(8192) - cost.predict(64) == pytest.approx(
        (8192 - 64) * cost.per_token_bound)
    assert unbounded == pytest.approx(cost.predict(8192) - 8192 * cost.per_token_bound, abs=0.5)


def test_catch_ups_of_one_size_keep_their_measured_time() -> None:
    """Catch-ups that are all one size (each cut to the window at one batch) give no slope of
    their own: the bound sets it, never above their own time over their tokens, so the
    prediction at that size stays what they took (a prefill bound looser than that, from short
    prompts, would otherwise price them at twice)."""
    cost = CatchupCost(prior_fixed_ms=7.4)
    for _ in range(10):
        cost.add(4096, 12.0)
    for tokens, ms in [(566, 3.81), (631, 3.02)]:
        cost.add_draft_prefill(tokens, ms)
    assert cost.predict(4096) == pytest.approx(12.0)


def test_with_the_prefills_bound_a_compile_among_the_first_catch_ups_is_a_stall() -> None:
    """Prefills timed before the catch-ups (as on a server: every request is prefilled first):
    the 32-token compile, 7x what the first catch-ups predict, is left out, so 64 tokens are
    priced near the 3-4 ms the others took; without the prefills (the control) the compile
    stays in the mean."""
    priced = {}
    for with_prefills in (False, True):
        cost = CatchupCost(prior_fixed_ms=7.4)
        if with_prefills:
            for tokens, ms in FLASHINFER_DRAFT_PREFILLS:
                cost.add_draft_prefill(tokens, ms)
        for tokens, ms in FLASHINFER_CATCHUPS:
            cost.add(tokens, ms)
        priced[with_prefills] = cost.predict(64)
    assert priced[True] < 4.0
    assert priced[False] > 8.0


def _reference_means(acceptance, verifies, accepted, prior):
    """Each request's expected acceptance written as the estimator reads (module docstring of
    ``policy.acceptance``), with min / max calls: what the policy's loop must equal."""
    from sglang_dynamic_eagle.policy.acceptance import REQUEST_PRIOR_VERIFIES as K
    top, long_run = acceptance.max_acceptance, acceptance.long_run_mean
    recent, recent_n = acceptance._sums[0]

    def own(n, a):
        if long_run is None:
            return top
        share = min(n, K)
        others_n = max(0.0, recent_n - share)
        others = min(top * others_n, max(others_n, recent - share * a / n))
        return (others + K * long_run) / (others_n + K)

    return [min(top, max(1.0, (a + K * own(n, a)) / (n + K))) if n > 0 else prior
            for n, a in zip(verifies, accepted)]


def test_request_means_equal_the_estimator_float_for_float() -> None:
    """The per-request loop (every request, every decode step) gives the estimator's floats
    exactly: requests before, at and after their first REQUEST_PRIOR_VERIFIES verifies, means
    clamped at 1 and at the full acceptance, a recent window holding less than a request's share
    (after a long plain stretch), and before any verify (no long-run mean)."""
    import random

    from sglang_dynamic_eagle.policy.acceptance import Acceptance
    rng = random.Random(7)
    cases = 0
    for max_acceptance in (1.0, 2.5, 4.0):
        acceptance, decode_step = Acceptance(max_acceptance), 0
        for _ in range(60):
            verifies = [rng.choice([0, 1, 2, 3, 4, 5, 9, 40]) for _ in range(24)]
            accepted = ([n * rng.choice([0.5, 1.0, 1.7, 3.0, 6.0]) for n in verifies] if rng.random() < 0.5
                        else [n + rng.randint(0, 3 * n) for n in verifies])  # ints, as the records hold
            prior = acceptance.server_mean or max_acceptance
            got = acceptance._request_means(verifies, accepted, prior)
            assert got == _reference_means(acceptance, verifies, accepted, prior)
            cases += len(verifies)
            decode_step += rng.choice([1, 1, 64])  # a long plain stretch empties the recent window
            acceptance.add_verify([rng.randint(0, 3) for _ in range(rng.randint(1, 6))], decode_step=decode_step)
    assert cases == 3 * 60 * 24
