"""The automatic policy on the cost table an H200 server measured (8B-shaped model, EAGLE-3 with
3 steps and 4 draft tokens; `/server_info` after the c=128 run of sweep b in
benchmark/results/2026-12-01-h200-dummy8b-auto-switching-acc1.6), driven by benchmark-shaped
batch-size traces: at each concurrency the steady batch must run the mode that yields more
tokens per second at the given acceptance, with few switches. The fixed thresholds that were
the default before (N=24, M=16) speculate at batch 16 with acceptance 1.6, where this table says
plain decoding is 1.4x faster: the scenario tells the two apart."""

from __future__ import annotations

import random
from typing import List

import pytest

from sglang_dynamic_eagle.auto_policy import AcceptanceEstimate, CostPolicy, CostPolicyConfig
from sglang_dynamic_eagle.cost_model import CostTable, ModeCosts, crossover_batch, speculative_gain
from sglang_dynamic_eagle.policy import (
    DecodeMode,
    StepObservation,
    ThresholdPolicy,
    ThresholdPolicyConfig,
)

SPEC = DecodeMode.SPECULATIVE
PLAIN = DecodeMode.PLAIN

PLAIN_MS = {1: 5.102, 2: 5.102, 4: 5.144, 8: 5.176, 12: 5.574, 16: 5.639, 24: 6.118, 32: 6.209,
            40: 6.325, 48: 7.931, 56: 8.02, 64: 8.159, 72: 8.311, 80: 8.449, 88: 8.519,
            96: 9.874, 104: 9.924, 112: 10.187, 120: 10.228, 128: 10.383}
SPECULATIVE_MS = {1: 7.733, 2: 7.67, 3: 8.273, 4: 8.347, 5: 8.961, 6: 8.966, 7: 8.944, 8: 9.029,
                  10: 11.663, 12: 11.749, 14: 12.363, 16: 12.492, 18: 13.132, 20: 13.249,
                  22: 13.822, 24: 14.018, 26: 14.58, 28: 14.831, 30: 15.366, 32: 15.538,
                  40: 17.259, 44: 18.249, 48: 19.414}
CATCHUP_MS = 4.673
MAX_SPECULATIVE_BATCH = 48
WAVES = 2
OUTPUT_TOKENS = 256


def measured(costs: dict) -> ModeCosts:
    buckets = tuple(sorted(costs))
    return ModeCosts(buckets, tuple(costs[b] for b in buckets), (True,) * len(buckets))


TABLE = CostTable(measured(PLAIN_MS), measured(SPECULATIVE_MS), CATCHUP_MS)


def benchmark_trace(concurrency: int, steady_steps: int) -> tuple[List[int], List[bool]]:
    """Batch sizes of `WAVES` waves of `concurrency` requests (ramp as prompts are prefilled,
    steady, drain as they finish), and which steps are steady."""
    step = max(1, concurrency // 8)
    sizes: List[int] = []
    steady: List[bool] = []
    for _ in range(WAVES):
        ramp = list(range(1, concurrency, step))
        drain = list(range(concurrency - step, 0, -step))
        sizes += ramp + [concurrency] * steady_steps + drain
        steady += [False] * len(ramp) + [True] * steady_steps + [False] * len(drain)
    return sizes, steady


def run(policy, sizes: List[int], acceptance: float) -> List[DecodeMode]:
    return [policy.decide(StepObservation(bs, TABLE, acceptance)) for bs in sizes]


def best_mode(batch: int, acceptance: float) -> DecodeMode:
    if batch > MAX_SPECULATIVE_BATCH:
        return PLAIN
    gain = speculative_gain(
        acceptance, TABLE.plain.lookup(batch).step_ms, TABLE.speculative.lookup(batch).step_ms
    )
    return SPEC if gain > 1 else PLAIN


def auto_policy(acceptance_window_steps: int = 4096) -> CostPolicy:
    return CostPolicy(
        CostPolicyConfig(
            switch_patience=4,
            max_speculative_batch=MAX_SPECULATIVE_BATCH,
            max_acceptance=4.0,
            refresh_interval=acceptance_window_steps,
        )
    )


@pytest.mark.parametrize(
    ("acceptance", "concurrency", "expected"),
    [
        (1.6, 1, SPEC), (1.6, 16, PLAIN), (1.6, 32, PLAIN), (1.6, 64, PLAIN), (1.6, 128, PLAIN),
        (3.0, 1, SPEC), (3.0, 4, SPEC), (3.0, 16, SPEC), (3.0, 32, SPEC), (3.0, 64, PLAIN),
        (3.0, 128, PLAIN),
    ],
)
def test_steady_batches_run_the_faster_mode(acceptance: float, concurrency: int, expected) -> None:
    assert best_mode(concurrency, acceptance) is expected  # what the table says
    sizes, steady = benchmark_trace(concurrency, steady_steps=int(OUTPUT_TOKENS / acceptance))
    modes = run(auto_policy(), sizes, acceptance)
    steady_modes = [mode for mode, is_steady in zip(modes, steady) if is_steady]
    # Each steady stretch may spend the patience (4 steps) on its way into the right mode.
    wrong = [mode for mode in steady_modes if mode is not expected]
    assert len(wrong) <= 4 * WAVES, (acceptance, concurrency, wrong)
    switches = sum(a is not b for a, b in zip(modes, modes[1:]))
    assert switches <= 2 * WAVES + 2, (acceptance, concurrency, switches)


def test_near_break_even_the_policy_keeps_speculating() -> None:
    # Batch 4 at acceptance 1.6: gain 0.99, inside the margin; speculation goes on.
    assert 0.97 < speculative_gain(1.6, PLAIN_MS[4], SPECULATIVE_MS[4]) < 1.0
    sizes, _ = benchmark_trace(4, steady_steps=160)
    assert set(run(auto_policy(), sizes, 1.6)) == {SPEC}


def test_crossover_moves_with_acceptance() -> None:
    assert crossover_batch(TABLE, 1.0) == 0
    assert crossover_batch(TABLE, 1.6) == 2
    assert crossover_batch(TABLE, 3.0) == 48


def test_fixed_thresholds_speculate_where_plain_decoding_is_faster() -> None:
    """The negative control: the old default speculates through the steady batch of 16."""
    sizes, steady = benchmark_trace(16, steady_steps=160)
    policy = ThresholdPolicy(ThresholdPolicyConfig(24, 16, 4, MAX_SPECULATIVE_BATCH))
    modes = [policy.decide(StepObservation(bs)) for bs in sizes]
    steady_modes = {mode for mode, is_steady in zip(modes, steady) if is_steady}
    assert best_mode(16, 1.6) is PLAIN and steady_modes == {SPEC}


def test_no_acceptance_refresh_probes_at_high_load() -> None:
    # Above the speculative graphs (batch 64) no probe is due however long plain decoding runs.
    policy = CostPolicy(
        CostPolicyConfig(switch_patience=4, max_speculative_batch=MAX_SPECULATIVE_BATCH,
                         max_acceptance=4.0, refresh_interval=64)
    )
    modes = run(policy, [64] * 2000, 1.6)
    assert set(modes) == {PLAIN} and policy.report()["probes"] == 0


# ------------------------------------------------- a close call at batch 1, with noisy verifies

# Batch-1 costs the acceptance-1.6 sweep of 2026-12-01 measured (benchmark/results/
# 2026-12-01-h200-dummy8b-auto-acc3.0-acc1.6, `/server_info` after its last run): gain
# 1.6 * 5.08 / 7.69 = 1.06, a close call where EAGLE3 delivered 1.05x plain decoding.
CLOSE_CALL_PLAIN_MS = 5.082
CLOSE_CALL_SPECULATIVE_MS = 7.69
CLOSE_CALL_CATCHUP_MS = 0.728
# The estimate the sweep's warm-up left (16-token requests): a stale 1.43 while plain.
STALE_ACCEPTANCE = 1.4345
CLOSE_CALL_STEPS = 2000
SEEDS = range(40)


def close_call_table() -> CostTable:
    def flat(ms: float) -> ModeCosts:
        return ModeCosts((1, 2, 4), (ms,) * 3, (True,) * 3)

    return CostTable(flat(CLOSE_CALL_PLAIN_MS), flat(CLOSE_CALL_SPECULATIVE_MS),
                     CLOSE_CALL_CATCHUP_MS)


def tokens_per_ms_at_batch_1(acceptance: float, seed: int, **overrides) -> float:
    """One request decoded alone; each verify accepts floor(a) or floor(a) + 1 tokens (bonus
    included) with mean ``acceptance``, as simulated acceptance does. Starts plain, with the
    warm-up's stale estimate."""
    rng = random.Random(seed)
    policy = CostPolicy(
        CostPolicyConfig(switch_patience=4, max_speculative_batch=4, max_acceptance=4.0,
                         **overrides),
        DecodeMode.PLAIN,
    )
    estimate = AcceptanceEstimate()
    estimate.add(STALE_ACCEPTANCE, 1, 0)
    table = close_call_table()
    tokens, elapsed_ms = 0, 0.0
    for step in range(1, CLOSE_CALL_STEPS + 1):
        if policy.decide(StepObservation(1, table, estimate.value)) is SPEC:
            accepted = int(acceptance) + (rng.random() < acceptance - int(acceptance))
            estimate.add_step([accepted - 1], step)
            tokens, elapsed_ms = tokens + accepted, elapsed_ms + CLOSE_CALL_SPECULATIVE_MS
        else:
            tokens, elapsed_ms = tokens + 1, elapsed_ms + CLOSE_CALL_PLAIN_MS
    return tokens / elapsed_ms


def share_of_the_better_mode(acceptance: float, **overrides) -> float:
    best = max(1 / CLOSE_CALL_PLAIN_MS, acceptance / CLOSE_CALL_SPECULATIVE_MS)
    rates = [tokens_per_ms_at_batch_1(acceptance, seed, **overrides) for seed in SEEDS]
    return sum(rates) / len(rates) / best


@pytest.mark.parametrize("acceptance", [1.3, 1.45, 1.6, 1.7, 2.0])
def test_close_calls_at_batch_1_reach_the_better_mode(acceptance: float) -> None:
    assert share_of_the_better_mode(acceptance) >= 0.97


def test_close_calls_with_only_the_long_refresh_stay_plain_where_speculation_pays() -> None:
    """The negative control: refreshing a stale acceptance only every 4096 steps (the rule
    the sweep ran with) leaves 5% on the table at acceptance 1.6 and 11% at 1.7."""
    assert share_of_the_better_mode(1.6, close_call_refresh_interval=4096) < 0.96
    assert share_of_the_better_mode(1.7, close_call_refresh_interval=4096) < 0.92


# ------------------------------- speculative graphs up to 128, on the costs of 2026-12-01

# `/server_info` after the last run of the acceptance-3.0 sweep of 2026-12-01 (benchmark/
# results/2026-12-01-h200-dummy8b-auto-acc3.0-acc1.6/sweep-acc3.0), speculative graphs to 128.
PLAIN_MS_128 = {1: 5.825, 2: 5.822, 4: 5.835, 8: 5.86, 12: 5.918, 16: 6.005, 24: 6.088,
                32: 6.164, 40: 6.318, 48: 7.923, 56: 8.005, 64: 8.175, 72: 8.315, 80: 8.442,
                88: 8.513, 96: 9.912, 104: 9.95, 112: 10.202, 120: 10.236, 128: 10.39}
SPECULATIVE_MS_128 = {1: 7.692, 2: 7.869, 3: 8.206, 4: 8.279, 5: 8.861, 6: 8.872, 7: 8.902,
                      8: 8.998, 10: 12.871, 12: 12.969, 14: 13.68, 16: 13.846, 18: 14.544,
                      20: 14.657, 22: 15.287, 24: 17.743, 26: 18.455, 28: 18.744, 30: 19.446,
                      32: 19.649, 40: 21.851, 44: 23.19, 48: 27.568, 52: 28.441, 56: 30.473,
                      60: 31.295, 64: 31.965, 72: 36.684, 80: 38.966, 88: 43.406, 96: 45.205,
                      104: 50.453, 112: 60.713, 120: 53.486, 128: 55.538}
TABLE_128 = CostTable(measured(PLAIN_MS_128), measured(SPECULATIVE_MS_128), 0.882)


@pytest.mark.parametrize(("concurrency", "expected"), [(16, SPEC), (32, PLAIN), (64, PLAIN),
                                                       (128, PLAIN)])
def test_with_graphs_to_128_the_measured_costs_bound_speculation(concurrency: int, expected) -> None:
    """At acceptance 3.0 speculation paid at batch 16 (gain 1.30) and not from 32 on (0.94,
    0.77, 0.56), although graphs reach 128: the costs, not EAGLE's cap of 48, decide."""
    policy = CostPolicy(CostPolicyConfig(switch_patience=4, max_speculative_batch=128,
                                         max_acceptance=4.0))
    sizes, steady = benchmark_trace(concurrency, steady_steps=int(OUTPUT_TOKENS / 3.0))
    modes = [policy.decide(StepObservation(bs, TABLE_128, 3.0)) for bs in sizes]
    steady_modes = [mode for mode, is_steady in zip(modes, steady) if is_steady]
    wrong = [mode for mode in steady_modes if mode is not expected]
    assert len(wrong) <= 4 * WAVES, (concurrency, wrong)
    # The server reported 44: a plain step of 44 requests runs the batch-48 graph (7.9 ms), so
    # speculation pays there again (gain 1.03) though not at 32 or 40.
    assert crossover_batch(TABLE_128, 3.0) == 44


# --------------------- a refresh probe at a wave's first lone request, on the costs of 2026-12-02

# `/server_info` of the 8B-shaped EAGLE3_DYNAMIC server before its first 128-request run of
# benchmark/results/2026-12-02-h200-interleaved-0633-non-overlap-mla-moe-soak (plain measured
# at bucket 64 only, speculative at 1 and 128; the others are estimates).
PLAIN_MS_0633 = {1: 5.924, 2: 5.943, 4: 5.963, 8: 6.027, 12: 6.083, 16: 6.184, 24: 6.252,
                 32: 6.331, 40: 6.435, 48: 6.519, 56: 6.59, 64: 6.703, 72: 6.823, 80: 6.936,
                 88: 6.995, 96: 7.182, 104: 7.216, 112: 7.413, 120: 7.438, 128: 7.533}
SPECULATIVE_MS_0633 = {1: 7.654, 2: 8.102, 3: 8.55, 4: 8.998, 5: 9.446, 6: 9.894, 7: 10.341,
                       8: 10.789, 10: 11.685, 12: 12.581, 14: 13.476, 16: 14.372, 18: 15.268,
                       20: 16.164, 22: 17.059, 24: 17.955, 26: 18.851, 28: 19.746, 30: 20.642,
                       32: 21.538, 40: 25.121, 44: 26.912, 48: 28.703, 52: 30.495, 56: 32.286,
                       60: 34.078, 64: 35.869, 72: 42.67, 80: 45.322, 88: 50.421, 96: 52.198,
                       104: 58.633, 112: 70.868, 120: 62.484, 128: 64.532}


def partly_measured(costs: dict, measured_buckets: tuple) -> ModeCosts:
    buckets = tuple(sorted(costs))
    return ModeCosts(buckets, tuple(costs[b] for b in buckets),
                     tuple(b in measured_buckets for b in buckets))


TABLE_0633 = CostTable(partly_measured(PLAIN_MS_0633, (64,)),
                       partly_measured(SPECULATIVE_MS_0633, (1, 128)), 3.43)


def test_a_speculative_probe_ends_when_the_wave_fills_the_batch() -> None:
    """A 128-request wave ends, its last request alone is plain for the close-call refresh
    interval, the next wave's first request arrives alone: a refresh probe speculates at batch 1
    (it pays there) and the rest of the wave is prefilled before the next decode step, at 128.
    The server kept the probe's 12 speculative steps (2 at batch 1, 10 at 128 of about 64 ms
    against a plain step of about 10 ms); at 128 speculation loses even with every draft
    accepted (gain 0.47), so the probe ends and the step runs plain."""
    policy = CostPolicy(CostPolicyConfig(switch_patience=4, max_speculative_batch=128,
                                         max_acceptance=4.0), DecodeMode.PLAIN)

    def observe(batch: int, steps: int) -> list:
        return [policy.decide(StepObservation(batch, TABLE_0633, 3.0)) for _ in range(steps)]

    assert observe(128, 260) == [PLAIN] * 260
    assert observe(1, 2) == [SPEC] * 2
    assert policy.probing and policy.report()["probes"] == 1
    assert observe(128, 10) == [PLAIN] * 10
    assert not policy.probing


# --------------------- a cost probe at a batch left by a wave in two groups, on the costs of 15:38

# `/server_info` of the 8B-shaped EAGLE3_DYNAMIC server before its third 64-request run of
# benchmark/results/2026-12-02-h200-interleaved-1538-512-256-and-prefill-only (plain measured
# at buckets 1, 64 and 128, speculative at 1, 16 and 128; the others are estimates).
PLAIN_MS_1538 = {1: 5.009, 2: 5.023, 4: 5.042, 8: 5.07, 12: 5.124, 16: 5.175, 24: 5.24, 32: 5.316,
                 40: 7.872, 48: 7.963, 56: 8.042, 64: 8.191, 72: 8.342, 80: 8.482, 88: 8.539,
                 96: 9.937, 104: 9.986, 112: 10.27, 120: 10.288, 128: 10.448}
SPECULATIVE_MS_1538 = {1: 7.716, 2: 8.325, 3: 8.933, 4: 9.542, 5: 10.151, 6: 10.76, 7: 11.369,
                       8: 11.978, 10: 15.696, 12: 15.803, 14: 16.662, 16: 16.849, 18: 17.69,
                       20: 18.532, 22: 19.373, 24: 20.214, 26: 21.055, 28: 21.897, 30: 22.738,
                       32: 23.579, 40: 26.945, 44: 28.627, 48: 30.31, 52: 31.992, 56: 33.675,
                       60: 35.358, 64: 37.04, 72: 42.216, 80: 44.852, 88: 49.816, 96: 51.726,
                       104: 57.79, 112: 70.137, 120: 61.732, 128: 63.962}
TABLE_1538 = CostTable(partly_measured(PLAIN_MS_1538, (1, 64, 128)),
                       partly_measured(SPECULATIVE_MS_1538, (1, 16, 128)), 2.022)


def test_a_cost_probe_at_a_wave_s_first_group_ends_as_the_rest_is_prefilled() -> None:
    """A 64-request wave reached the server in two groups: 13 requests decoded alone for a few
    steps, where the speculative cost (bucket 14) was only estimated and a close call (gain
    0.93 at acceptance 3.0), so the policy probed; the server kept the probe's 12 speculative
    steps while the rest of the wave was prefilled, up to a batch of 64. The probe now ends when
    the batch leaves bucket 14, and none starts at the buckets the growing batch passes."""
    policy = CostPolicy(CostPolicyConfig(switch_patience=4, max_speculative_batch=128,
                                         max_acceptance=4.0), DecodeMode.PLAIN)

    def observe(batches: List[int]) -> List[DecodeMode]:
        return [policy.decide(StepObservation(b, TABLE_1538, 3.0)) for b in batches]

    assert observe([64] * 200) == [PLAIN] * 200
    assert observe([13] * 3) == [SPEC] * 3
    assert observe([26, 39, 51] + [64] * 50) == [PLAIN] * 53
    assert policy.report()["probes"] == 1
