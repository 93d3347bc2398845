"""EAGLE3_DYNAMIC with --disable-overlap-schedule (sglang then drives the spec-v2 worker
synchronously, without the future map or on_publish), on the 8B-shaped dummy model in bf16:
outputs equal plain decoding's across many switches (numerical ties only where the plain
top-2 margin is below 1e-3), and prefills are timed there too."""

from __future__ import annotations

import pytest

from gpu_servers import (
    FIXED_THRESHOLD_FLAGS,
    assert_lossless_across_switches,
    dummy8b_args,
    make_prompts,
    running_servers,
)

pytestmark = pytest.mark.gpu

NUM_PROMPTS = 48
WAVE_SIZE = 4


@pytest.fixture(scope="module")
def sync_servers(kit_models):
    target, draft = dummy8b_args(kit_models)
    specs = {
        "sync_plain": target + ["--mem-fraction-static", "0.4"],
        "sync_dynamic": target + ["--mem-fraction-static", "0.6", "--disable-overlap-schedule",
                                  "--speculative-algorithm", "EAGLE3_DYNAMIC", *draft,
                                  *FIXED_THRESHOLD_FLAGS],
    }
    with running_servers(specs) as started:
        yield started


def test_lossless_across_switches_without_overlap(sync_servers):
    counters = assert_lossless_across_switches(
        sync_servers["sync_dynamic"], sync_servers["sync_plain"], make_prompts(NUM_PROMPTS, seed=11),
        WAVE_SIZE, "non-overlap")
    assert counters["prefill_batches"] > 0
