"""EAGLE3_DYNAMIC on an MLA + MoE target: the DeepSeek-V3-shaped dummy pair written by
models/mla_moe_dummy_pair.py (bf16, dummy weights, triton attention, which serves MLA here).
Outputs equal plain decoding's across many switches (numerical ties only where the plain
top-2 margin is below 1e-3), plain steps replay plain graphs, and more than 48 requests run
at once."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gpu_servers import (
    COMMON_SERVER_ARGS,
    FIXED_THRESHOLD_FLAGS,
    REPO_ROOT,
    assert_lossless_across_switches,
    eagle3_args,
    make_prompts,
    running_servers,
)

pytestmark = pytest.mark.gpu

NUM_PROMPTS = 48
WAVE_SIZE = 4


@pytest.fixture(scope="module")
def mla_moe_servers(kit_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("mla_moe_pair")
    written = subprocess.run(
        [sys.executable, str(REPO_ROOT / "models" / "mla_moe_dummy_pair.py"), "--out", str(out),
         "--tokenizer-from", str(kit_models / "llama8b")],
        capture_output=True, text=True, check=True,
    )
    target_path, draft_path = (Path(line) for line in written.stdout.split())
    target = ["--model-path", str(target_path), "--load-format", "dummy", *COMMON_SERVER_ARGS]
    specs = {
        "mla_moe_plain": target + ["--mem-fraction-static", "0.4"],
        "mla_moe_dynamic": target + ["--mem-fraction-static", "0.6",
                                     "--speculative-algorithm", "EAGLE3_DYNAMIC",
                                     *eagle3_args(draft_path, dummy=True),
                                     *FIXED_THRESHOLD_FLAGS],
    }
    with running_servers(specs) as started:
        yield started


def test_lossless_across_switches_on_mla_moe(mla_moe_servers):
    counters = assert_lossless_across_switches(
        mla_moe_servers["mla_moe_dynamic"], mla_moe_servers["mla_moe_plain"],
        make_prompts(NUM_PROMPTS, seed=21), WAVE_SIZE, "MLA + MoE")
    assert counters["plain_graph_steps"] == counters["plain_steps"] > 0


def test_more_than_48_requests_at_once_on_mla_moe(mla_moe_servers):
    server = mla_moe_servers["mla_moe_dynamic"]
    prompts = make_prompts(96, seed=22)
    with ThreadPoolExecutor(max_workers=96) as pool:
        list(pool.map(lambda p: server.generate(p["input_ids"][:64], 48), prompts))
    assert server.dynamic_counters()["max_plain_batch"] > 48
