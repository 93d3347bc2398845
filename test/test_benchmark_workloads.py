"""Named workloads (benchmark/sweeplib/workloads.py): what bench_serving is asked to send."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib import workloads  # noqa: E402
from sweeplib.workloads import Options, Segment, parse_workloads  # noqa: E402


def one(name: str, **options) -> workloads.Workload:
    (found,) = workloads.workload(name, Options(**options))
    return found


def test_closed_loop_keeps_the_former_sweeps_shape():
    assert one("closed-64").segments == (Segment(512, 256, 128, concurrency=64),)
    assert one("closed-1").segments[0].prompts == 16  # at least --min-prompts
    assert one("closed-16@1024x2", waves=4).segments == (Segment(1024, 2, 64, concurrency=16),)


def test_poisson_sends_mixed_lengths_for_the_traffic_window():
    (segment,) = one("poisson-12.5", traffic_s=20).segments
    assert (segment.rate, segment.prompts, segment.concurrency) == (12.5, 250, None)
    assert (segment.input_len, segment.output_len, segment.range_ratio) == (1024, 512, 0.25)
    assert one("poisson-0.1").segments[0].prompts == 8  # a floor, so a light rate still gives percentiles
    assert one("poisson-37.5@6", traffic_s=20).segments[0].prompts == 225  # its own window


def test_shared_sends_poisson_requests_after_eight_system_prompts_a_whole_number_of_each():
    (segment,) = one("shared-6", traffic_s=20).segments
    assert (segment.rate, segment.prompts, segment.groups, segment.prefix_len) == (6.0, 120, 8, 2048)
    assert (segment.input_len, segment.output_len, segment.range_ratio, segment.concurrency) == (256, 512, 0.25, None)
    assert one("shared-5@5").segments[0].prompts == 32  # 25 rounded up to whole groups
    assert one("shared-0.1").segments[0].prompts == 8  # the floor of poisson-R
    assert one("poisson-6").segments[0].groups == 0


def test_load_step_is_light_traffic_then_two_closed_waves_of_128_then_idle():
    light, step, idle = one("load-step", idle_s=7).segments
    assert (light.rate, light.prompts / light.rate) == (2.0, 15.0)
    assert (step.concurrency, step.prompts, step.input_len, step.output_len) == (128, 256, 512, 256)
    assert step.rate == math.inf
    assert (idle.prompts, idle.idle_s) == (0, 7)


def test_bursts_are_sent_at_once_with_idle_gaps_between_them():
    segments = one("burst-32", idle_s=3).segments
    assert [(s.prompts, s.rate, s.idle_s) for s in segments] == [(32, math.inf, 3), (32, math.inf, 3),
                                                                 (32, math.inf, 0)]
    assert one("burst").segments[0].prompts == 64


def test_long_context_is_three_workloads_of_8192_input():
    found = parse_workloads(["long-context"])
    assert [w.name for w in found] == ["long-1", "long-8", "long-32"]
    assert [(w.segments[0].input_len, w.segments[0].output_len, w.segments[0].concurrency) for w in found] == [
        (8192, 256, 1), (8192, 256, 8), (8192, 256, 32)]


def test_names_come_comma_separated_from_repeated_flags_in_order():
    names = [w.name for w in parse_workloads(["poisson-2,closed-4", "load-step"])]
    assert names == ["poisson-2", "closed-4", "load-step"]
    with pytest.raises(ValueError, match="twice"):
        parse_workloads(["poisson-2", "poisson-2"])


@pytest.mark.parametrize("name", ["poisson", "poisson-0", "poisson-x", "poisson-4@0", "closed-4@512",
                                  "closed-0", "long-",
                                  "steady", "burst--1"])
def test_malformed_names_are_refused(name):
    with pytest.raises(ValueError):
        workloads.workload(name)


def test_expected_duration_counts_arrivals_idle_and_per_run_overhead():
    assert one("poisson-10", traffic_s=20).expected_s() == pytest.approx(20 + workloads.SEGMENT_OVERHEAD_S)
    assert one("load-step", idle_s=5).expected_s() == pytest.approx(15 + 2 * workloads.SEGMENT_OVERHEAD_S + 5)


def test_a_workload_can_carry_its_simulated_acceptance():
    mixed = one("poisson-6@10~1.3:0.5/4.0:0.5")
    assert mixed.name == "poisson-6@10~1.3:0.5/4.0:0.5" and mixed.acceptance == "1.3:0.5,4.0:0.5"
    assert mixed.segments == one("poisson-6@10").segments and one("poisson-6@10").acceptance is None
    assert [w.name for w in workloads.workload("long-context~1.6")] == [
        "long-1~1.6", "long-8~1.6", "long-32~1.6"]
    assert one("closed-2~3.0:1").acceptance == "3.0:1"
    for bad in ("closed-2~", "closed-2~0.5", "closed-2~1.3:0.5/4.0", "closed-2~2:0.5/3:0.4", "closed-2~x",
                "closed-2~1.3:0.5"):
        with pytest.raises(ValueError, match=f"^workload '{bad}': .*separated by '/'"):
            workloads.workload(bad)
