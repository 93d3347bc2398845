"""The step-cost model (policy/step_model.py): what its fit learns from timed steps, and what a
few steps cannot make it believe."""

from __future__ import annotations

import numpy as np
import pytest

from sglang_dynamic_eagle.policy import step_model
from sglang_dynamic_eagle.policy.step_model import ModeCost

BUCKETS = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128]
KV_PRIOR_MS = 131072 / 4e9  # 8B-shaped target: KV bytes per token over 4 TB/s


def bucket_of(b: int) -> int:
    return next(x for x in BUCKETS if x >= b)


def plain_replay(bucket: int) -> float:
    return 4.6 + 0.01 * bucket


def new_cost() -> ModeCost:
    return ModeCost(BUCKETS, {b: plain_replay(b) for b in BUCKETS}, KV_PRIOR_MS)


def test_a_few_steps_at_nearby_batch_sizes_do_not_set_the_per_request_cost() -> None:
    """16 plain steps at 1-8 requests with a millisecond of host jitter (a server's first light
    traffic): the prediction at 72 requests stays near what its replay says. With a per-request
    prior of almost no weight, the fit's slope took it to 2x (15 ms where the step took 8)."""
    rng = np.random.default_rng(3)
    cost = new_cost()
    for _ in range(16):
        b = int(rng.integers(1, 9))
        kv = 700 * b
        ms = plain_replay(bucket_of(b)) + 0.3 + KV_PRIOR_MS * kv + rng.uniform(0, 1.0) * (b < 3)
        cost.add(bucket_of(b), kv, ms, batch_size=b)
    truth = plain_replay(72) + 0.3 + KV_PRIOR_MS * 72 * 700
    assert cost.predict(72, 72 * 700) == pytest.approx(truth, rel=0.15)


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


def test_the_per_request_prior_is_what_keeps_the_extrapolation_sane(monkeypatch) -> None:
    """The first test's bar fails without the prior's weight (the check can fail)."""
    monkeypatch.setattr(step_model, "PRIOR_PER_REQUEST_SAMPLES", 1e-9)
    with pytest.raises(AssertionError):
        test_a_few_steps_at_nearby_batch_sizes_do_not_set_the_per_request_cost()
