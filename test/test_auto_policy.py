"""Tests for the automatic (cost-based) switching policy and the acceptance estimate.

Pure Python, no GPU: cost tables are built directly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_dynamic_eagle.auto_policy import (
    DEFAULT_DECISIVE_BAND,
    AcceptanceEstimate,
    CostPolicy,
    CostPolicyConfig,
    max_accepted_tokens,
)
from sglang_dynamic_eagle.cost_model import CostTable, ModeCosts, speculative_gain
from sglang_dynamic_eagle.policy import PATIENCE_FLAG, DecodeMode, StepObservation

SPEC = DecodeMode.SPECULATIVE
PLAIN = DecodeMode.PLAIN

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48)
CAP = 48  # the largest speculative graph: equal to the last bucket
K = 4
MAX_ACCEPTANCE = 4.0
NO_DECISIVE_SWITCHES = 1e9  # a decisive band no gain leaves


# --------------------------------------------------------------------------- helpers


def mode_costs(
    step_ms: Mapping[int, float | None], unmeasured: Sequence[int] = ()
) -> ModeCosts:
    """Costs per bucket (ascending keys); every bucket measured except ``unmeasured``."""
    buckets = tuple(sorted(step_ms))
    return ModeCosts(
        buckets=buckets,
        step_ms=tuple(step_ms[b] for b in buckets),
        measured=tuple(b not in unmeasured for b in buckets),
    )


def measured_table(
    plain: Mapping[int, float | None],
    speculative: Mapping[int, float | None],
    catchup_ms: float = 0.0,
) -> CostTable:
    """A table where every bucket of both modes is measured."""
    return CostTable(mode_costs(plain), mode_costs(speculative), catchup_ms)


def flat_table(
    plain_ms: float, spec_ms: float, catchup_ms: float = 0.0, buckets: Sequence[int] = BUCKETS
) -> CostTable:
    """The same costs at every bucket: the gain depends only on the acceptance."""
    return measured_table(
        {b: plain_ms for b in buckets}, {b: spec_ms for b in buckets}, catchup_ms
    )


def config(**overrides: object) -> CostPolicyConfig:
    values: dict[str, object] = dict(
        switch_patience=K,
        max_speculative_batch=CAP,
        max_acceptance=MAX_ACCEPTANCE,
        probe_steps=0,  # probes off unless a test asks for them
        decisive_band=NO_DECISIVE_SWITCHES,  # so is switching without the patience
    )
    values.update(overrides)
    return CostPolicyConfig(**values)  # type: ignore[arg-type]


def make(initial: DecodeMode = SPEC, **overrides: object) -> CostPolicy:
    return CostPolicy(config(**overrides), initial)


def feed(
    policy: CostPolicy,
    sizes: Sequence[int],
    costs: CostTable | None,
    acceptance: float | None,
) -> list[DecodeMode]:
    return [policy.decide(StepObservation(bs, costs, acceptance)) for bs in sizes]


def feed_probing(
    policy: CostPolicy, sizes: Sequence[int], costs: CostTable | None, acceptance: float | None
) -> list[tuple[DecodeMode, bool]]:
    """(mode, policy.probing after the step) per step."""
    out = []
    for bs in sizes:
        mode = policy.decide(StepObservation(bs, costs, acceptance))
        out.append((mode, policy.probing))
    return out


def switch_steps(initial: DecodeMode, modes: Sequence[DecodeMode]) -> list[int]:
    before = [initial, *modes[:-1]]
    return [i for i, (a, b) in enumerate(zip(before, modes)) if a is not b]


# --------------------------------------------------------------------------- basics


def test_initial_mode_and_properties() -> None:
    cfg = config()
    assert CostPolicy(cfg).mode is SPEC
    policy = CostPolicy(cfg, PLAIN)
    assert policy.mode is PLAIN
    assert policy.config is cfg
    assert policy.max_speculative_batch == CAP
    assert not policy.probing


def test_decide_returns_mode_and_mode_tracks_it() -> None:
    policy = make()
    table = flat_table(10.0, 10.0)
    for bs, acceptance in [(1, 2.0), (8, 0.5), (8, 0.5), (100, 3.0), (4, 3.0), (4, 3.0)]:
        assert policy.decide(StepObservation(bs, table, acceptance)) is policy.mode


def test_report() -> None:
    policy = make(margin=0.05)
    assert policy.report() == {
        "policy": "auto",
        "switch_patience": K,
        "margin": 0.05,
        "max_speculative_graph_batch": CAP,
        "probes": 0,
        "last_gain": 0.0,
    }
    feed(policy, [4], flat_table(10.0, 12.0), 1.5)
    assert policy.report()["last_gain"] == round(1.5 * 10.0 / 12.0, 4)


def test_config_is_frozen() -> None:
    cfg = config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.margin = 0.5  # type: ignore[misc]


# --------------------------------------------------------------------------- leaving / entering


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_leave_speculation_after_exactly_k_steps_below_margin(k: int) -> None:
    policy = make(switch_patience=k, margin=0.03)
    table = flat_table(10.0, 10.0)
    acceptance = 0.96  # gain 0.96 < 1 - 0.03
    assert feed(policy, [8] * (k - 1), table, acceptance) == [SPEC] * (k - 1)
    assert feed(policy, [8], table, acceptance) == [PLAIN]


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_enter_speculation_after_exactly_k_steps_above_margin(k: int) -> None:
    policy = make(PLAIN, switch_patience=k, margin=0.03)
    table = flat_table(10.0, 10.0)
    acceptance = 1.04  # gain 1.04 > 1 + 0.03, no catch-up
    assert feed(policy, [8] * (k - 1), table, acceptance) == [PLAIN] * (k - 1)
    assert feed(policy, [8], table, acceptance) == [SPEC]


def test_thresholds_are_strict() -> None:
    # margin 0.5 and exactly representable gains: 1.0 * 5 / 10 == 0.5 == 1 - margin and
    # 1.5 * 10 / 10 == 1.5 == 1 + margin. Neither leaves nor enters.
    assert feed(make(margin=0.5), [8] * 50, flat_table(5.0, 10.0), 1.0) == [SPEC] * 50
    assert feed(make(PLAIN, margin=0.5), [8] * 50, flat_table(10.0, 10.0), 1.5) == [PLAIN] * 50


@pytest.mark.parametrize("gain", [0.975, 0.99, 1.0, 1.01, 1.025])
@pytest.mark.parametrize("initial", [SPEC, PLAIN])
def test_gain_inside_margin_keeps_either_mode(gain: float, initial: DecodeMode) -> None:
    policy = make(initial, margin=0.03)
    assert feed(policy, [8] * 200, flat_table(10.0, 10.0), gain) == [initial] * 200


def test_gain_formula_acceptance_times_plain_over_speculative() -> None:
    # plain 6 ms, speculative 9 ms: the gain is a * 6 / 9; it crosses 1 - margin (0.9) at
    # a = 1.35 and 1 + margin (1.1) at a = 1.65.
    table = flat_table(6.0, 9.0)
    for acceptance, expect_leave in [(1.30, True), (1.40, False)]:
        modes = feed(make(margin=0.1), [8] * K, table, acceptance)
        assert (modes[-1] is PLAIN) is expect_leave, acceptance
    for acceptance, expect_enter in [(1.60, False), (1.70, True)]:
        modes = feed(make(PLAIN, margin=0.1), [8] * K, table, acceptance)
        assert (modes[-1] is SPEC) is expect_enter, acceptance


def test_entry_gain_includes_catchup_over_horizon() -> None:
    # plain 10, speculative 8, acceptance 1: gain 1.25. The entry adds catchup / horizon to the
    # speculative cost: 8 + 64 * c / 64 = 8 + c. Entry needs 10 / (8 + c) > 1.03, c < 1.7087.
    for catchup_ms, enters in [(64 * 1.65, True), (64 * 1.75, False)]:
        table = flat_table(10.0, 8.0, catchup_ms=catchup_ms)
        policy = make(PLAIN, catchup_horizon_steps=64)
        modes = feed(policy, [8] * (3 * K), table, 1.0)
        if enters:
            assert modes == [PLAIN] * (K - 1) + [SPEC] * (2 * K + 1)
        else:
            assert modes == [PLAIN] * (3 * K)
    # The horizon divides the catch-up: the same 112 ms over 128 steps is cheap enough.
    policy = make(PLAIN, catchup_horizon_steps=128)
    modes = feed(policy, [8] * K, flat_table(10.0, 8.0, catchup_ms=64 * 1.75), 1.0)
    assert modes[-1] is SPEC


def test_catchup_does_not_affect_leaving() -> None:
    # Already speculating: the catch-up is paid, so only the plain gain counts.
    table = flat_table(10.0, 8.0, catchup_ms=10_000.0)
    assert feed(make(), [8] * 100, table, 1.0) == [SPEC] * 100


def test_interrupted_leave_streak_restarts() -> None:
    table = measured_table(
        {b: 10.0 for b in BUCKETS}, {**{b: 10.0 for b in BUCKETS}, 16: 5.0}
    )  # at acceptance 0.9: gain 0.9 at bucket 8, 1.8 at bucket 16
    policy = make()
    sizes = ([8] * (K - 1) + [16]) * 10 + [8] * (K - 1)
    assert feed(policy, sizes, table, 0.9) == [SPEC] * len(sizes)
    assert feed(policy, [8], table, 0.9) == [PLAIN]


def test_interrupted_enter_streak_restarts() -> None:
    table = measured_table(
        {b: 10.0 for b in BUCKETS}, {**{b: 5.0 for b in BUCKETS}, 16: 50.0}
    )  # gain 2 at bucket 8, 0.2 at bucket 16
    policy = make(PLAIN)
    sizes = ([8] * (K - 1) + [16]) * 10 + [8] * (K - 1)
    assert feed(policy, sizes, table, 1.0) == [PLAIN] * len(sizes)
    assert feed(policy, [8], table, 1.0) == [SPEC]


def test_gain_follows_batch_bucket() -> None:
    # Speculation pays at small buckets, is a close call at bucket 8 and does not pay at 32.
    plain = {b: 5.0 + 0.2 * b for b in BUCKETS}
    spec = {b: 5.5 + 0.8 * b for b in BUCKETS}
    table = measured_table(plain, spec)
    acceptance = 1.8
    # bucket 8: 1.8 * 6.6 / 11.9 = 0.998 (inside margin); bucket 4: 1.8 * 5.8 / 8.7 = 1.2
    # bucket 32: 1.8 * 11.4 / 31.1 = 0.66 (leave)
    policy = make()
    modes = feed(policy, [3] * 10 + [8] * 10 + [30] * 10, table, acceptance)
    assert modes == [SPEC] * 10 + [SPEC] * 10 + [SPEC] * (K - 1) + [PLAIN] * (11 - K)
    assert feed(policy, [4] * K, table, acceptance) == [PLAIN] * (K - 1) + [SPEC]


# --------------------------------------------------------------------------- graph limit


def test_graph_limit_is_immediate() -> None:
    table = flat_table(10.0, 5.0)  # speculation pays at every bucket
    policy = make()
    assert feed(policy, [CAP] * 20, table, 2.0) == [SPEC] * 20
    assert feed(policy, [CAP + 1], table, 2.0) == [PLAIN]
    # Back below the limit: the ordinary patience applies.
    assert feed(policy, [CAP] * K, table, 2.0) == [PLAIN] * (K - 1) + [SPEC]


def test_graph_limit_without_costs_and_with_acceptance_none() -> None:
    policy = make()
    assert feed(policy, [CAP + 1], None, None) == [PLAIN]
    assert feed(policy, [1] * 50, None, None) == [PLAIN] * 50


def test_graph_limit_resets_enter_streak() -> None:
    table = flat_table(10.0, 5.0)
    policy = make(PLAIN)
    sizes = [4] * (K - 1) + [CAP + 1] + [4] * (K - 1)
    assert feed(policy, sizes, table, 2.0) == [PLAIN] * len(sizes)
    assert feed(policy, [4], table, 2.0) == [SPEC]


def test_graph_limit_cancels_a_probe() -> None:
    flat = {b: 10.0 for b in BUCKETS}
    table = CostTable(mode_costs(flat, unmeasured=[8]), mode_costs(flat))
    policy = make(probe_steps=6, switch_patience=1)
    assert feed(policy, [8], table, 1.1) == [PLAIN]
    assert policy.probing
    assert feed(policy, [CAP + 1], table, 1.1) == [PLAIN]
    assert not policy.probing
    # The probe is over: with patience 1 the next step goes back to speculation.
    assert feed(policy, [8], table, 1.1) == [SPEC]


# --------------------------------------------------------------------------- missing inputs


@pytest.mark.parametrize("initial", [SPEC, PLAIN])
def test_costs_none_keeps_mode(initial: DecodeMode) -> None:
    policy = make(initial, probe_steps=8, refresh_interval=1)
    sizes = [1, 4, 16, CAP] * 30
    assert feed(policy, sizes, None, 0.5) == [initial] * len(sizes)
    assert feed(policy, sizes, None, None) == [initial] * len(sizes)
    assert policy.report()["probes"] == 0


def test_costs_none_does_not_break_a_streak() -> None:
    # Steps without a table neither count nor reset the patience streak.
    table = flat_table(10.0, 10.0)
    policy = make()
    assert feed(policy, [8] * (K - 1), table, 0.5) == [SPEC] * (K - 1)
    assert feed(policy, [8] * 5, None, 0.5) == [SPEC] * 5
    assert feed(policy, [8], table, 0.5) == [PLAIN]


def test_acceptance_none_assumes_max_acceptance() -> None:
    # plain 10, speculative 30: gain 4/3 at max acceptance 4, 0.5 at acceptance 1.5.
    table = flat_table(10.0, 30.0)
    assert feed(make(), [8] * 50, table, None) == [SPEC] * 50
    assert feed(make(PLAIN), [8] * K, table, None) == [PLAIN] * (K - 1) + [SPEC]
    assert feed(make(), [8] * 50, table, None) == feed(make(), [8] * 50, table, MAX_ACCEPTANCE)
    # At max acceptance 2.5 the same table gives gain 0.83: leave.
    modes = feed(make(max_acceptance=2.5), [8] * K, table, None)
    assert modes == [SPEC] * (K - 1) + [PLAIN]
    policy = make()
    feed(policy, [8], table, None)
    assert policy.report()["last_gain"] == round(MAX_ACCEPTANCE * 10.0 / 30.0, 4)


# --------------------------------------------------------------------------- probes

P = 5  # probe steps in the probe tests
R = 60  # refresh interval in the probe tests


def plain_unmeasured_table(gain_at_16: float, acceptance: float = 1.0) -> CostTable:
    """Speculative costs measured everywhere; plain cost at bucket 16 only estimated, with
    gain ``gain_at_16`` there; elsewhere a clear gain of 2 (measured)."""
    plain = {b: 10.0 for b in BUCKETS}
    spec = {b: 5.0 * acceptance for b in BUCKETS}
    spec[16] = 10.0 * acceptance / gain_at_16
    return CostTable(mode_costs(plain, unmeasured=[16]), mode_costs(spec))


@pytest.mark.parametrize("probe_steps", [1, 2, P])
def test_probe_of_unmeasured_plain_cost_runs_probe_steps(probe_steps: int) -> None:
    table = plain_unmeasured_table(gain_at_16=1.1)
    policy = make(probe_steps=probe_steps, refresh_interval=R, switch_patience=1)
    steps = feed_probing(policy, [16] * (probe_steps + 3), table, 1.0)
    assert [mode for mode, _ in steps] == [PLAIN] * probe_steps + [SPEC] * 3
    # Probing through the probe's last step; the step after it returns to speculation.
    assert [probing for _, probing in steps] == [True] * probe_steps + [False] * 3
    assert policy.report()["probes"] == 1


def test_probe_of_plain_not_repeated_within_refresh_interval() -> None:
    table = plain_unmeasured_table(gain_at_16=1.1)
    policy = make(probe_steps=P, refresh_interval=R, switch_patience=1)
    modes = feed(policy, [16] * (2 * R + P), table, 1.0)
    # Probe at step 1, next probe of (plain, 16) at step 1 + R, then at 1 + 2R.
    expected = ([PLAIN] * P + [SPEC] * (R - P)) * 2 + [PLAIN] * P
    assert modes == expected
    assert policy.report()["probes"] == 3


def test_probe_is_per_bucket() -> None:
    plain = {b: 10.0 for b in BUCKETS}
    spec = {b: 10 / 1.1 for b in BUCKETS}
    table = CostTable(mode_costs(plain, unmeasured=[16, 24]), mode_costs(spec))
    policy = make(probe_steps=P, refresh_interval=R, switch_patience=1)
    assert feed(policy, [16] * (P + 1), table, 1.0) == [PLAIN] * P + [SPEC]
    assert feed(policy, [16] * 5, table, 1.0) == [SPEC] * 5  # (plain, 16) just probed
    assert feed(policy, [24] * (P + 1), table, 1.0) == [PLAIN] * P + [SPEC]  # a new bucket
    assert policy.report()["probes"] == 2


def test_a_probe_returns_to_the_mode_it_interrupted() -> None:
    # No patience on the way back: the probe was not a switch.
    table = plain_unmeasured_table(gain_at_16=1.1)
    policy = make(probe_steps=P, refresh_interval=R, switch_patience=K)
    modes = feed(policy, [16] * (P + K + 2), table, 1.0)
    assert modes == [PLAIN] * P + [SPEC] * (K + 2)


def test_a_probe_inside_the_margin_does_not_flip_the_mode() -> None:
    # Gain 1.0 (inside the margin): after the probe the policy keeps speculating for good.
    table = plain_unmeasured_table(gain_at_16=1.0)
    policy = make(probe_steps=P, refresh_interval=10 * R, switch_patience=1)
    assert feed(policy, [16] * (P + 5 * R), table, 1.0) == [PLAIN] * P + [SPEC] * (5 * R)


def test_probe_resets_the_patience_streak() -> None:
    # Two steps of a leave streak at bucket 8 (gain 0.9), then a probe at bucket 16: the
    # streak does not carry over into the way back from the probe.
    table = plain_unmeasured_table(gain_at_16=1.1)
    table = dataclasses.replace(
        table,
        speculative=mode_costs({**dict(zip(BUCKETS, table.speculative.step_ms)), 8: 10 / 0.9}),
    )
    policy = make(probe_steps=P, refresh_interval=R, switch_patience=K)
    assert feed(policy, [8, 8], table, 1.0) == [SPEC, SPEC]
    assert feed(policy, [16] * P, table, 1.0) == [PLAIN] * P
    # Back at bucket 8 the leave streak starts from zero: K more steps, not K - 2.
    assert feed(policy, [8] * K, table, 1.0) == [SPEC] * (K - 1) + [PLAIN]


@pytest.mark.parametrize("gain", [0.7, 1.35, 2.0])
def test_no_probe_when_gain_outside_band(gain: float) -> None:
    table = plain_unmeasured_table(gain_at_16=gain)
    # max_acceptance 1 (= the acceptance): no refresh probe once plain.
    policy = make(probe_steps=P, refresh_interval=R, cost_probe_band=0.3, max_acceptance=1.0)
    modes = feed(policy, [16] * (3 * R), table, 1.0)
    assert policy.report()["probes"] == 0
    if gain > 1:
        assert modes == [SPEC] * (3 * R)
    else:
        assert modes == [SPEC] * (K - 1) + [PLAIN] * (3 * R - K + 1)


def test_no_probe_when_plain_cost_measured() -> None:
    table = flat_table(10.0, 10.0 / 1.1)
    policy = make(probe_steps=P, refresh_interval=R)
    assert feed(policy, [16] * (3 * R), table, 1.0) == [SPEC] * (3 * R)
    assert policy.report()["probes"] == 0


def test_probe_of_unmeasured_speculative_cost_while_plain() -> None:
    # Plain mode, speculative cost at bucket 16 only estimated, gain 1.0 (inside the band,
    # and inside the margin, so the patience alone would never switch).
    plain = {b: 10.0 for b in BUCKETS}
    spec = {b: 10.0 for b in BUCKETS}
    table = CostTable(mode_costs(plain), mode_costs(spec, unmeasured=[16]))
    policy = make(PLAIN, probe_steps=P, refresh_interval=10_000, max_acceptance=1.0)
    steps = feed_probing(policy, [16] * (P + 20), table, 1.0)
    assert [mode for mode, _ in steps] == [SPEC] * P + [PLAIN] * 20
    assert [probing for _, probing in steps] == [True] * P + [False] * 20
    assert policy.report()["probes"] == 1


def test_probe_steps_zero_disables_probes() -> None:
    unmeasured_plain = plain_unmeasured_table(gain_at_16=1.1)
    policy = make(probe_steps=0, refresh_interval=1)
    assert feed(policy, [16] * 100, unmeasured_plain, 1.0) == [SPEC] * 100
    # Refresh: plain, low acceptance, speculation would pay at max acceptance.
    policy = make(PLAIN, probe_steps=0, refresh_interval=1)
    assert feed(policy, [16] * 100, flat_table(10.0, 20.0), 1.5) == [PLAIN] * 100
    # Missing costs: the mode is kept.
    missing = CostTable(
        mode_costs({b: None for b in BUCKETS}), mode_costs({b: 1.0 for b in BUCKETS})
    )
    policy = make(probe_steps=0, refresh_interval=1)
    assert feed(policy, [16] * 100, missing, 1.0) == [SPEC] * 100
    assert policy.report()["probes"] == 0


@pytest.mark.parametrize("missing_mode", [PLAIN, SPEC])
def test_missing_cost_triggers_probe_of_that_mode(missing_mode: DecodeMode) -> None:
    known = {b: 10.0 for b in BUCKETS}
    missing = {**known, 8: None}
    plain, spec = (missing, known) if missing_mode is PLAIN else (known, missing)
    table = CostTable(mode_costs(plain, unmeasured=[8]), mode_costs(spec, unmeasured=[8]))
    other = SPEC if missing_mode is PLAIN else PLAIN
    policy = make(other, probe_steps=P, refresh_interval=R)
    steps = feed_probing(policy, [8] * (P + 10), table, 2.0)
    assert [mode for mode, _ in steps[:P]] == [missing_mode] * P
    assert [probing for _, probing in steps[:P]] == [True] * P
    # Back to the interrupted mode; the table still lacks the cost, but no second probe
    # comes within the interval.
    assert [mode for mode, _ in steps[P:]] == [other] * 10
    assert policy.report()["probes"] == 1


def test_missing_cost_of_the_current_mode_is_no_probe() -> None:
    known = {b: 10.0 for b in BUCKETS}
    table = CostTable(mode_costs(known), mode_costs({**known, 8: None}, unmeasured=[8]))
    policy = make(SPEC, probe_steps=P, refresh_interval=R)
    assert feed(policy, [8] * 20, table, 2.0) == [SPEC] * 20
    assert policy.report()["probes"] == 0


def test_missing_cost_above_last_bucket_keeps_the_mode() -> None:
    # A batch inside the graph limit but above the table's last bucket has no cost, and no
    # probe could measure one (there is no bucket to time it in): the mode is kept.
    table = flat_table(10.0, 10.0, buckets=(1, 2, 4, 8))
    policy = make(probe_steps=P, refresh_interval=R)
    assert feed(policy, [20] * (2 * P), table, 2.0) == [SPEC] * (2 * P)
    assert policy.report()["probes"] == 0


def refresh_expected(r: int, p: int, total: int) -> tuple[list[DecodeMode], int]:
    """Plain policy, gain < 1 - margin, best gain at max acceptance > 1 + margin: a refresh
    probe of p speculative steps once r steps have passed since the last speculative step,
    then back to plain. Returns the modes and the number of probes."""
    modes: list[DecodeMode] = []
    last_spec, step, probes = 0, 0, 0
    while len(modes) < total:
        step += 1
        if step - last_spec >= r:
            probes += 1
            modes += [SPEC] * p
            step += p - 1
            last_spec = step
        else:
            modes.append(PLAIN)
    return modes[:total], probes


def test_refresh_probe_while_plain() -> None:
    # plain 10, speculative 20: gain 0.75 at acceptance 1.5 (outside the probe band),
    # 2.0 at max acceptance 4: a refresh probe is due every R steps without speculation.
    table = flat_table(10.0, 20.0)
    policy = make(PLAIN, probe_steps=P, refresh_interval=R)
    steps = feed_probing(policy, [16] * (4 * R), table, 1.5)
    modes = [mode for mode, _ in steps]
    expected, probes = refresh_expected(R, P, 4 * R)
    assert modes == expected
    assert modes[: R - 1] == [PLAIN] * (R - 1)
    assert [probing for _, probing in steps[R - 1 : R - 1 + P]] == [True] * P
    assert modes[R - 1 + P] is PLAIN
    assert probes >= 3 and policy.report()["probes"] == probes


def test_refresh_interval_counts_from_the_last_speculative_step() -> None:
    table = flat_table(10.0, 20.0)
    policy = make(SPEC, probe_steps=P, refresh_interval=R)
    modes = feed(policy, [16] * (K + R), table, 1.5)
    # Left speculation at step K; the refresh is due R steps after the last speculative step.
    assert modes[: K - 1] == [SPEC] * (K - 1)
    assert modes[K - 1 : K - 2 + R] == [PLAIN] * (R - 1)
    assert modes[K - 2 + R] is SPEC


def test_no_refresh_when_speculation_cannot_pay() -> None:
    # Even at max acceptance 4: gain 4 * 10 / 50 = 0.8.
    policy = make(PLAIN, probe_steps=P, refresh_interval=R)
    assert feed(policy, [16] * (5 * R), flat_table(10.0, 50.0), 1.5) == [PLAIN] * (5 * R)
    # Cheap speculative steps (gain 1.67 at acceptance 1.5), but a catch-up of 64 * 32 ms
    # over 64 steps makes the entry cost 41 ms: 4 * 10 / 41 = 0.98 < 1 + margin.
    policy = make(PLAIN, probe_steps=P, refresh_interval=R, catchup_horizon_steps=64)
    table = flat_table(10.0, 9.0, catchup_ms=64 * 32.0)
    assert feed(policy, [16] * (5 * R), table, 1.5) == [PLAIN] * (5 * R)
    assert policy.report()["probes"] == 0


# --------------------------------------------------------------------------- properties

PROPERTY_SETTINGS = settings(max_examples=150, deadline=None)
HUGE = 10**9


@st.composite
def tables(draw: st.DrawFn) -> CostTable:
    """A fully measured table over BUCKETS with gains around 1 for acceptances of 1..4."""
    plain = {b: draw(st.floats(1.0, 50.0)) for b in BUCKETS}
    spec = {b: plain[b] * draw(st.floats(0.5, 4.0)) for b in BUCKETS}
    catchup = draw(st.one_of(st.just(0.0), st.floats(0.0, 500.0)))
    return measured_table(plain, spec, catchup)


@st.composite
def batch_sizes(draw: st.DrawFn, patience: int) -> list[int]:
    values = st.sampled_from([0, 1, 2, 3, 4, 7, 8, 12, 16, 20, 24, 32, 40, 48, 49, 100])
    length = st.sampled_from([patience] * 3 + [max(1, patience - 1), patience + 1, 1, 2 * patience])
    runs = draw(st.lists(st.tuples(values, length), min_size=5, max_size=25))
    return [v for v, run in runs for _ in range(run)]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[CostPolicyConfig, DecodeMode, CostTable, list[int]]:
    patience = draw(st.integers(1, 6))
    cfg = CostPolicyConfig(
        switch_patience=patience,
        max_speculative_batch=CAP,
        max_acceptance=MAX_ACCEPTANCE,
        margin=draw(st.sampled_from([0.0, 0.03, 0.1])),
        catchup_horizon_steps=draw(st.sampled_from([1, 16, 64])),
        # Probes disabled one way or the other: no probe steps, or (fully measured tables,
        # buckets up to the graph limit) no refresh within the run.
        probe_steps=draw(st.sampled_from([0, 8])),
        refresh_interval=HUGE,
        close_call_refresh_interval=HUGE,
        decisive_band=draw(st.sampled_from([0.0, 0.1, 0.3, NO_DECISIVE_SWITCHES])),
    )
    initial = draw(st.sampled_from(DecodeMode))
    return cfg, initial, draw(tables()), draw(batch_sizes(patience))


def run(
    cfg: CostPolicyConfig,
    initial: DecodeMode,
    table: CostTable,
    sizes: Sequence[int],
    acceptance: float | Sequence[float | None] | None,
) -> list[DecodeMode]:
    policy = CostPolicy(cfg, initial)
    if acceptance is None or isinstance(acceptance, float):
        acceptance = [acceptance] * len(sizes)
    return [policy.decide(StepObservation(bs, table, a)) for bs, a in zip(sizes, acceptance)]


def scaled_speculative(table: CostTable, factor: float) -> CostTable:
    spec = table.speculative
    return dataclasses.replace(
        table,
        speculative=dataclasses.replace(
            spec, step_ms=tuple(ms * factor for ms in spec.step_ms)  # type: ignore[operator]
        ),
    )


@PROPERTY_SETTINGS
@given(scenarios(), st.floats(1.0, 4.0), st.floats(0.0, 2.0))
def test_property_higher_acceptance_never_turns_speculation_off(
    scenario, a1: float, extra: float
) -> None:
    cfg, initial, table, sizes = scenario
    a2 = a1 + extra
    low = run(cfg, initial, table, sizes, a1)
    high = run(cfg, initial, table, sizes, a2)
    for i, (m_low, m_high) in enumerate(zip(low, high)):
        if m_low is SPEC:
            assert m_high is SPEC, (i, sizes[: i + 1], a1, a2)


@PROPERTY_SETTINGS
@given(scenarios(), st.floats(1.0, 4.0), st.floats(1.0, 3.0))
def test_property_costlier_speculation_never_turns_it_on(
    scenario, acceptance: float, factor: float
) -> None:
    cfg, initial, table, sizes = scenario
    cheap = run(cfg, initial, table, sizes, acceptance)
    costly = run(cfg, initial, scaled_speculative(table, factor), sizes, acceptance)
    for i, (m_cheap, m_costly) in enumerate(zip(cheap, costly)):
        if m_costly is SPEC:
            assert m_cheap is SPEC, (i, sizes[: i + 1], factor)


@PROPERTY_SETTINGS
@given(scenarios(), st.lists(st.sampled_from([None, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0]), min_size=1))
def test_property_no_flapping_faster_than_patience(scenario, acceptances: list) -> None:
    cfg, initial, table, sizes = scenario
    per_step = [acceptances[i % len(acceptances)] for i in range(len(sizes))]
    modes = run(cfg, initial, table, sizes, per_step)
    previous = -1  # a virtual change just before the first step
    for i in switch_steps(initial, modes):
        forced = modes[i] is PLAIN and sizes[i] > cfg.max_speculative_batch
        if not forced and not decisive(cfg, table, sizes[i], per_step[i], modes[i]):
            assert i - previous >= cfg.switch_patience, (i, previous, sizes[: i + 1])
        previous = i


def decisive(
    cfg: CostPolicyConfig, table: CostTable, batch_size: int, acceptance: float | None,
    new_mode: DecodeMode,
) -> bool:
    """Whether a switch to ``new_mode`` at this step is one the policy may make without the
    patience: leaving speculation at a gain below the decisive band."""
    if new_mode is not PLAIN:
        return False
    estimate = cfg.max_acceptance if acceptance is None else acceptance
    plain_ms = table.plain.lookup(batch_size).step_ms
    spec_ms = table.speculative.lookup(batch_size).step_ms
    gain = speculative_gain(estimate, plain_ms, spec_ms)
    return gain < min(1 - cfg.margin, 1 / (1 + cfg.decisive_band))


@PROPERTY_SETTINGS
@given(
    scenarios(),
    st.floats(1.0, 4.0),
    st.sampled_from([1, 3, 8]),
    st.sampled_from([1, 5, 40]),
    st.sets(st.sampled_from(BUCKETS)),
)
def test_property_identical_inputs_identical_decisions(
    scenario, acceptance: float, probe_steps: int, refresh: int, unmeasured: set[int]
) -> None:
    # Probes on, with unmeasured buckets: the stateful paths must be deterministic too.
    cfg, initial, table, sizes = scenario
    cfg = dataclasses.replace(cfg, probe_steps=probe_steps, refresh_interval=refresh)
    table = dataclasses.replace(
        table,
        plain=dataclasses.replace(
            table.plain, measured=tuple(b not in unmeasured for b in table.plain.buckets)
        ),
    )
    first = run(cfg, initial, table, sizes, acceptance)
    second = run(cfg, initial, table, sizes, acceptance)
    assert first == second


@PROPERTY_SETTINGS
@given(scenarios(), st.floats(1.0, 4.0))
def test_property_never_speculative_above_graph_limit(scenario, acceptance: float) -> None:
    cfg, initial, table, sizes = scenario
    for bs, mode in zip(sizes, run(cfg, initial, table, sizes, acceptance)):
        if bs > cfg.max_speculative_batch:
            assert mode is PLAIN


# --------------------------------------------------------------------------- acceptance estimate


def steady(window: int, requests: int, drafts: int, steps: int) -> AcceptanceEstimate:
    """An estimate after ``steps`` consecutive verifies of ``requests`` requests that each
    accepted ``drafts`` drafts, one per decode step from step 1."""
    estimate = AcceptanceEstimate(window=window)
    for step in range(1, steps + 1):
        estimate.add_step([drafts] * requests, decode_step=step)
    return estimate


def test_acceptance_first_sample_taken_as_is() -> None:
    estimate = AcceptanceEstimate(window=16)
    assert estimate.value is None
    estimate.add_step([1, 2, 3, 2], decode_step=1000)
    assert estimate.value == 3.0
    estimate = AcceptanceEstimate(window=16)
    estimate.add(11.0, requests=4, decode_step=7)  # tokens over requests, bonus included
    assert estimate.value == 2.75


@pytest.mark.parametrize("window", [1, 2, 16])
@pytest.mark.parametrize("requests", [1, 8])
def test_acceptance_consecutive_steps_weigh_one_over_window(window: int, requests: int) -> None:
    # A steady run of verifies at acceptance 2, then one step at acceptance 4: the new step
    # weighs 1/window.
    steps = 50 * window
    estimate = steady(window, requests, drafts=1, steps=steps)
    assert estimate.value == pytest.approx(2.0)
    estimate.add_step([3] * requests, decode_step=steps + 1)
    assert estimate.value == pytest.approx(2.0 + 2.0 / window, rel=1e-9)
    estimate.add_step([3] * requests, decode_step=steps + 2)
    kept = 1 - 1 / window
    assert estimate.value == pytest.approx(2.0 + 2.0 * (1 - kept**2), rel=1e-9)


def test_acceptance_weighs_requests() -> None:
    # One request at acceptance 1, then 31 requests at acceptance 4 on the next decode step.
    estimate = AcceptanceEstimate(window=4)
    estimate.add_step([0], decode_step=1)
    estimate.add_step([3] * 31, decode_step=2)
    assert estimate.value == pytest.approx((1.0 * 0.75 + 31 * 4.0) / (0.75 + 31))
    # The other way round, the lone request barely moves a 32-request mean.
    estimate = AcceptanceEstimate(window=4)
    estimate.add_step([3] * 32, decode_step=1)
    estimate.add_step([0], decode_step=2)
    assert estimate.value == pytest.approx((32 * 4.0 * 0.75 + 1.0) / (32 * 0.75 + 1))
    assert estimate.value > 3.8


def test_acceptance_same_decode_step_pools_without_aging() -> None:
    estimate = AcceptanceEstimate(window=2)
    estimate.add_step([0, 0], decode_step=5)
    estimate.add_step([3, 3, 3, 3, 3, 3], decode_step=5)
    assert estimate.value == pytest.approx((2 * 1.0 + 6 * 4.0) / 8)


@pytest.mark.parametrize("window", [4, 16])
def test_acceptance_ages_with_decode_steps(window: int) -> None:
    kept = 1 - 1 / window
    # After ten windows of decode steps without a verify, a new step nearly replaces the value.
    estimate = AcceptanceEstimate(window=window)
    estimate.add_step([0] * 8, decode_step=1)
    gap = 10 * window
    estimate.add_step([3] * 8, decode_step=1 + gap)
    old = kept**gap
    assert estimate.value == pytest.approx((old * 1.0 + 4.0) / (old + 1))
    assert estimate.value == pytest.approx(4.0, abs=1e-3)
    # A long speculative stretch also fades: the plain steps in between age it just the same.
    estimate = steady(window, requests=8, drafts=0, steps=10 * window)
    estimate.add_step([3] * 8, decode_step=30 * window)
    assert estimate.value == pytest.approx(4.0, abs=1e-3)
    # A gap of a few steps keeps part of the old value.
    estimate = AcceptanceEstimate(window=window)
    estimate.add_step([0] * 8, decode_step=1)
    estimate.add_step([3] * 8, decode_step=4)
    old = kept**3
    assert estimate.value == pytest.approx((old * 1.0 + 4.0) / (old + 1))
    assert 2.0 < estimate.value < 3.5


def test_acceptance_add_step_adds_bonus_token() -> None:
    estimate = AcceptanceEstimate(window=8)
    estimate.add_step([0, 2, 1, 3], decode_step=1)
    assert estimate.value == pytest.approx(1.0 + 6 / 4)
    estimate = AcceptanceEstimate(window=8)
    estimate.add_step([0], decode_step=1)
    assert estimate.value == 1.0


def test_acceptance_empty_list_ignored() -> None:
    estimate = AcceptanceEstimate(window=4)
    estimate.add_step([], decode_step=1)
    assert estimate.value is None
    estimate.add_step([1], decode_step=2)
    assert estimate.value == 2.0
    estimate.add_step([], decode_step=3)
    assert estimate.value == 2.0
    # The empty list does not move the age reference: this step is 2 steps after the last.
    estimate.add_step([3], decode_step=4)
    old = 0.75**2
    assert estimate.value == pytest.approx((2.0 * old + 4.0) / (old + 1))


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 32),
    st.lists(
        st.tuples(st.integers(0, 20), st.lists(st.integers(0, 7), max_size=40)), max_size=30
    ),
)
def test_property_acceptance_within_sample_range(
    window: int, steps: list[tuple[int, list[int]]]
) -> None:
    # A weighted mean: never outside the range of the per-request acceptances seen.
    estimate = AcceptanceEstimate(window=window)
    step, seen = 0, []
    for gap, drafts in steps:
        step += gap
        estimate.add_step(drafts, decode_step=step)
        seen += drafts
    if not seen:
        assert estimate.value is None
    else:
        assert 1 + min(seen) - 1e-9 <= estimate.value <= 1 + max(seen) + 1e-9


@pytest.mark.parametrize("window", [0, -1, 1.5, True, None])
def test_acceptance_window_validation(window: object) -> None:
    with pytest.raises(ValueError, match="acceptance window"):
        AcceptanceEstimate(window=window)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- validation

VALID = dict(switch_patience=K, max_speculative_batch=CAP, max_acceptance=MAX_ACCEPTANCE)


@pytest.mark.parametrize(
    ("field", "value", "name"),
    [
        ("switch_patience", 0, PATIENCE_FLAG),
        ("switch_patience", -1, PATIENCE_FLAG),
        ("switch_patience", 2.0, PATIENCE_FLAG),
        ("switch_patience", True, PATIENCE_FLAG),
        ("max_speculative_batch", 0, "max_speculative_batch"),
        ("max_speculative_batch", None, "max_speculative_batch"),
        ("catchup_horizon_steps", 0, "catchup_horizon_steps"),
        ("catchup_horizon_steps", 64.0, "catchup_horizon_steps"),
        ("probe_steps", -1, "probe_steps"),
        ("probe_steps", "8", "probe_steps"),
        ("refresh_interval", 0, "refresh_interval"),
        ("refresh_interval", False, "refresh_interval"),
        ("max_acceptance", 0.5, "max_acceptance"),
        ("max_acceptance", -1.0, "max_acceptance"),
        ("max_acceptance", math.nan, "max_acceptance"),
        ("max_acceptance", math.inf, "max_acceptance"),
        ("max_acceptance", "4", "max_acceptance"),
        ("margin", -0.01, "margin"),
        ("margin", math.nan, "margin"),
        ("margin", None, "margin"),
        ("cost_probe_band", -0.3, "cost_probe_band"),
        ("cost_probe_band", math.inf, "cost_probe_band"),
    ],
)
def test_config_validation(field: str, value: object, name: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        CostPolicyConfig(**{**VALID, field: value})  # type: ignore[arg-type]
    message = str(excinfo.value)
    assert "\n" not in message
    assert name in message
    assert repr(value) in message or str(value) in message


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"switch_patience": 1, "max_speculative_batch": 1, "max_acceptance": 1.0},
        {"max_acceptance": 1},
        {"margin": 0.0, "cost_probe_band": 0.0, "probe_steps": 0, "refresh_interval": 1},
        {"catchup_horizon_steps": 1},
    ],
)
def test_config_accepts_edge_values(overrides: dict[str, object]) -> None:
    CostPolicyConfig(**{**VALID, **overrides})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the prior never decides a leave


def spec_prior_table(gain: float, measured: Sequence[int] = ()) -> CostTable:
    """Plain costs measured; speculative costs only the start-up prior except at ``measured``,
    with gain ``gain`` at acceptance 1 everywhere."""
    plain = {b: 10.0 for b in BUCKETS}
    spec = {b: 10.0 / gain for b in BUCKETS}
    unmeasured = [b for b in BUCKETS if b not in measured]
    return CostTable(mode_costs(plain), mode_costs(spec, unmeasured=unmeasured))


def test_speculation_is_not_left_on_the_start_up_prior_alone() -> None:
    """No speculative cost measured yet and the prior says leave (gain 0.2, far outside the
    probe band): the policy first runs probe_steps speculative steps, so a cost gets
    measured, then leaves with the patience."""
    table = spec_prior_table(gain=0.2)
    policy = make(SPEC, probe_steps=P, refresh_interval=10_000)
    steps = feed_probing(policy, [16] * (P + K + 10), table, 1.0)
    assert [mode for mode, _ in steps] == [SPEC] * (P + K - 1) + [PLAIN] * 11
    assert [probing for _, probing in steps][:P] == [True] * P
    assert policy.report()["probes"] == 1


def test_one_measured_speculative_bucket_ends_the_distrust_of_the_prior() -> None:
    """Bucket 16 unmeasured, bucket 1 measured: the rescaled prior at 16 decides at once."""
    table = spec_prior_table(gain=0.2, measured=[1])
    policy = make(SPEC, probe_steps=P, refresh_interval=10_000)
    assert feed(policy, [16] * (K + 5), table, 1.0) == [SPEC] * (K - 1) + [PLAIN] * 6
    assert policy.report()["probes"] == 0


def test_measured_speculative_cost_decides_a_leave_at_once() -> None:
    table = flat_table(plain_ms=10.0, spec_ms=50.0)
    policy = make(SPEC, probe_steps=P, refresh_interval=10_000)
    assert feed(policy, [16] * (K + 5), table, 1.0) == [SPEC] * (K - 1) + [PLAIN] * 6
    assert policy.report()["probes"] == 0


def test_prior_only_leave_probe_is_once_per_bucket_per_refresh_interval() -> None:
    """If the probe could not measure anything (prefills between its steps), the prior
    decides the next time at that bucket, until the refresh interval has passed."""
    table = spec_prior_table(gain=0.2)
    policy = make(SPEC, probe_steps=P, refresh_interval=10_000, max_acceptance=1.0)
    assert feed(policy, [16] * (P + K), table, 1.0)[-1] is PLAIN
    back = feed(policy, [16] * 3 * K, table, 5.0)  # gain 1.0: speculation resumes ...
    back += feed(policy, [16] * (K + 2), table, 1.0)  # ... and is left without a second probe
    assert back[-1] is PLAIN and policy.report()["probes"] == 1


def test_the_prior_guard_probes_once_per_refresh_interval_whatever_the_bucket() -> None:
    """Prefill-heavy load: decode steps at ever new batch sizes, none of which a probe can
    measure. One probe, then the prior decides (a probe per new bucket kept speculating on
    every decode step of a prefill-only benchmark)."""
    table = spec_prior_table(gain=0.2)
    policy = make(SPEC, probe_steps=P, refresh_interval=10_000)
    sizes = [BUCKETS[i % len(BUCKETS)] for i in range(P + K + 20)]
    modes = feed(policy, sizes, table, 1.0)
    assert modes[-1] is PLAIN and modes.count(SPEC) == P + K - 1
    assert policy.report()["probes"] == 1


def test_plain_on_the_prior_alone_probes_speculation_again_after_the_refresh_interval() -> None:
    """Left on the prior after the guard's one probe measured nothing (an overrated prior, gain
    0.2, under which even every draft accepted would not pay): while no speculative step has
    been timed, plain mode probes speculation again after the refresh interval, so such a start
    cannot turn speculation off for good."""
    table = spec_prior_table(gain=0.2)
    interval = 30
    policy = make(SPEC, probe_steps=P, refresh_interval=interval, max_acceptance=4.0)
    assert feed(policy, [16] * (P + K), table, 1.0)[-1] is PLAIN
    modes = feed(policy, [16] * (interval + 2), table, 1.0)
    assert SPEC in modes and policy.report()["probes"] == 2


def test_no_probe_when_the_prior_says_stay() -> None:
    table = spec_prior_table(gain=2.0)
    policy = make(SPEC, probe_steps=P, refresh_interval=10_000)
    assert feed(policy, [16] * 50, table, 1.0) == [SPEC] * 50
    assert policy.report()["probes"] == 0


def test_wants_fresh_costs_after_the_last_probe_step_only() -> None:
    table = spec_prior_table(gain=0.2)
    policy = make(SPEC, probe_steps=P, refresh_interval=10_000)
    wants = []
    for _ in range(P + 3):
        policy.decide(StepObservation(16, table, 1.0))
        wants.append(policy.wants_fresh_costs())
    assert wants == [False] * (P - 1) + [True] + [False] * 3


# --------------------------------------------------------------------------- close calls refresh sooner


def test_close_call_refreshes_acceptance_after_the_shorter_interval() -> None:
    """Gain 1.0 at the old acceptance (inside the close-call band, below the entry margin):
    a refresh probe after the close-call interval, not the long one."""
    table = flat_table(10.0, 15.0)  # acceptance 1.5: gain 1.0
    short = 20
    policy = make(PLAIN, probe_steps=P, refresh_interval=10 * R, close_call_refresh_interval=short)
    steps = feed_probing(policy, [16] * (short + P + 5), table, 1.5)
    modes = [mode for mode, _ in steps]
    assert modes[: short - 1] == [PLAIN] * (short - 1)
    assert modes[short - 1 : short - 1 + P] == [SPEC] * P
    assert policy.report()["probes"] == 1


def test_a_higher_acceptance_never_delays_a_close_call_refresh() -> None:
    """At the step where a close call's refresh falls due, an acceptance high enough to put
    the gain above the band must not postpone it (its patience is not spent yet)."""
    plain = {b: 10.0 for b in BUCKETS}
    spec = {**plain, 1: 40.0}
    table = measured_table(plain, spec)
    sizes = [1] * 264 + [2]

    def last_mode(acceptance: float) -> DecodeMode:
        policy = make(PLAIN, switch_patience=6, probe_steps=8, refresh_interval=HUGE,
                      close_call_refresh_interval=256)
        return feed(policy, sizes, table, acceptance)[-1]

    assert last_mode(1.05) is SPEC  # gain 1.05 at bucket 2: a close call, refreshed
    assert last_mode(1.25) is SPEC  # gain 1.25: no less


def test_clear_call_waits_for_the_long_refresh_interval() -> None:
    """Gain 0.75 at the old acceptance (outside the close-call band): no probe before the
    long interval, however short the close-call one."""
    table = flat_table(10.0, 20.0)
    policy = make(PLAIN, probe_steps=P, refresh_interval=R, close_call_refresh_interval=5)
    modes = feed(policy, [16] * R, table, 1.5)
    assert modes[: R - 1] == [PLAIN] * (R - 1) and modes[R - 1] is SPEC


@pytest.mark.parametrize("band", [-0.1, float("nan")])
def test_close_call_band_validation(band: float) -> None:
    with pytest.raises(ValueError, match="close_call_band"):
        config(close_call_band=band)


def test_close_call_interval_validation() -> None:
    with pytest.raises(ValueError, match="close_call_refresh_interval"):
        config(close_call_refresh_interval=0)


# --------------------------------------------------------------------------- decisive switches


def test_a_decisive_loss_leaves_speculation_at_once() -> None:
    table = flat_table(plain_ms=10.0, spec_ms=40.0)  # gain 0.5 at acceptance 2
    assert feed(make(SPEC, decisive_band=0.3), [16] * 3, table, 2.0) == [PLAIN] * 3


def test_a_loss_inside_the_decisive_band_waits_for_the_patience() -> None:
    table = flat_table(plain_ms=10.0, spec_ms=23.5)  # gain 0.85
    modes = feed(make(SPEC, decisive_band=0.3), [16] * (K + 1), table, 2.0)
    assert modes == [SPEC] * (K - 1) + [PLAIN] * 2


def test_a_decisive_win_still_waits_for_the_patience() -> None:
    """A load growing through the band would otherwise start speculating at its first small
    batch; only leaving is decisive."""
    modes = feed(make(PLAIN, decisive_band=0.3), [4] * K, flat_table(10.0, 10.0), 2.0)
    assert modes == [PLAIN] * (K - 1) + [SPEC]


def test_no_decisive_leave_on_the_start_up_prior_alone() -> None:
    """The prior probe, then the patience: on the prior alone even a gain of 0.2 is no
    decisive leave."""
    policy = make(SPEC, decisive_band=0.3, probe_steps=P, refresh_interval=10_000)
    modes = feed(policy, [16] * (P + K), spec_prior_table(gain=0.2), 1.0)
    assert modes == [SPEC] * (P + K - 1) + [PLAIN]
    assert policy.report()["probes"] == 1


def test_a_decisive_leave_restarts_the_patience() -> None:
    """Steps counted towards leaving do not count towards coming back."""
    plain = {b: 10.0 for b in BUCKETS}
    spec = {b: 30.0 for b in BUCKETS} | {1: 10.0, 2: 10.0, 4: 10.0, 8: 10.0 * 1.5 / 0.9}
    table = measured_table(plain, spec)  # at acceptance 1.5: gain 1.5 at 1, 0.9 at 8, 0.5 at 48
    modes = feed(make(SPEC, decisive_band=0.3), [8, 8, 8, 48, 1, 1, 1, 1, 1], table, 1.5)
    assert modes == [SPEC] * 3 + [PLAIN] * 4 + [SPEC] * 2


def test_the_decisive_threshold_is_strict() -> None:
    # decisive_band 1.0: decisive below a gain of 0.5; exactly 0.5 waits for the patience.
    modes = feed(make(SPEC, decisive_band=1.0), [8] * K, flat_table(5.0, 10.0), 1.0)
    assert modes == [SPEC] * (K - 1) + [PLAIN]


def test_a_load_that_arrives_at_once_decodes_plainly_from_its_first_step() -> None:
    """Costs measured by the server of the acceptance-3.0 sweep of 2026-12-01 (ms per step at
    buckets 1, 64 and 128): speculating on an idle server, then 64 or 128 requests at once.
    With the patience alone the first steps at 64 or 128 speculated at 0.76x and 0.45x of plain
    decoding's throughput."""
    table = measured_table({1: 5.8, 64: 7.56, 128: 9.1}, {1: 7.7, 64: 29.75, 128: 61.0})
    for batch in (64, 128):
        policy = make(SPEC, max_speculative_batch=128, decisive_band=DEFAULT_DECISIVE_BAND)
        assert feed(policy, [1] * 20, table, 3.0) == [SPEC] * 20
        assert feed(policy, [batch] * 3, table, 3.0) == [PLAIN] * 3
    patient = make(SPEC, max_speculative_batch=128)
    assert feed(patient, [1] * 20 + [128] * K, table, 3.0)[20:] == [SPEC] * (K - 1) + [PLAIN]


# --------------------------------------------------------------------------- expects_plain


def test_from_plain_plain_is_expected_until_entering_would_pay() -> None:
    policy = make(PLAIN, margin=0.03)
    table = flat_table(10.0, 10.0)  # the gain is the acceptance
    assert policy.expects_plain(StepObservation(8, table, 1.03))
    assert not policy.expects_plain(StepObservation(8, table, 1.04))
    # Asking started no streak: the patience still needs K qualifying steps.
    assert feed(policy, [8] * K, table, 1.04) == [PLAIN] * (K - 1) + [SPEC]


def test_the_catch_up_cost_counts_against_entering() -> None:
    policy = make(PLAIN, margin=0.03, catchup_horizon_steps=10)
    assert not policy.expects_plain(StepObservation(8, flat_table(10.0, 10.0), 1.2))
    assert policy.expects_plain(StepObservation(8, flat_table(10.0, 10.0, catchup_ms=30.0), 1.2))


def test_from_speculation_plain_is_expected_only_above_the_graph_limit() -> None:
    policy = make(SPEC, margin=0.03)
    table = flat_table(10.0, 10.0, catchup_ms=30.0)
    assert not policy.expects_plain(StepObservation(8, table, 0.5))  # leaving takes the patience
    assert policy.expects_plain(StepObservation(CAP + 1, table, MAX_ACCEPTANCE))


def test_from_plain_without_costs_plain_is_expected() -> None:
    assert make(PLAIN).expects_plain(StepObservation(8))
    assert not make(SPEC).expects_plain(StepObservation(8))


def test_during_a_plain_probe_the_mode_it_returns_to_decides() -> None:
    policy = make(probe_steps=P, refresh_interval=R, switch_patience=1)
    # At a gain of 1.0 plain mode would expect plain: only the return mode says no.
    table = plain_unmeasured_table(gain_at_16=1.0)
    steps = feed_probing(policy, [16] * 2, table, 1.0)
    assert steps[-1] == (PLAIN, True)
    assert not policy.expects_plain(StepObservation(16, table, 1.0))


# --------------------------------------------------------------------------- a probe the batch outgrows


def growing_batch_table(measured_speculative: Sequence[int]) -> CostTable:
    """Speculation pays at batch 1 (gain 2 at acceptance 2) and loses at 48 even with every
    draft accepted (gain 4 * 10 / 80 = 0.5)."""
    plain = {b: 10.0 for b in BUCKETS}
    spec = {b: 10.0 if b < 48 else 80.0 for b in BUCKETS}
    unmeasured = [b for b in BUCKETS if b not in measured_speculative]
    return CostTable(mode_costs(plain), mode_costs(spec, unmeasured=unmeasured))


def test_a_speculative_probe_ends_where_speculation_loses_decisively() -> None:
    table = growing_batch_table(measured_speculative=BUCKETS)
    policy = make(PLAIN, probe_steps=P, decisive_band=DEFAULT_DECISIVE_BAND, refresh_interval=10,
                  close_call_refresh_interval=10)
    assert feed(policy, [48] * 9, table, 2.0) == [PLAIN] * 9
    assert feed(policy, [1], table, 2.0) == [SPEC] and policy.probing  # a refresh probe
    assert feed(policy, [48] * 3, table, 2.0) == [PLAIN] * 3
    assert not policy.probing


def test_a_speculative_probe_on_the_start_up_prior_runs_its_steps() -> None:
    """With no speculative step timed, the costs at 48 are only the prior: the probe is what
    measures them, whatever the batch."""
    table = growing_batch_table(measured_speculative=())
    policy = make(PLAIN, probe_steps=P, decisive_band=DEFAULT_DECISIVE_BAND, refresh_interval=10,
                  close_call_refresh_interval=10)
    assert feed(policy, [48] * 9, table, 2.0) == [PLAIN] * 9
    assert feed(policy, [1], table, 2.0) == [SPEC] and policy.probing
    assert feed(policy, [48] * (P - 1), table, 2.0) == [SPEC] * (P - 1)


def test_a_plain_probe_runs_its_steps_where_speculation_loses_decisively() -> None:
    """The early end is for speculative probes: a plain probe (a cost probe while speculating)
    keeps its steps, its mode being the one that wins there."""
    plain = {b: 10.0 for b in BUCKETS}
    spec = {b: 10.0 if b < 48 else 80.0 for b in BUCKETS}
    table = CostTable(mode_costs(plain, unmeasured=[16]), mode_costs(spec))
    policy = make(SPEC, probe_steps=P, decisive_band=DEFAULT_DECISIVE_BAND, refresh_interval=10_000,
                  max_acceptance=1.0)
    assert feed(policy, [16], table, 1.0) == [PLAIN] and policy.probing  # gain 1.0: a cost probe
    assert feed(policy, [48] * (P - 1), table, 1.0) == [PLAIN] * (P - 1)
    assert policy.probing and policy.report()["probes"] == 1


@pytest.mark.parametrize("steps, draft_tokens, most", [(3, 4, 4), (5, 8, 6), (5, 4, 4), (1, 2, 2)],
                         ids=["chain", "llama tree", "narrow tree", "one step"])
def test_max_accepted_tokens_is_a_path_no_longer_than_the_draft_tokens(steps, draft_tokens, most) -> None:
    assert max_accepted_tokens(steps, draft_tokens) == most


# --------------------------------------------------------------------------- a cost probe the batch outgrows


def speculative_unmeasured_table(unmeasured: Sequence[int] = (16,)) -> CostTable:
    """Plain mode's view: speculative costs at ``unmeasured`` only estimated, every bucket
    with a gain of 0.92 at acceptance 3 (a close call: a cost probe where unmeasured)."""
    plain = {b: 10.0 for b in BUCKETS}
    spec = {b: 3 * 10.0 / 0.92 for b in BUCKETS}
    return CostTable(mode_costs(plain), mode_costs(spec, unmeasured=unmeasured))


def probing_from_plain() -> CostPolicy:
    return make(PLAIN, probe_steps=P, refresh_interval=10_000, close_call_refresh_interval=10_000)


def test_a_speculative_cost_probe_ends_when_the_batch_outgrows_its_bucket() -> None:
    """Measured on the 8B-shaped model (2026-12-02): a probe started at a batch of 13 ran its 12
    steps while the rest of the wave was prefilled, up to a batch of 64."""
    table = speculative_unmeasured_table()
    policy = probing_from_plain()
    assert feed(policy, [13], table, 3.0) == [SPEC] and policy.probing
    assert feed(policy, [14, 16], table, 3.0) == [SPEC, SPEC] and policy.probing  # bucket 16 still
    assert feed(policy, [20, 32, 48], table, 3.0) == [PLAIN] * 3
    assert not policy.probing and policy.report()["probes"] == 1


def test_a_speculative_cost_probe_keeps_its_steps_while_the_batch_shrinks() -> None:
    policy = probing_from_plain()
    assert feed(policy, [13, 12, 8, 4, 2], speculative_unmeasured_table(), 3.0) == [SPEC] * P
    assert feed(policy, [2], speculative_unmeasured_table(), 3.0) == [PLAIN]


def test_no_speculative_cost_probe_starts_while_the_batch_grows() -> None:
    table = speculative_unmeasured_table(unmeasured=(16, 24))
    policy = probing_from_plain()
    assert feed(policy, [8, 13, 20], table, 3.0) == [PLAIN] * 3  # growing into buckets 16 and 24
    assert policy.report()["probes"] == 0
    assert feed(policy, [20], table, 3.0) == [SPEC] and policy.probing  # the batch holds: a probe
