"""EAGLE3_DYNAMIC with flashinfer attention (sglang's default on SM120) on the 8B-shaped dummy
model in bf16: the plain graphs get a flashinfer backend instance (and workspace) of their
own; outputs must equal plain decoding's across many switches (numerical ties only where the
plain top-2 margin is below 1e-3) and plain steps must replay plain graphs.

flashinfer JIT-compiles its kernels on a machine's first start with them (minutes); run this
module right after a call that warmed the cache, or alone with time to spare:
``bash test/gpu/run_on_device.sh test/gpu/test_dynamic_eagle_flashinfer.py``.
"""

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
def flashinfer_servers(kit_models):
    target, draft = dummy8b_args(kit_models)
    # The later --attention-backend wins over the triton one in the common arguments.
    flashinfer = ["--attention-backend", "flashinfer"]
    specs = {
        "flashinfer_plain": target + flashinfer + ["--mem-fraction-static", "0.4"],
        "flashinfer_dynamic": target + flashinfer + [
            "--mem-fraction-static", "0.6", "--speculative-algorithm", "EAGLE3_DYNAMIC", *draft,
            *FIXED_THRESHOLD_FLAGS],
    }
    with running_servers(specs) as started:
        yield started


def test_lossless_across_switches_with_flashinfer(flashinfer_servers):
    counters = assert_lossless_across_switches(
        flashinfer_servers["flashinfer_dynamic"], flashinfer_servers["flashinfer_plain"],
        make_prompts(NUM_PROMPTS, seed=31), WAVE_SIZE, "flashinfer")
    assert counters["plain_graph_steps"] == counters["plain_steps"] > 0
