"""The decision log behind /server_info's recent decisions: a decision meets the time measured
for its step, and only a time of the mode it chose; the error is predicted against measured."""

from __future__ import annotations

import pytest

from sglang_dynamic_eagle.engine.observations import PolicyFeed
from sglang_dynamic_eagle.observability.decision_log import RECENT_DECISIONS, DecisionLog
from sglang_dynamic_eagle.policy import DecodeMode, ThresholdPolicy, ThresholdPolicyConfig
from sglang_dynamic_eagle.policy.throughput import Decision

PLAIN, SPEC = DecodeMode.PLAIN, DecodeMode.SPECULATIVE


def decision(step: int, mode: DecodeMode = SPEC, predicted_ms: float = 10.0) -> Decision:
    return Decision(step=step, mode=mode, batch=4, projected_batch=4, kv_tokens=2000, queued=0,
                    plain_tok_per_s=400.0, spec_tok_per_s=800.0, spec_tokens=10.0,
                    predicted_ms=predicted_ms, reason="stay")


def test_a_decision_meets_its_measured_time_and_the_error_is_relative() -> None:
    log = DecisionLog()
    log.decided(decision(1, predicted_ms=10.0))
    log.decided(decision(2, predicted_ms=10.0))
    log.timed(1, SPEC, 8.0)
    log.timed(2, SPEC, 20.0)
    log.decided(decision(3))
    report = log.report()
    assert [(d["step"], d["measured_ms"]) for d in report["recent_decisions"]] == [
        (1, 8.0), (2, 20.0), (3, None)]
    assert report["prediction_error"] == pytest.approx((2 / 8 + 10 / 20) / 2, abs=1e-4)


def test_a_time_of_the_other_mode_or_of_a_forgotten_step_is_not_logged() -> None:
    log = DecisionLog()
    log.decided(decision(1, mode=SPEC))
    log.timed(1, PLAIN, 5.0)  # not the step the policy decided
    for step in range(2, 4 * RECENT_DECISIONS + 3):
        log.decided(decision(step))
    log.timed(2, SPEC, 9.0)  # waited longer than the log keeps
    log.timed(4 * RECENT_DECISIONS + 2, SPEC, 9.0)
    recent = log.report()["recent_decisions"]
    assert [(d["step"], d["measured_ms"]) for d in recent] == [(4 * RECENT_DECISIONS + 2, 9.0)]
    assert log.report()["prediction_error"] == pytest.approx(1 / 9, abs=1e-4)


def test_nothing_decided_reports_nothing() -> None:
    log = DecisionLog()
    log.decided(None)  # an automatic policy before its first decision
    assert log.report() == {"prediction_error": 0.0, "recent_decisions": []}


def test_the_fixed_thresholds_report_no_decisions() -> None:
    """They predict nothing: their feed reports the crossover (0) and no decision log."""
    policy = ThresholdPolicy(ThresholdPolicyConfig(24, 16, 4, 128))
    feed = PolicyFeed(policy)
    feed.step_end(1, 0.0, 0.0)
    assert feed.report() == {"crossover_batch": 0}
