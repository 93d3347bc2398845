"""Tests for the step-cost model: measured costs, lookups, calibration vectors (pure Python)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_dynamic_eagle.cost_model import (
    CrossoverLogGate,
    DEFAULT_MIN_SAMPLES,
    CostTable,
    MeasuredCosts,
    ModeCosts,
    RecentMedian,
    calibration_table,
    calibration_vector,
    crossover_batch,
    speculative_gain,
)
from sglang_dynamic_eagle.auto_policy import DEFAULT_DECISIVE_BAND
from sglang_dynamic_eagle.policy import DecodeMode

SPEC = DecodeMode.SPECULATIVE
PLAIN = DecodeMode.PLAIN

PLAIN_BUCKETS = (1, 2, 4, 6, 8, 16)
SPEC_BUCKETS = (1, 2, 4, 8)
BUCKETS: dict[DecodeMode, tuple[int, ...]] = {PLAIN: PLAIN_BUCKETS, SPEC: SPEC_BUCKETS}
CALIBRATION: dict[DecodeMode, dict[int, float]] = {
    PLAIN: {b: 10.0 + b for b in PLAIN_BUCKETS},
    SPEC: {b: 20.0 + 2 * b for b in SPEC_BUCKETS},
}


# --------------------------------------------------------------------------- helpers


def costs(
    calibration: Mapping[DecodeMode, Mapping[int, float]] | None = None,
    buckets: Mapping[DecodeMode, Sequence[int]] = BUCKETS,
    **kwargs: int,
) -> MeasuredCosts:
    return MeasuredCosts(buckets, CALIBRATION if calibration is None else calibration, **kwargs)


def measure(measured: MeasuredCosts, mode: DecodeMode, bucket: int, *samples: float) -> None:
    for sample in samples:
        measured.add_step(mode, bucket, sample)


def measure_at(measured: MeasuredCosts, mode: DecodeMode, bucket: int, step_ms: float) -> None:
    """Enough samples of ``step_ms`` for ``bucket`` to count as measured."""
    measure(measured, mode, bucket, *[step_ms] * measured.min_samples)


def as_dict(modes: ModeCosts) -> dict[int, float | None]:
    return dict(zip(modes.buckets, modes.step_ms))


def measured_flags(modes: ModeCosts) -> dict[int, bool]:
    return dict(zip(modes.buckets, modes.measured))


def mode_costs(step_ms: Mapping[int, float | None]) -> ModeCosts:
    buckets = tuple(sorted(step_ms))
    return ModeCosts(buckets, tuple(step_ms[b] for b in buckets), (True,) * len(buckets))


# --------------------------------------------------------------------------- ModeCosts


def test_lookup_picks_smallest_bucket_holding_batch() -> None:
    modes = ModeCosts((1, 2, 4, 8), (1.0, 2.0, None, 4.0), (True, False, False, True))
    assert modes.lookup(0).bucket == 1
    assert modes.lookup(1) == modes.lookup(0)
    lookup = modes.lookup(2)
    assert (lookup.bucket, lookup.step_ms, lookup.measured) == (2, 2.0, False)
    lookup = modes.lookup(3)
    assert (lookup.bucket, lookup.step_ms, lookup.measured) == (4, None, False)
    for batch in (5, 6, 7, 8):
        lookup = modes.lookup(batch)
        assert (lookup.bucket, lookup.step_ms, lookup.measured) == (8, 4.0, True)


@pytest.mark.parametrize("batch", [9, 10, 1000])
def test_lookup_above_last_bucket_is_unknown(batch: int) -> None:
    lookup = ModeCosts((1, 2, 4, 8), (1.0, 2.0, 3.0, 4.0), (True,) * 4).lookup(batch)
    assert (lookup.bucket, lookup.step_ms, lookup.measured) == (None, None, False)


def test_lookup_empty_mode_is_unknown() -> None:
    lookup = ModeCosts((), (), ()).lookup(1)
    assert lookup.step_ms is None and not lookup.measured


@pytest.mark.parametrize(
    ("buckets", "step_ms", "measured"),
    [
        ((1, 2), (1.0,), (True, True)),
        ((1, 2), (1.0, 2.0), (True,)),
        ((2, 1), (1.0, 2.0), (True, True)),
        ((1, 1), (1.0, 2.0), (True, True)),
    ],
)
def test_mode_costs_validation(buckets, step_ms, measured) -> None:
    with pytest.raises(ValueError):
        ModeCosts(buckets, step_ms, measured)


def test_mode_costs_as_dict_skips_unknown_and_rounds() -> None:
    modes = ModeCosts((1, 2, 4), (1.23456, None, 7.0), (True, False, True))
    assert modes.as_dict() == {"1": 1.235, "4": 7.0}


def test_speculative_gain() -> None:
    assert speculative_gain(3.0, 10.0, 15.0) == pytest.approx(2.0)
    assert speculative_gain(1.0, 10.0, 10.0) == 1.0


# --------------------------------------------------------------------------- RecentMedian


def test_recent_median_empty() -> None:
    median = RecentMedian(window=3)
    assert median.value == 0.0
    assert median.count == 0


def test_recent_median_of_latest_window() -> None:
    median = RecentMedian(window=3)
    steps = [(5.0, 5.0), (1.0, 3.0), (9.0, 5.0), (7.0, 7.0), (8.0, 8.0), (0.0, 7.0)]
    for sample, expected in steps:
        median.add(sample)
        assert median.value == expected
    assert median.count == 6  # every sample counts, not only the window


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 12), st.lists(st.floats(0.0, 1e3), min_size=1, max_size=40))
def test_property_recent_median_matches_statistics(window: int, samples: list[float]) -> None:
    median = RecentMedian(window)
    for sample in samples:
        median.add(sample)
    assert median.value == statistics.median(samples[-window:])
    assert median.count == len(samples)


def test_recent_median_ignores_a_single_outlier() -> None:
    median = RecentMedian(window=9)
    for sample in [10.0] * 4 + [500.0] + [10.0] * 4:
        median.add(sample)
    assert median.value == 10.0


# --------------------------------------------------------------------------- MeasuredCosts


def test_bucket_of() -> None:
    measured = costs()
    assert [measured.bucket_of(PLAIN, b) for b in (0, 1, 3, 5, 6, 9, 16, 17)] == [
        1, 1, 4, 6, 6, 16, 16, None,
    ]
    assert measured.bucket_of(SPEC, 8) == 8
    assert measured.bucket_of(SPEC, 9) is None


def test_buckets_are_sorted_and_deduplicated() -> None:
    measured = MeasuredCosts({PLAIN: [8, 1, 4, 4], SPEC: [2, 1]}, {})
    assert measured.buckets == {PLAIN: (1, 4, 8), SPEC: (1, 2)}


def test_calibration_only_table() -> None:
    table = costs().table()
    assert as_dict(table.plain) == CALIBRATION[PLAIN]
    assert as_dict(table.speculative) == CALIBRATION[SPEC]
    assert not any(table.plain.measured) and not any(table.speculative.measured)
    assert table.catchup_ms == 0.0


def test_measured_bucket_needs_min_samples() -> None:
    measured = costs(min_samples=4)
    measure(measured, PLAIN, 4, 30.0, 30.0, 30.0)
    table = measured.table()
    assert not table.plain.measured[PLAIN_BUCKETS.index(4)]
    assert as_dict(table.plain) == CALIBRATION[PLAIN]  # 3 samples: calibration unchanged
    measure(measured, PLAIN, 4, 30.0)
    table = measured.table()
    assert measured_flags(table.plain) == {b: b == 4 for b in PLAIN_BUCKETS}
    assert as_dict(table.plain)[4] == 30.0


def test_measured_value_is_median_of_recent_window() -> None:
    measured = costs(min_samples=3, window=5)
    measure(measured, SPEC, 2, 10.0, 50.0, 12.0)
    assert as_dict(measured.table().speculative)[2] == 12.0
    measure(measured, SPEC, 2, 1.0, 2.0, 3.0, 4.0, 5.0)
    assert as_dict(measured.table().speculative)[2] == 3.0  # median of the last five


def test_default_min_samples() -> None:
    measured = costs()
    assert measured.min_samples == DEFAULT_MIN_SAMPLES
    measure(measured, PLAIN, 1, *[5.0] * (DEFAULT_MIN_SAMPLES - 1))
    assert not measured.table().plain.measured[0]
    measure(measured, PLAIN, 1, 5.0)
    assert measured.table().plain.measured[0]


def test_estimate_scales_calibration_by_nearest_measured_bucket_of_same_mode() -> None:
    measured = costs()
    measure_at(measured, PLAIN, 2, 1.5 * CALIBRATION[PLAIN][2])  # scale 1.5
    measure_at(measured, PLAIN, 8, 3.0 * CALIBRATION[PLAIN][8])  # scale 3
    plain = as_dict(measured.table().plain)
    cal = CALIBRATION[PLAIN]
    assert plain[1] == pytest.approx(1.5 * cal[1])
    assert plain[2] == pytest.approx(1.5 * cal[2])  # measured
    assert plain[4] == pytest.approx(1.5 * cal[4])  # 2 is nearer than 8
    assert plain[6] == pytest.approx(3.0 * cal[6])
    assert plain[16] == pytest.approx(3.0 * cal[16])  # 2 to 8 is too short a span for a trend


WIDE_BUCKETS: dict[DecodeMode, tuple[int, ...]] = {PLAIN: (1, 8, 16, 32, 64), SPEC: (1,)}
WIDE_CALIBRATION: dict[DecodeMode, dict[int, float]] = {
    PLAIN: {b: 10.0 + b for b in WIDE_BUCKETS[PLAIN]}, SPEC: {1: 20.0},
}


def wide_costs(calibration: Mapping[int, float] | None = None) -> MeasuredCosts:
    plain = WIDE_CALIBRATION[PLAIN] if calibration is None else calibration
    return MeasuredCosts(WIDE_BUCKETS, {PLAIN: plain, SPEC: WIDE_CALIBRATION[SPEC]})


def test_above_the_largest_measured_buckets_their_trend_is_a_floor() -> None:
    measured = wide_costs()
    measure_at(measured, PLAIN, 8, 18.0)  # as calibrated
    measure_at(measured, PLAIN, 16, 36.0)  # 10 ms above it: slope 2.25 from 8
    plain = as_dict(measured.table().plain)
    assert plain[32] == pytest.approx(36.0 + 2.25 * 16)
    assert plain[64] == pytest.approx(36.0 + 2.25 * 48)  # the scaled calibration: 102.5
    assert plain[1] == pytest.approx(11.0)  # below: the scaled calibration (scale 1 at 8)
    assert not any(measured.table().plain.measured[3:])


def test_where_the_scaled_calibration_is_larger_it_stays() -> None:
    measured = wide_costs({**WIDE_CALIBRATION[PLAIN], 64: 300.0})
    measure_at(measured, PLAIN, 8, 18.0)
    measure_at(measured, PLAIN, 16, 26.0)  # scale 1, slope 1: the line gives 74 at 64
    assert as_dict(measured.table().plain)[64] == pytest.approx(300.0)


def test_no_trend_from_one_measured_bucket_or_a_short_span() -> None:
    measured = wide_costs()
    measure_at(measured, PLAIN, 1, 22.0)  # scale 2
    assert as_dict(measured.table().plain)[64] == pytest.approx(2.0 * 74.0)
    measure_at(measured, PLAIN, 8, 40.0)  # 7 requests above 1: shorter than MIN_TREND_SPAN
    assert as_dict(measured.table().plain)[64] == pytest.approx(40.0 / 18.0 * 74.0)


def test_a_falling_trend_does_not_lower_the_estimate() -> None:
    measured = wide_costs()
    measure_at(measured, PLAIN, 8, 30.0)
    measure_at(measured, PLAIN, 16, 26.0)  # scale 1 at 16, slope -0.5
    assert as_dict(measured.table().plain)[64] == pytest.approx(74.0)


def test_the_speculative_cost_at_64_of_the_acceptance_3_sweep() -> None:
    """The 8B-shaped sweep of 2026-12-01: speculative buckets 1-32 measured, 64 and 128 scaled
    from 32 (29.75 and 51.5 ms); 64 then measured 35.2 ms. The line through 16 and 32 gives
    33.2 at 64, where speculation at acceptance 3 (plain 7.56 ms) no longer looks like a close
    call worth a probe."""
    buckets = {PLAIN: (64,), SPEC: (1, 4, 16, 32, 64, 128)}
    scale = 20.347 / 10.0
    calibration = {PLAIN: {64: 7.0}, SPEC: {1: 3.0, 4: 3.5, 16: 6.0, 32: 10.0,
                                            64: 29.751 / scale, 128: 51.515 / scale}}
    measured = MeasuredCosts(buckets, calibration)
    for bucket, step_ms in {1: 7.733, 4: 8.379, 16: 13.903, 32: 20.347}.items():
        measure_at(measured, SPEC, bucket, step_ms)
    measure_at(measured, PLAIN, 64, 7.563)
    table = measured.table()
    spec = as_dict(table.speculative)
    slope = (20.347 - 13.903) / 16
    assert spec[64] == pytest.approx(20.347 + 32 * slope)
    assert spec[128] == pytest.approx(20.347 + 96 * slope)
    assert speculative_gain(3.0, table.plain.lookup(64).step_ms, spec[64]) < 1 / 1.3


SPREAD_BUCKETS: dict[DecodeMode, tuple[int, ...]] = {PLAIN: (1, 8, 16, 32, 64), SPEC: (1, 8, 16, 32, 64)}
SPREAD_CALIBRATION: dict[DecodeMode, dict[int, float]] = {mode: {b: 10.0 + b for b in SPREAD_BUCKETS[mode]}
                                                          for mode in (PLAIN, SPEC)}


def test_between_two_measured_speculative_buckets_their_line_is_a_floor() -> None:
    measured = MeasuredCosts(SPREAD_BUCKETS, SPREAD_CALIBRATION)
    measure_at(measured, SPEC, 1, 11.0)  # as calibrated
    measure_at(measured, SPEC, 64, 148.0)  # twice the calibration
    spec = as_dict(measured.table().speculative)
    line = lambda bucket: 11.0 + (148.0 - 11.0) * (bucket - 1) / 63  # noqa: E731
    # 8, 16 and 32 are nearer to 1 (scale 1: 18, 26 and 42 ms); the line lies above those
    assert [spec[b] for b in (8, 16, 32)] == pytest.approx([line(8), line(16), line(32)])
    measure_at(measured, SPEC, 16, 20.0)  # the nearest measured neighbours now: 1 and 16
    spec = as_dict(measured.table().speculative)
    assert spec[8] == pytest.approx(18.0)  # scaled from 1, above the line's 11 + 9 * 7 / 15
    assert spec[32] == pytest.approx(20.0 + 128.0 * 16 / 48)  # the line through 16 and 64


def test_plain_steps_between_measured_buckets_keep_the_scaled_calibration() -> None:
    measured = MeasuredCosts(SPREAD_BUCKETS, SPREAD_CALIBRATION)
    measure_at(measured, PLAIN, 1, 11.0)
    measure_at(measured, PLAIN, 64, 148.0)
    assert as_dict(measured.table().plain)[16] == pytest.approx(26.0)  # scale 1 from 1, not the line's 43.6


def test_the_speculative_cost_at_64_of_the_interleaved_runs() -> None:
    """The 8B-shaped server of 2026-12-02 (interleaved runs, 04:39 UTC): speculative buckets
    1 and 128 measured (7.812 and 64.565 ms), 64 scaled from 1 to 17.997 ms, so that with plain
    at 64 estimated at 9.139 ms it kept speculating at acceptance 3 for 16 steps; 64 then
    measured 31.92 ms. The line through 1 and 128 gives 35.96: a gain below the policy's
    decisive band, so it would have left speculation at the first such step."""
    buckets = {PLAIN: (64, 128), SPEC: (1, 64, 72, 128)}
    calibration = {PLAIN: {64: 9.139, 128: 10.264},
                   SPEC: {1: 7.812, 64: 17.997, 72: 42.732 / 1.5, 128: 64.565 / 1.5}}
    measured = MeasuredCosts(buckets, calibration)
    measure_at(measured, SPEC, 1, 7.812)
    measure_at(measured, SPEC, 128, 64.565)
    measure_at(measured, PLAIN, 128, 10.264)
    table = measured.table()
    spec = as_dict(table.speculative)
    assert spec[64] == pytest.approx(7.812 + (64.565 - 7.812) * 63 / 127)
    assert spec[72] == pytest.approx(42.732)  # scaled from 128, above the line's 39.5
    assert speculative_gain(3.0, table.plain.lookup(64).step_ms, spec[64]) < 1 / (1 + DEFAULT_DECISIVE_BAND)


def test_estimate_nearest_tie_goes_to_larger_bucket() -> None:
    measured = costs()
    measure_at(measured, PLAIN, 2, 2.0 * CALIBRATION[PLAIN][2])
    measure_at(measured, PLAIN, 6, 4.0 * CALIBRATION[PLAIN][6])
    assert as_dict(measured.table().plain)[4] == pytest.approx(4.0 * CALIBRATION[PLAIN][4])


def test_estimate_uses_other_mode_when_own_mode_unmeasured() -> None:
    measured = costs()
    measure_at(measured, PLAIN, 4, 2.0 * CALIBRATION[PLAIN][4])
    measure_at(measured, PLAIN, 16, 0.5 * CALIBRATION[PLAIN][16])
    spec = as_dict(measured.table().speculative)
    cal = CALIBRATION[SPEC]
    # The other mode's nearest measured bucket to each speculative bucket: 4, 4, 4, 4 (8 is
    # 4 from 4 and 8 from 16).
    assert spec == pytest.approx({b: 2.0 * cal[b] for b in SPEC_BUCKETS})
    assert not any(measured.table().speculative.measured)
    # Once the own mode is measured somewhere, it wins over the other mode.
    measure_at(measured, SPEC, 1, 1.25 * cal[1])
    spec = as_dict(measured.table().speculative)
    assert spec == pytest.approx({b: 1.25 * cal[b] for b in SPEC_BUCKETS})


def test_estimate_skips_measured_buckets_without_calibration() -> None:
    calibration = {PLAIN: {1: 11.0, 2: 12.0, 4: 14.0, 16: 26.0}, SPEC: dict(CALIBRATION[SPEC])}
    measured = costs(calibration)
    measure_at(measured, PLAIN, 6, 99.0)  # measured, but no calibration to scale by
    measure_at(measured, PLAIN, 16, 52.0)  # scale 2
    plain = as_dict(measured.table().plain)
    assert plain[4] == pytest.approx(2.0 * 14.0)  # 6 is nearer but unusable for the scale
    assert plain[6] == 99.0
    # A bucket without calibration: the nearest measured bucket's cost.
    assert plain[8] == 99.0


def test_without_calibration_nearest_measured_cost_or_none() -> None:
    measured = costs({PLAIN: {}, SPEC: {}})
    table = measured.table()
    assert as_dict(table.plain) == {b: None for b in PLAIN_BUCKETS}
    assert as_dict(table.speculative) == {b: None for b in SPEC_BUCKETS}
    measure_at(measured, PLAIN, 2, 7.0)
    measure_at(measured, PLAIN, 16, 9.0)
    table = measured.table()
    assert as_dict(table.plain) == {1: 7.0, 2: 7.0, 4: 7.0, 6: 7.0, 8: 7.0, 16: 9.0}
    # The other mode's measurements do not fill an uncalibrated mode.
    assert as_dict(table.speculative) == {b: None for b in SPEC_BUCKETS}


def test_calibration_of_missing_mode_defaults_to_empty() -> None:
    measured = MeasuredCosts(BUCKETS, {PLAIN: CALIBRATION[PLAIN]})
    assert as_dict(measured.table().speculative) == {b: None for b in SPEC_BUCKETS}


def test_catchup_cost() -> None:
    measured = costs(window=3)
    assert measured.table().catchup_ms == 0.0
    measured.add_catchup(40.0)
    assert measured.table().catchup_ms == 40.0
    for sample in (10.0, 20.0, 90.0):
        measured.add_catchup(sample)
    assert measured.table().catchup_ms == 20.0


# --------------------------------------------------------------------------- vectors


def filled(seed: int) -> MeasuredCosts:
    """Costs with a few measured buckets of both modes and a catch-up."""
    measured = costs()
    measure_at(measured, PLAIN, 2, 12.0 + seed)
    measure(measured, PLAIN, 8, 30.0 + seed, 31.0)  # too few samples to count
    measure_at(measured, SPEC, 4, 40.0 + 2 * seed)
    measured.add_catchup(5.0 + seed)
    return measured


def test_vector_layout() -> None:
    measured = filled(0)
    vector = measured.to_vector()
    assert len(vector) == 2 * (len(PLAIN_BUCKETS) + len(SPEC_BUCKETS)) + 2
    plain_2 = 2 * PLAIN_BUCKETS.index(2)
    # Counts are negated, so that a MAX across ranks keeps the smallest count.
    assert vector[plain_2 : plain_2 + 2] == [12.0, -float(DEFAULT_MIN_SAMPLES)]
    spec_4 = 2 * len(PLAIN_BUCKETS) + 2 * SPEC_BUCKETS.index(4)
    assert vector[spec_4 : spec_4 + 2] == [40.0, -float(DEFAULT_MIN_SAMPLES)]
    assert vector[-2:] == [5.0, -1.0]
    assert all(isinstance(v, float) for v in vector)
    # The count is of every sample, beyond the median's window.
    measure(measured, SPEC, 4, *[40.0] * 20)
    assert measured.to_vector()[spec_4 + 1] == -float(DEFAULT_MIN_SAMPLES + 20)


def test_vector_round_trip() -> None:
    measured = filled(0)
    table = measured.table()
    assert table == measured.table(measured.to_vector())
    # A fresh rank with the same buckets and calibration builds the same table from it.
    assert costs().table(measured.to_vector()) == table
    assert as_dict(table.plain)[2] == 12.0 and table.catchup_ms == 5.0


def test_max_of_rank_vectors_gives_same_table_on_every_rank() -> None:
    rank0, rank1 = filled(0), filled(3)
    measure_at(rank0, SPEC, 1, 30.0)  # only rank 0 measured this bucket
    measure_at(rank1, SPEC, 8, 70.0)  # only rank 1 measured this one
    reduced = [max(a, b) for a, b in zip(rank0.to_vector(), rank1.to_vector())]
    table = rank0.table(reduced)
    assert table == rank1.table(reduced)
    assert table != rank0.table() and table != rank1.table()
    # The slower rank's costs win; a bucket is measured only once every rank measured it.
    assert as_dict(table.plain)[2] == 15.0
    assert measured_flags(table.speculative) == {1: False, 2: False, 4: True, 8: False}
    assert table.catchup_ms == 8.0


@st.composite
def rank_samples(draw: st.DrawFn) -> list[tuple[DecodeMode, int, float]]:
    mode = st.sampled_from([PLAIN, SPEC])
    samples = []
    for _ in range(draw(st.integers(0, 60))):
        m = draw(mode)
        samples.append((m, draw(st.sampled_from(BUCKETS[m])), draw(st.floats(0.5, 100.0))))
    return samples


@settings(max_examples=100, deadline=None)
@given(st.lists(rank_samples(), min_size=2, max_size=4), st.integers(1, 6))
def test_property_reduced_table_same_on_every_rank(
    ranks: list[list[tuple[DecodeMode, int, float]]], min_samples: int
) -> None:
    states = []
    for samples in ranks:
        measured = costs(min_samples=min_samples)
        for mode, bucket, step_ms in samples:
            measured.add_step(mode, bucket, step_ms)
        states.append(measured)
    reduced = [max(column) for column in zip(*(s.to_vector() for s in states))]
    tables = [s.table(reduced) for s in states]
    assert all(t == tables[0] for t in tables)
    # Every rank's own table round-trips through its own vector.
    for state in states:
        assert state.table(state.to_vector()) == state.table()


# --------------------------------------------------------------------------- calibration vectors


def test_calibration_vector_layout_and_round_trip() -> None:
    vector = calibration_vector(BUCKETS, CALIBRATION)
    assert vector == [CALIBRATION[PLAIN][b] for b in PLAIN_BUCKETS] + [
        CALIBRATION[SPEC][b] for b in SPEC_BUCKETS
    ]
    assert calibration_table(BUCKETS, vector) == CALIBRATION


def test_calibration_missing_entries_are_zero_and_dropped() -> None:
    calibration = {PLAIN: {1: 3.0, 8: 5.0}}  # speculative mode not calibrated at all
    vector = calibration_vector(BUCKETS, calibration)
    assert vector == [3.0, 0.0, 0.0, 0.0, 5.0, 0.0] + [0.0] * len(SPEC_BUCKETS)
    assert calibration_table(BUCKETS, vector) == {PLAIN: {1: 3.0, 8: 5.0}, SPEC: {}}


def test_calibration_vector_sorts_and_deduplicates_buckets() -> None:
    buckets = {PLAIN: [4, 1, 4], SPEC: [2]}
    calibration = {PLAIN: {1: 1.0, 4: 4.0}, SPEC: {2: 2.0}}
    vector = calibration_vector(buckets, calibration)
    assert vector == [1.0, 4.0, 2.0]
    assert calibration_table(buckets, vector) == calibration


def test_calibration_max_over_ranks() -> None:
    rank0 = {PLAIN: {b: 1.0 * b for b in PLAIN_BUCKETS}, SPEC: {1: 9.0}}
    rank1 = {PLAIN: {b: 2.0 for b in PLAIN_BUCKETS}, SPEC: {}}
    reduced = [
        max(a, b)
        for a, b in zip(calibration_vector(BUCKETS, rank0), calibration_vector(BUCKETS, rank1))
    ]
    assert calibration_table(BUCKETS, reduced) == {
        PLAIN: {b: max(1.0 * b, 2.0) for b in PLAIN_BUCKETS},
        SPEC: {1: 9.0},
    }


@settings(max_examples=100, deadline=None)
@given(
    st.fixed_dictionaries(
        {
            PLAIN: st.dictionaries(st.sampled_from(PLAIN_BUCKETS), st.floats(1e-3, 1e4)),
            SPEC: st.dictionaries(st.sampled_from(SPEC_BUCKETS), st.floats(1e-3, 1e4)),
        }
    )
)
def test_property_calibration_round_trip(calibration: dict[DecodeMode, dict[int, float]]) -> None:
    assert calibration_table(BUCKETS, calibration_vector(BUCKETS, calibration)) == calibration


# --------------------------------------------------------------------------- crossover


def crossover_table(gains: Mapping[int, float], acceptance: float) -> CostTable:
    """Plain 10 ms everywhere; speculative costs that give ``gains`` at ``acceptance``."""
    plain = mode_costs({b: 10.0 for b in (1, 2, 4, 8, 16, 32)})
    spec = mode_costs({b: acceptance * 10.0 / gain for b, gain in gains.items()})
    return CostTable(plain, spec)


def test_crossover_largest_bucket_that_pays() -> None:
    table = crossover_table({1: 2.0, 2: 1.5, 4: 1.1, 8: 0.9, 16: 0.5}, acceptance=3.0)
    assert crossover_batch(table, 3.0) == 4
    # A higher acceptance moves it up, a lower one down.
    assert crossover_batch(table, 3.0 / 0.85) == 8
    assert crossover_batch(table, 3.0 / 1.6) == 1


def test_crossover_gain_exactly_one_counts() -> None:
    plain = mode_costs({1: 5.0, 2: 5.0, 4: 5.0})
    spec = mode_costs({1: 5.0, 2: 10.0, 4: 20.0})
    assert crossover_batch(CostTable(plain, spec), 2.0) == 2  # 2 * 5 / 10 == 1.0


def test_crossover_none_pays() -> None:
    table = crossover_table({1: 0.9, 2: 0.5}, acceptance=1.0)
    assert crossover_batch(table, 1.0) == 0


def test_crossover_is_the_largest_not_the_first_break() -> None:
    table = crossover_table({1: 1.5, 2: 0.8, 4: 1.2, 8: 0.7}, acceptance=2.0)
    assert crossover_batch(table, 2.0) == 4


def test_crossover_skips_unknown_costs() -> None:
    plain = ModeCosts((1, 2, 4), (10.0, 10.0, None), (True, True, False))
    spec = ModeCosts((1, 2, 4, 8), (5.0, None, 5.0, 5.0), (True, False, True, True))
    # bucket 2: no speculative cost; 4: no plain cost; 8: above the last plain bucket.
    assert crossover_batch(CostTable(plain, spec), 1.0) == 1


def test_crossover_looks_up_plain_at_enclosing_bucket() -> None:
    # Speculative bucket 3 runs against the plain bucket 4.
    plain = mode_costs({2: 1.0, 4: 20.0})
    spec = mode_costs({3: 10.0})
    assert crossover_batch(CostTable(plain, spec), 1.0) == 3
    assert crossover_batch(CostTable(plain, spec), 0.4) == 0


def test_crossover_empty_speculative_buckets() -> None:
    table = CostTable(mode_costs({1: 1.0}), ModeCosts((), (), ()))
    assert crossover_batch(table, 4.0) == 0


def test_measured_buckets_lists_the_timed_entries() -> None:
    costs = ModeCosts((1, 2, 4), (1.0, 2.0, 3.0), (True, False, True))
    assert costs.measured_buckets() == [1, 4]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_crossover_log_gate_logs_the_first_value_and_then_moves_at_most_once_per_interval() -> None:
    clock = FakeClock()
    gate = CrossoverLogGate(interval_s=60.0, clock=clock)
    assert gate.should_log(12)
    assert not gate.should_log(12)
    clock.now = 1.0
    assert not gate.should_log(14)  # a wobble within the interval stays out of the log
    clock.now = 61.0
    assert not gate.should_log(12)  # back at the logged value: nothing moved
    assert gate.should_log(10)
    clock.now = 100.0
    assert not gate.should_log(12)
    clock.now = 121.0
    assert gate.should_log(12)
