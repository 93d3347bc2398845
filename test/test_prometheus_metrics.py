"""Prometheus export of the mode counters (--enable-metrics) and the decode-stats hook that drives it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from sglang_dynamic_eagle.observability.counters import ModeCounters
from sglang_dynamic_eagle.observability.prefill_timing import PrefillTimer
from sglang_dynamic_eagle.observability.prometheus_metrics import (
    COUNTERS,
    GAUGES,
    DynamicEagleMetrics,
    MetricsExport,
)
from sglang_dynamic_eagle.policy import DecodeMode
from sglang_dynamic_eagle.sglang_compat.hooks import reporting

LABELS = {"model_name": "m", "tp_rank": "0"}


def sample(registry: CollectorRegistry, name: str) -> float:
    return registry.get_sample_value(f"sglang:dynamic_eagle_{name}", LABELS)


def assert_samples(registry: CollectorRegistry, expected: dict) -> None:
    assert {name: sample(registry, name) for name in expected} == expected


def counters_after(steps: list) -> ModeCounters:
    counters = ModeCounters()
    for mode, batch_size in steps:
        counters.record_step(mode, batch_size, ran_graph=mode is DecodeMode.PLAIN)
        if mode is DecodeMode.SPECULATIVE:
            counters.record_result([2] * batch_size)
        else:
            counters.record_result([0] * batch_size)
    return counters


def test_counters_follow_snapshots_without_double_counting() -> None:
    registry = CollectorRegistry()
    metrics = DynamicEagleMetrics(LABELS, registry=registry)
    counters = counters_after([(DecodeMode.SPECULATIVE, 2), (DecodeMode.PLAIN, 64)])
    counters.record_switch(DecodeMode.PLAIN)
    metrics.update(counters.snapshot(), speculative=False)
    metrics.update(counters.snapshot(), speculative=False)
    assert_samples(registry, {
        "speculative_steps_total": 1, "plain_steps_total": 1, "plain_graph_steps_total": 1,
        "switches_to_plain_total": 1, "speculative_mode": 0,
    })
    assert sample(registry, "mean_accept_length") == pytest.approx(3.0)

    counters.record_step(DecodeMode.SPECULATIVE, 2, ran_graph=True)
    counters.record_switch(DecodeMode.SPECULATIVE)
    counters.record_catchup(tokens=6, truncated_tokens=1)
    metrics.update(counters.snapshot(), speculative=True)
    assert_samples(registry, {
        "speculative_steps_total": 2, "switches_to_speculative_total": 1,
        "catchup_tokens_total": 6, "catchup_truncated_tokens_total": 1, "speculative_mode": 1,
    })


def test_prefill_timings_are_exported_as_they_grow() -> None:
    registry = CollectorRegistry()
    metrics = DynamicEagleMetrics(LABELS, registry=registry)
    report = {**ModeCounters().snapshot(), "prefill_batches": 2, "prefill_tokens": 1500,
              "prefill_target_gpu_ms": 40.5, "prefill_draft_gpu_ms": 1.25}
    metrics.update(report, speculative=True)
    metrics.update({**report, "prefill_batches": 3, "prefill_draft_gpu_ms": 2.0}, speculative=True)
    assert_samples(registry, {
        "prefill_batches_total": 3, "prefill_tokens_total": 1500,
        "prefill_target_gpu_ms_total": 40.5, "prefill_draft_gpu_ms_total": 2.0,
    })


def test_every_exported_counter_is_in_the_snapshot() -> None:
    assert set(COUNTERS) <= set(ModeCounters().snapshot()) | set(PrefillTimer().report())


def _throughput_policy():
    """The automatic policy on a made-up calibration where speculation (4 tokens a request at
    most) pays up to batch 10: plain 10 + 0.05 b ms, speculative 12 + 3 b ms."""
    from sglang_dynamic_eagle.policy.throughput import (
        ThroughputPolicyConfig,
        new_throughput_policy,
    )

    plain, spec = [1, 2, 4, 8, 16, 32], [1, 2, 4, 8, 16, 32]
    return new_throughput_policy(
        ThroughputPolicyConfig(max_speculative_batch=32, max_running_requests=32,
                               kv_capacity_tokens=100_000, catchup_window=16),
        {DecodeMode.PLAIN: plain, DecodeMode.SPECULATIVE: spec},
        {DecodeMode.PLAIN: {b: 10.0 + 0.05 * b for b in plain},
         DecodeMode.SPECULATIVE: {b: 12.0 + 3.0 * b for b in spec}},
        {DecodeMode.PLAIN: 0.0, DecodeMode.SPECULATIVE: 0.0},
        catchup_prior_fixed_ms=1.0,
        max_acceptance=4.0,
    )


def _worker_report(policy) -> dict:
    """DynamicEagleWorker.report() of a worker with stand-ins for its GPU parts."""
    import torch

    from sglang_dynamic_eagle.engine.draft_catchup import DraftCatchup
    from sglang_dynamic_eagle.engine.early_first_token import EarlyFirstToken
    from sglang_dynamic_eagle.engine.observations import PolicyFeed, RequestAcceptance
    from sglang_dynamic_eagle.engine.plain_decode_graphs import PlainDecodeGraphs
    from sglang_dynamic_eagle.engine.worker import DynamicEagleWorker

    worker = object.__new__(DynamicEagleWorker)
    worker.counters = counters_after([(DecodeMode.SPECULATIVE, 2), (DecodeMode.PLAIN, 8)])
    worker._policy = policy
    worker._feed = PolicyFeed(policy)
    worker.queued = 3
    worker._catchup = DraftCatchup(req_pool_size=4, ring_size=1024, max_window=64, hidden_width=4,
                                   hidden_dtype=torch.float32, device=torch.device("cpu"))
    worker._plain_graphs = object.__new__(PlainDecodeGraphs)
    worker._plain_graphs.graph_runner, worker._plain_graphs.capture_seconds = None, 1.0
    worker._plain_graphs.capture_gib = 0.5
    worker.request_acceptance = RequestAcceptance()
    worker.prefill_timer = PrefillTimer()
    worker.early_first_token = EarlyFirstToken(True)  # not attached: off, with its reason
    return worker.report()


def test_every_exported_metric_is_in_the_worker_report_of_the_automatic_policy() -> None:
    policy = _throughput_policy()
    policy.add_verify([2, 2])
    report = _worker_report(policy)
    assert report["policy"] == "throughput"
    assert set(COUNTERS) | set(GAUGES) <= set(report)
    registry = CollectorRegistry()
    DynamicEagleMetrics(LABELS, registry=registry).update(report, speculative=True)
    # One verify of two requests with two drafts each: 3 tokens a request, an estimate of 3.44
    # (shrunk towards the full acceptance, 4); speculation pays where 3.44 * (10 + 0.05 b) >=
    # 12 + 3 b, up to b = 7: the bucket 4.
    assert report["acceptance_estimate"] == pytest.approx(3.4444, abs=1e-4)
    assert_samples(registry, {
        "acceptance_estimate": 3.4444, "crossover_batch": 4, "mean_accept_length": 3.0,
        "speculative_steps_total": 1, "plain_steps_total": 1,
    })


def test_the_threshold_policy_reports_no_crossover() -> None:
    from sglang_dynamic_eagle.policy import ThresholdPolicy, ThresholdPolicyConfig

    report = _worker_report(ThresholdPolicy(ThresholdPolicyConfig(24, 16, 4, 48)))
    assert report["policy"] == "threshold" and report["crossover_batch"] == 0
    assert set(COUNTERS) <= set(report)


def test_every_series_exists_before_its_first_increment() -> None:
    registry = CollectorRegistry()
    DynamicEagleMetrics(LABELS, registry=registry)
    assert all(sample(registry, f"{key}_total") == 0 for key in COUNTERS)


class _FakeWorker:
    def __init__(self, mode: DecodeMode) -> None:
        self.counters = counters_after([(DecodeMode.PLAIN, 8)])
        self.mode = mode
        self.metrics_export = MetricsExport()

    def report(self) -> dict:
        return {**self.counters.snapshot(), "crossover_batch": 12, "acceptance_estimate": 2.5}


def _reporter(enable_metrics: bool, forward_ct_decode: int) -> SimpleNamespace:
    return SimpleNamespace(
        scheduler=object(), is_stats_logging_rank=True, forward_ct_decode=forward_ct_decode,
        decode_log_interval=40, enable_metrics=enable_metrics,
        metrics_collector=SimpleNamespace(labels=LABELS) if enable_metrics else None,
    )


def test_decode_stats_hook_exports_only_with_metrics_on_the_log_schedule(monkeypatch) -> None:
    registry = CollectorRegistry()
    created = []

    def metrics_in_test_registry(labels, _registry=None):
        created.append(DynamicEagleMetrics(labels, registry=registry))
        return created[-1]

    monkeypatch.setattr("sglang_dynamic_eagle.observability.prometheus_metrics.DynamicEagleMetrics",
                        metrics_in_test_registry)
    worker = _FakeWorker(DecodeMode.PLAIN)
    monkeypatch.setattr(reporting, "dynamic_worker", lambda scheduler: worker)

    reporting.report_with_decode_stats(None, _reporter(False, 40))
    assert not created
    reporting.report_with_decode_stats(None, _reporter(True, 41))
    assert not created
    reporting.report_with_decode_stats(None, _reporter(True, 80))
    reporting.report_with_decode_stats(None, _reporter(True, 120))
    assert len(created) == 1 and worker.metrics_export.enabled
    assert sample(registry, "plain_steps_total") == 1
    assert sample(registry, "speculative_mode") == 0


def test_a_failing_export_is_switched_off_not_raised(monkeypatch, caplog) -> None:
    def broken(labels, registry=None):
        raise ValueError("Duplicated timeseries in CollectorRegistry")

    monkeypatch.setattr("sglang_dynamic_eagle.observability.prometheus_metrics.DynamicEagleMetrics",
                        broken)
    worker = _FakeWorker(DecodeMode.SPECULATIVE)
    monkeypatch.setattr(reporting, "dynamic_worker", lambda scheduler: worker)
    reporting.report_with_decode_stats(None, _reporter(True, 40))
    reporting.report_with_decode_stats(None, _reporter(True, 80))
    assert worker.metrics_export.enabled is False
    assert sum("Prometheus export failed" in record.getMessage() for record in caplog.records) == 1


def _gpu_export_check():
    """test/gpu/test_prometheus_export.py's parser and check, loaded without a GPU."""
    import importlib.util
    import sys
    from pathlib import Path

    gpu = Path(__file__).parent / "gpu"
    sys.path.insert(0, str(gpu))
    try:
        spec = importlib.util.spec_from_file_location("gpu_prometheus_export", gpu / "test_prometheus_export.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(gpu))
    return module


def test_the_gpu_export_check_passes_on_a_real_exposition_and_fails_on_each_broken_one() -> None:
    from prometheus_client import generate_latest

    check = _gpu_export_check()
    counters = counters_after([(DecodeMode.SPECULATIVE, 4)] * 3 + [(DecodeMode.PLAIN, 1)] * 2
                              + [(DecodeMode.SPECULATIVE, 2)])
    counters.record_switch(DecodeMode.PLAIN)
    counters.record_switch(DecodeMode.SPECULATIVE)
    report = {**counters.snapshot(), "acceptance_estimate": 2.5, "crossover_batch": 8}
    registry = CollectorRegistry()
    DynamicEagleMetrics(LABELS, registry).update(report, speculative=True)
    text = generate_latest(registry).decode()
    series = check.exported(text)
    check.check_export(series, report)  # the intact export passes
    broken = {
        "a series missing": check.exported("\n".join(
            line for line in text.splitlines() if "catchup_tokens_total" not in line)),
        "a mode that never ran": {**series, "plain_steps_total": 0.0},
        "ahead of the report": {**series, "switches_to_plain_total": report["switches_to_plain"] + 1},
        "a mode gauge out of range": {**series, "speculative_mode": 2.0},
        "no acceptance": {**series, "mean_accept_length": 0.0},
    }
    for name, variant in broken.items():
        with pytest.raises(AssertionError):
            check.check_export(variant, report)
            pytest.fail(f"passed with {name}")
