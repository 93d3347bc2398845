"""GPU-test fixtures; the server helpers live in gpu_servers.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Iterator, List

import pytest

from sglang_dynamic_eagle.config import CATCHUP_WINDOW_ENV, EARLY_FIRST_TOKEN_ENV, SPLITKV_VERIFY_ENV

from gpu_servers import (
    TINY_DYNAMIC_TRITON_CACHE,
    MODEL_FOLDERS,
    FIXED_THRESHOLD_FLAGS,
    TINY_PAIR,
    TINY_MEMORY_ARGS,
    TREE_SHAPE,
    LazyServers,
    servers_used_by,
    tiny_pair_args,
    tiny_pair_server_env,
)


@pytest.fixture(scope="session")
def model_folders() -> Path:
    if MODEL_FOLDERS is None or not (MODEL_FOLDERS / "llama8b" / "config.json").exists():
        pytest.fail(f"8B-shaped model folders not found at {MODEL_FOLDERS}: set SGLANG_DE_MODELS to "
                    "a folder holding llama8b/ and eagle3-llama8b/")
    return MODEL_FOLDERS


@pytest.fixture(scope="session")
def eval_set() -> dict:
    path = TINY_PAIR / "eval_prompts.json"
    if not path.exists():
        pytest.fail(f"{path} not found: train the pair with models/train_tiny_pair.py")
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def tiny_servers(request: pytest.FixtureRequest) -> Iterator[LazyServers]:
    """Plain, EAGLE3 and EAGLE3_DYNAMIC (fixed thresholds, and automatic) servers of the tiny
    trained pair, EAGLE3 and EAGLE3_DYNAMIC (fixed thresholds) with a tree of topk 4, the
    catch-up test's negative control (EAGLE3_DYNAMIC with a catch-up window of 1), the
    sampling tests' (EAGLE3_DYNAMIC whose plain steps sample greedily), the retraction test's
    (EAGLE3_DYNAMIC whose scheduler retracts requests on purpose) and the early first token's
    (sglang's order, a slow side stream, and one without the barrier's wait), one that always
    speculates (its verifies batch up to 32 requests through the split-KV kernel, which every
    chain here takes) and one whose verifies keep sglang's prefill kernel. Those that the selected
    tests name in their ``uses_servers`` markers start together before the first of them runs;
    any other starts when a test first uses it."""
    common, draft = tiny_pair_args(backends="sglang")
    common = common + TINY_MEMORY_ARGS
    tree_draft = ["--speculative-draft-model-path", str(TINY_PAIR / "draft"), *TREE_SHAPE]
    specs = {
        "tiny_plain": common,
        "tiny_eagle3": common + ["--speculative-algorithm", "EAGLE3", *draft],
        "tiny_dynamic": common + ["--speculative-algorithm", "EAGLE3_DYNAMIC", *draft,
                                  *FIXED_THRESHOLD_FLAGS],
        "tiny_dynamic_auto": common + ["--speculative-algorithm", "EAGLE3_DYNAMIC", *draft],
        "tiny_eagle3_tree": common + ["--speculative-algorithm", "EAGLE3", *tree_draft],
        "tiny_dynamic_tree": common + ["--speculative-algorithm", "EAGLE3_DYNAMIC", *tree_draft,
                                       *FIXED_THRESHOLD_FLAGS],
        # Negative control of the catch-up test: it catches up one position per request.
        "tiny_dynamic_window1": common + ["--speculative-algorithm", "EAGLE3_DYNAMIC", *draft,
                                          *FIXED_THRESHOLD_FLAGS],
        # Negative control of the sampling tests: its plain steps sample greedily.
        "tiny_dynamic_greedy_plain": common + ["--speculative-algorithm", "EAGLE3_DYNAMIC", *draft,
                                               *FIXED_THRESHOLD_FLAGS],
        # The early first token's test: sglang's order; a slow side stream; its negative control.
        "tiny_dynamic_late_first_token": common + ["--speculative-algorithm", "EAGLE3_DYNAMIC",
                                                   *draft, *FIXED_THRESHOLD_FLAGS],
        "tiny_dynamic_slow_side": common + ["--speculative-algorithm", "EAGLE3_DYNAMIC", *draft,
                                            *FIXED_THRESHOLD_FLAGS],
        "tiny_dynamic_slow_side_no_barrier": common + ["--speculative-algorithm", "EAGLE3_DYNAMIC",
                                                       *draft, *FIXED_THRESHOLD_FLAGS],
        # The split-KV verify at larger batches (it speculates at every batch its graphs cover), and
        # a verify's attention on sglang's prefill kernel instead (sglang_compat.triton_verify).
        "tiny_dynamic_always": common + ["--speculative-algorithm", "EAGLE3_DYNAMIC", *draft,
                                         "--speculative-disable-batch-threshold", "0"],
        "tiny_dynamic_prefill_verify": common + ["--speculative-algorithm", "EAGLE3_DYNAMIC", *draft,
                                                 *FIXED_THRESHOLD_FLAGS],
        # The retraction test's: sglang's scheduler retracts a decoding request every third forward.
        "tiny_dynamic_retract": common + ["--speculative-algorithm", "EAGLE3_DYNAMIC", *draft,
                                          *FIXED_THRESHOLD_FLAGS],
    }
    env = tiny_pair_server_env()
    shutil.rmtree(TINY_DYNAMIC_TRITON_CACHE, ignore_errors=True)  # its own, empty: see the test
    server_envs = {
        "tiny_dynamic": {"TRITON_CACHE_DIR": str(TINY_DYNAMIC_TRITON_CACHE)},
        "tiny_dynamic_window1": {CATCHUP_WINDOW_ENV: "1"},
        "tiny_dynamic_greedy_plain": {"SGLANG_DE_TEST_BREAK_PLAIN_STEP": "greedy"},
        "tiny_dynamic_retract": {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "3"},
        "tiny_dynamic_late_first_token": {EARLY_FIRST_TOKEN_ENV: "0"},
        "tiny_dynamic_slow_side": {"SGLANG_DE_TEST_SLOW_SIDE_STREAM": "slow"},
        "tiny_dynamic_slow_side_no_barrier": {"SGLANG_DE_TEST_SLOW_SIDE_STREAM": "slow-no-barrier"},
        "tiny_dynamic_prefill_verify": {SPLITKV_VERIFY_ENV: "0"},
    }
    servers = LazyServers(specs, env=env, server_envs=server_envs)
    try:
        servers.start(servers_used_by(request.session.items, specs))
        yield servers
    finally:
        servers.stop_all()


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    """Run the tests on the session-wide tiny servers last. Those servers hold their GPU memory
    until the session ends, so a module that starts its own servers after them finds too little
    memory left (the 8B-shaped dummy servers died that way in the device run of 2026-11-29)."""
    items.sort(key=lambda item: "tiny_servers" in getattr(item, "fixturenames", ()))
