"""Tests for the fixed-threshold switching policy (pure Python, no GPU)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_dynamic_eagle.config import derived_enable_threshold
from sglang_dynamic_eagle.policy import (
    DEFAULT_SWITCH_PATIENCE,
    DecodeMode,
    StepObservation,
    ThresholdPolicy,
    ThresholdPolicyConfig,
)

SPEC = DecodeMode.SPECULATIVE
PLAIN = DecodeMode.PLAIN
SwitchPolicyConfig = ThresholdPolicyConfig

N, M, K = 24, 16, 4


class SwitchPolicy:
    """A ThresholdPolicy fed batch sizes, counting its switches as the worker does."""

    def __init__(self, config: SwitchPolicyConfig, initial: DecodeMode = SPEC) -> None:
        self._policy = ThresholdPolicy(config, initial)
        self.switches_to_plain = 0
        self.switches_to_speculative = 0

    @property
    def mode(self) -> DecodeMode:
        return self._policy.mode

    @property
    def config(self) -> SwitchPolicyConfig:
        return self._policy.config

    def observe(self, batch_size: int) -> DecodeMode:
        before = self._policy.mode
        mode = self._policy.decide(StepObservation(batch_size))
        if mode is not before:
            if mode is PLAIN:
                self.switches_to_plain += 1
            else:
                self.switches_to_speculative += 1
        return mode


def make(
    n: int = N,
    m: int = M,
    k: int = K,
    cap: int = 256,
    initial: DecodeMode = SPEC,
) -> SwitchPolicy:
    return SwitchPolicy(SwitchPolicyConfig(n, m, k, cap), initial)


def feed(policy: SwitchPolicy, sizes: list[int]) -> list[DecodeMode]:
    return [policy.observe(bs) for bs in sizes]


def to_plain(policy: SwitchPolicy) -> None:
    """Drive a SPECULATIVE policy to PLAIN through the threshold, not the graph limit."""
    n = policy.config.disable_batch_threshold
    feed(policy, [n + 1] * policy.config.switch_patience)
    assert policy.mode is PLAIN


def switch_steps(initial: DecodeMode, modes: list[DecodeMode]) -> list[int]:
    before = [initial] + modes[:-1]
    return [i for i, (a, b) in enumerate(zip(before, modes)) if a is not b]


# --------------------------------------------------------------------------- defaults


def test_threshold_24_forms_a_valid_band() -> None:
    config = SwitchPolicyConfig(
        24,
        derived_enable_threshold(24),
        DEFAULT_SWITCH_PATIENCE,
        max_speculative_batch=64,
    )
    assert 0 < config.enable_batch_threshold < config.disable_batch_threshold
    assert config.switch_patience >= 1


# --------------------------------------------------------------------------- basics


def test_initial_mode_and_properties() -> None:
    config = SwitchPolicyConfig(N, M, K, 64)
    assert SwitchPolicy(config).mode is SPEC
    policy = SwitchPolicy(config, PLAIN)
    assert policy.mode is PLAIN
    assert policy.config is config
    assert (policy.switches_to_plain, policy.switches_to_speculative) == (0, 0)


def test_observe_returns_mode_and_mode_tracks_it() -> None:
    policy = make()
    for bs in [1, 30, 30, 30, 30, 5, 5, 5, 5]:
        assert policy.observe(bs) is policy.mode


def test_negative_batch_size_rejected() -> None:
    policy = make()
    with pytest.raises(ValueError, match="batch_size"):
        policy.observe(-1)
    assert policy.mode is SPEC


def test_batch_size_zero_counts_as_small() -> None:
    policy = make()
    # In SPECULATIVE mode a zero batch interrupts a disable streak.
    assert feed(policy, [N + 1] * (K - 1) + [0] + [N + 1] * (K - 1)) == [SPEC] * (2 * K - 1)
    to_plain(policy)
    # In PLAIN mode zero batches count towards re-enabling.
    assert feed(policy, [0] * K) == [PLAIN] * (K - 1) + [SPEC]


def test_config_is_frozen() -> None:
    config = SwitchPolicyConfig(N, M, K, 64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.switch_patience = 1  # type: ignore[misc]


def test_report_names_the_policy_and_its_settings() -> None:
    policy = ThresholdPolicy(SwitchPolicyConfig(N, M, K, 64))
    assert policy.max_speculative_batch == 64
    assert policy.report() == {
        "policy": "threshold",
        "disable_batch_threshold": N,
        "enable_batch_threshold": M,
        "switch_patience": K,
        "max_speculative_graph_batch": 64,
    }


def test_only_the_batch_size_counts() -> None:
    """KV tokens, the queue and the requests' acceptance and remaining tokens are the
    automatic policy's inputs; the thresholds ignore them."""
    sizes = [1, 30, 30, 30, 30, 5, 5, 5, 5, 300, 2]
    bare = ThresholdPolicy(SwitchPolicyConfig(N, M, K, 256))
    full = ThresholdPolicy(SwitchPolicyConfig(N, M, K, 256))
    for step, bs in enumerate(sizes, start=1):
        rich = StepObservation(bs, kv_tokens=10**6, queued=500 if bs < 10 else 0,
                               verifies=[3] * bs, accepted=[12] * bs, remaining=[1] * bs,
                               step=step)
        assert full.decide(rich) is bare.decide(StepObservation(bs))


# --------------------------------------------------------------------------- hysteresis band


@pytest.mark.parametrize("bs", [M + 1, (M + N) // 2, N])
def test_band_keeps_speculative(bs: int) -> None:
    policy = make()
    assert feed(policy, [bs] * 50) == [SPEC] * 50
    assert policy.switches_to_plain == 0


@pytest.mark.parametrize("bs", [M + 1, (M + N) // 2, N])
def test_band_keeps_plain(bs: int) -> None:
    policy = make()
    to_plain(policy)
    assert feed(policy, [bs] * 50) == [PLAIN] * 50
    assert policy.switches_to_speculative == 0


def test_band_step_interrupts_both_streaks() -> None:
    band = (M + N) // 2
    policy = make()
    assert feed(policy, [N + 1] * (K - 1) + [band] + [N + 1] * (K - 1)) == [SPEC] * (2 * K - 1)
    assert policy.observe(N + 1) is PLAIN
    assert feed(policy, [M] * (K - 1) + [band] + [M] * (K - 1)) == [PLAIN] * (2 * K - 1)
    assert policy.observe(M) is SPEC


# --------------------------------------------------------------------------- patience


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_disable_needs_exactly_k_steps(k: int) -> None:
    policy = make(k=k)
    assert feed(policy, [N + 1] * (k - 1)) == [SPEC] * (k - 1)
    assert policy.observe(N + 1) is PLAIN
    assert policy.switches_to_plain == 1


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_enable_needs_exactly_k_steps(k: int) -> None:
    policy = make(k=k, initial=PLAIN)
    assert feed(policy, [M] * (k - 1)) == [PLAIN] * (k - 1)
    assert policy.observe(M) is SPEC
    assert policy.switches_to_speculative == 1


@pytest.mark.parametrize("k", [2, 4, 7])
def test_interrupted_disable_streak_restarts(k: int) -> None:
    policy = make(k=k)
    sizes = ([N + 1] * (k - 1) + [N]) * 5 + [N + 1] * (k - 1)
    assert feed(policy, sizes) == [SPEC] * len(sizes)
    assert policy.observe(N + 1) is PLAIN


@pytest.mark.parametrize("k", [2, 4, 7])
def test_interrupted_enable_streak_restarts(k: int) -> None:
    policy = make(k=k, initial=PLAIN)
    sizes = ([M] * (k - 1) + [M + 1]) * 5 + [M] * (k - 1)
    assert feed(policy, sizes) == [PLAIN] * len(sizes)
    assert policy.observe(M) is SPEC


def test_streak_resets_on_switch() -> None:
    # After switching to PLAIN, steps before the switch must not count towards the way back.
    policy = make()
    feed(policy, [M] * (K - 1))
    to_plain(policy)
    assert feed(policy, [M] * (K - 1)) == [PLAIN] * (K - 1)
    assert policy.observe(M) is SPEC
    # And after switching back, the way out needs K fresh steps again.
    assert feed(policy, [N + 1] * (K - 1)) == [SPEC] * (K - 1)
    assert policy.observe(N + 1) is PLAIN


# --------------------------------------------------------------------------- bursts


def test_burst_1_200_1() -> None:
    policy = make(cap=48)
    assert policy.observe(1) is SPEC
    assert policy.observe(200) is PLAIN  # over the graph limit: no patience
    assert feed(policy, [1] * (K - 1)) == [PLAIN] * (K - 1)
    assert policy.observe(1) is SPEC
    assert (policy.switches_to_plain, policy.switches_to_speculative) == (1, 1)


def test_burst_during_enable_streak_resets_it() -> None:
    policy = make(cap=48, initial=PLAIN)
    assert feed(policy, [1] * (K - 1) + [200] + [1] * (K - 1)) == [PLAIN] * (2 * K - 1)
    assert policy.observe(1) is SPEC


def test_short_bursts_above_n_do_not_switch() -> None:
    policy = make(cap=48)
    sizes = ([1] * 10 + [40] * (K - 1)) * 10
    assert feed(policy, sizes) == [SPEC] * len(sizes)


# --------------------------------------------------------------------------- oscillation


@pytest.mark.parametrize("k", [2, 4])
def test_oscillation_around_disable_threshold_never_switches(k: int) -> None:
    policy = make(k=k)
    assert feed(policy, [N, N + 1] * 100) == [SPEC] * 200


@pytest.mark.parametrize("k", [2, 4])
def test_oscillation_around_enable_threshold_never_switches(k: int) -> None:
    policy = make(k=k)
    to_plain(policy)
    assert feed(policy, [M, M + 1] * 100) == [PLAIN] * 200


def test_oscillation_without_band_never_switches() -> None:
    # M == N: no band, so patience alone must prevent flapping.
    policy = make(n=20, m=20, k=3)
    assert feed(policy, [20, 21, 21] * 50) == [SPEC] * 150
    policy = make(n=20, m=20, k=3, initial=PLAIN)
    assert feed(policy, [20, 20, 21] * 50) == [PLAIN] * 150


def test_no_flapping_faster_than_patience() -> None:
    policy = make(k=K)
    assert feed(policy, ([1] * (K - 1) + [100] * (K - 1)) * 30) == [SPEC] * (60 * (K - 1))
    # Square wave with half-period K: switches at most once per K steps, never faster.
    policy = make(k=K)
    sizes = ([100] * K + [1] * K) * 10
    steps = switch_steps(SPEC, feed(policy, sizes))
    assert steps == list(range(K - 1, len(sizes), K))


# --------------------------------------------------------------------------- N == 0


def test_threshold_zero_always_speculates_within_graph_limit() -> None:
    policy = make(n=0, m=0, cap=32)
    sizes = list(range(0, 33)) * 5 + [32] * 100
    assert feed(policy, sizes) == [SPEC] * len(sizes)
    assert policy.switches_to_plain == 0


def test_threshold_zero_ignores_m_and_reenables_up_to_graph_limit() -> None:
    policy = make(n=0, m=100, cap=32)  # M > N is allowed when N == 0 and is ignored
    assert policy.observe(33) is PLAIN
    assert feed(policy, [32] * (K - 1)) == [PLAIN] * (K - 1)
    assert policy.observe(32) is SPEC


def test_threshold_zero_with_enable_threshold_zero_reenables_at_graph_limit() -> None:
    policy = make(n=0, m=0, cap=32, initial=PLAIN)
    assert feed(policy, [32] * K) == [PLAIN] * (K - 1) + [SPEC]


# --------------------------------------------------------------------------- graph limit


def test_graph_limit_is_immediate_and_inclusive() -> None:
    policy = make(n=24, m=16, cap=8)  # N above the graph limit: the limit governs
    assert feed(policy, [8] * 20) == [SPEC] * 20
    assert policy.observe(9) is PLAIN
    assert policy.switches_to_plain == 1


def test_graph_limit_caps_enable_threshold() -> None:
    policy = make(n=24, m=16, cap=8, initial=PLAIN)
    # 9..16 are <= M but above the graph limit: they never count towards re-enabling.
    assert feed(policy, [12] * 20) == [PLAIN] * 20
    assert feed(policy, [8] * (K - 1) + [9] + [8] * (K - 1)) == [PLAIN] * (2 * K - 1)
    assert policy.observe(8) is SPEC


def test_graph_limit_while_plain_is_not_a_switch() -> None:
    policy = make(cap=48, initial=PLAIN)
    assert feed(policy, [200] * 5) == [PLAIN] * 5
    assert (policy.switches_to_plain, policy.switches_to_speculative) == (0, 0)


# --------------------------------------------------------------------------- validation

DISABLE_FLAG = "--speculative-disable-batch-threshold"
ENABLE_FLAG = "--speculative-enable-batch-threshold"
PATIENCE_FLAG = "--speculative-switch-patience"
GRAPH_NAME = "max_speculative_batch (largest speculative CUDA-graph batch)"

VALID = dict(
    disable_batch_threshold=N,
    enable_batch_threshold=M,
    switch_patience=K,
    max_speculative_batch=64,
)


@pytest.mark.parametrize(
    ("field", "value", "names"),
    [
        ("disable_batch_threshold", -1, [DISABLE_FLAG]),
        ("disable_batch_threshold", True, [DISABLE_FLAG]),
        ("disable_batch_threshold", 24.0, [DISABLE_FLAG]),
        ("enable_batch_threshold", -1, [ENABLE_FLAG]),
        ("enable_batch_threshold", False, [ENABLE_FLAG]),
        ("enable_batch_threshold", "16", [ENABLE_FLAG]),
        ("enable_batch_threshold", 25, [ENABLE_FLAG, DISABLE_FLAG]),
        ("switch_patience", 0, [PATIENCE_FLAG]),
        ("switch_patience", -3, [PATIENCE_FLAG]),
        ("switch_patience", True, [PATIENCE_FLAG]),
        ("switch_patience", None, [PATIENCE_FLAG]),
        ("max_speculative_batch", 0, [GRAPH_NAME]),
        ("max_speculative_batch", True, [GRAPH_NAME]),
        ("max_speculative_batch", 1.5, [GRAPH_NAME]),
    ],
)
def test_config_validation(field: str, value: object, names: list[str]) -> None:
    with pytest.raises(ValueError) as excinfo:
        SwitchPolicyConfig(**{**VALID, field: value})
    message = str(excinfo.value)
    assert "\n" not in message
    for name in names:
        assert name in message
    assert repr(value) in message or str(value) in message


@pytest.mark.parametrize(
    ("n", "m", "k", "cap"),
    [(0, 0, 1, 1), (0, 1000, 1, 1), (24, 24, 1, 1), (24, 0, 9, 512), (1, 1, 1, 1)],
)
def test_config_accepts_edge_values(n: int, m: int, k: int, cap: int) -> None:
    SwitchPolicyConfig(n, m, k, cap)


# --------------------------------------------------------------------------- properties


def enable_limit(config: SwitchPolicyConfig) -> int:
    if config.disable_batch_threshold == 0:
        return config.max_speculative_batch
    return min(config.enable_batch_threshold, config.max_speculative_batch)


def reference_modes(
    config: SwitchPolicyConfig, initial: DecodeMode, sizes: list[int]
) -> list[DecodeMode]:
    """Independent model: no counters, just look back over the last K steps since the last switch."""
    n, k, cap = config.disable_batch_threshold, config.switch_patience, config.max_speculative_batch
    limit = enable_limit(config)
    mode, last_switch, modes = initial, -1, []
    for i, bs in enumerate(sizes):
        window = sizes[max(last_switch + 1, i - k + 1) : i + 1]
        if mode is SPEC:
            leave = bs > cap or (n > 0 and len(window) == k and min(window) > n)
        else:
            leave = len(window) == k and max(window) <= limit
        if leave:
            mode, last_switch = (PLAIN if mode is SPEC else SPEC), i
        modes.append(mode)
    return modes


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[SwitchPolicyConfig, DecodeMode, list[int]]:
    """A config plus a sequence of runs of equal batch sizes, biased to threshold edges and to
    run lengths around the patience, where off-by-one and reset bugs show."""
    cap = draw(st.integers(1, 64))
    n = 0 if draw(st.integers(0, 3)) == 0 else draw(st.integers(1, cap + 4))  # N == 0 often
    m = draw(st.integers(0, n)) if n > 0 else draw(st.integers(0, 80))
    k = draw(st.integers(1, 6))
    config = SwitchPolicyConfig(n, m, k, cap)
    initial = draw(st.sampled_from(DecodeMode))
    # Both sides of every threshold, plus one value inside each range they delimit.
    values = (0, 1, m // 2, m - 1, m, m + 1, (m + n) // 2, n, n + 1, (n + cap) // 2, cap, cap + 1, 200)
    value = st.sampled_from(sorted({v for v in values if v >= 0}))
    length = st.sampled_from([k] * 4 + [max(1, k - 1), k + 1] + list(range(1, 2 * k + 2)))
    runs = draw(st.lists(st.tuples(value, length), min_size=10, max_size=30))
    return config, initial, [v for v, run in runs for _ in range(run)]


def run_scenario(
    scenario: tuple[SwitchPolicyConfig, DecodeMode, list[int]],
) -> tuple[SwitchPolicy, list[DecodeMode]]:
    config, initial, sizes = scenario
    policy = SwitchPolicy(config, initial)
    return policy, feed(policy, sizes)


def trailing_run(sizes: list[int], start: int, end: int, qualifies: Callable[[int], bool]) -> int:
    """Length of the run of qualifying sizes ending at index `end`, not reaching before `start`."""
    length = 0
    for i in range(end, start - 1, -1):
        if not qualifies(sizes[i]):
            break
        length += 1
    return length


PROPERTY_SETTINGS = settings(max_examples=150, deadline=None)


@PROPERTY_SETTINGS
@given(scenarios())
def test_property_never_speculative_above_graph_limit(scenario) -> None:
    config, _, sizes = scenario
    _, modes = run_scenario(scenario)
    for bs, mode in zip(sizes, modes):
        if bs > config.max_speculative_batch:
            assert mode is PLAIN


def switches_to(mode: DecodeMode, scenario, qualifies: Callable[[int], bool]):
    """(step, run of qualifying batch sizes that ends there, not reaching before the previous
    switch) of every switch to ``mode`` in ``scenario``."""
    _, initial, sizes = scenario
    _, modes = run_scenario(scenario)
    previous = -1
    for i in switch_steps(initial, modes):
        if modes[i] is mode:
            yield i, trailing_run(sizes, previous + 1, i, qualifies)
        previous = i


@PROPERTY_SETTINGS
@given(scenarios())
def test_property_enable_needs_exactly_k_qualifying_steps(scenario) -> None:
    config, _, sizes = scenario
    limit = enable_limit(config)
    for i, run in switches_to(SPEC, scenario, lambda bs: bs <= limit):
        assert run == config.switch_patience, (i, sizes[: i + 1])


@PROPERTY_SETTINGS
@given(scenarios())
def test_property_disable_is_graph_limit_or_k_steps_above_n(scenario) -> None:
    config, _, sizes = scenario
    n = config.disable_batch_threshold
    for i, run in switches_to(PLAIN, scenario, lambda bs: bs > n):
        if sizes[i] <= config.max_speculative_batch:
            assert n > 0, (i, sizes[: i + 1])
            assert run == config.switch_patience, (i, sizes[: i + 1])


@PROPERTY_SETTINGS
@given(scenarios())
def test_property_matches_reference(scenario) -> None:
    config, initial, sizes = scenario
    _, modes = run_scenario(scenario)
    assert modes == reference_modes(config, initial, sizes)


@PROPERTY_SETTINGS
@given(scenarios())
def test_property_counters_match_mode_changes(scenario) -> None:
    _, initial, _ = scenario
    policy, modes = run_scenario(scenario)
    steps = switch_steps(initial, modes)
    assert policy.switches_to_plain == sum(modes[i] is PLAIN for i in steps)
    assert policy.switches_to_speculative == sum(modes[i] is SPEC for i in steps)
    assert policy.mode is (modes[-1] if modes else initial)


@PROPERTY_SETTINGS
@given(scenarios())
def test_property_band_steps_never_switch(scenario) -> None:
    config, initial, sizes = scenario
    _, modes = run_scenario(scenario)
    n, m = config.disable_batch_threshold, config.enable_batch_threshold
    if n == 0:
        return
    for i in switch_steps(initial, modes):
        assert not (m < sizes[i] <= min(n, config.max_speculative_batch)), (i, sizes[: i + 1])
