"""What stale prompt draft KV costs, with a draft that must read its context.

The committed tiny pair's draft reads little of its context (its target copies about 10% of a
repeated 96-token span, checked with transformers on the CPU, 2026-12-02), so the deferred
draft prefill's window-of-one control passes the 10% acceptance bar too. This module trains a
recall pair first (``models/train_tiny_pair.py --set repeat_chunk=96``: every training
document's chunks of 96 tokens come twice, so both models learn to copy from 96 positions
back), then sends prompts ``<s> X X[:16]`` (X: 96 held-out tokens), whose continuation copies
X from the prompt, as the deferred-prefill load does: prefills that join a batch expected to
decode plainly skip the draft's prefill, and speculation resumes a few positions later.

* a window covering the prompt (every skipped position rebuilt by the catch-up) is lossless
  against plain decoding and accepts within 10% of always-on EAGLE3;
* a window of 16 positions leaves X's draft KV stale, which the copying draft reads: it must
  fall short of that bar (the negative control, now able to fail), and the printed gap is
  what stale prompt draft KV costs such a draft.

And the default for requests that ask for at most two tokens (``short_requests``): such
requests prefill the recall prompts (the draft's prefill skipped), then lone long requests
send the same prompts. With the short requests' separate radix cache (the default) the long
requests reuse none of it: lossless and within 10% of EAGLE3's acceptance. Its negative
control, ``shared-cache``, lets them reuse the prompts' stale draft KV and must fall short.

Set SGLANG_DE_RECALL_PAIR to a folder of an earlier training run to skip the training
(about two minutes on one H200).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from sglang_dynamic_eagle.deferred_draft_prefill import DEFER_ENV
from sglang_dynamic_eagle.short_requests import SHORT_PREFILL_ENV, ShortPrefill

from gpu_servers import (FIXED_THRESHOLD_FLAGS, REPO_ROOT, TINY_MEMORY_ARGS, LazyServers,
                         tiny_pair_args, tiny_pair_server_env)
from test_dynamic_eagle_tiny import (MAX_ACCEPTANCE_LOSS, MIN_CATCHUP_GAIN, deferred_run,
                                     eagle3_acceptance_of, send, spec_acceptance)
from token_comparison import first_difference

pytestmark = pytest.mark.gpu

RECALL_PAIR_ENV = "SGLANG_DE_RECALL_PAIR"
RECALL_CHUNK = 96
RECALL_CUE = 16  # tokens of X repeated at the prompt's end
RECALL_TOKENS = RECALL_CHUNK - RECALL_CUE  # the rest of X, copied from the prompt
COVERING_WINDOW = 128  # more than the prompt's 1 + 96 + 16 positions
SHORT_WINDOW = RECALL_CUE  # X's positions stay stale
# The premise: the trained target predicts second copies (teacher-forced) at least this well.
MIN_COPY_ACCURACY = 0.8
# The premise of the control: always-on EAGLE3 (a chain of 3, at most 4 tokens per verify)
# accepts at least this much on the recall targets, so the draft does copy from 96 back.
MIN_EAGLE3_RECALL_ACCEPTANCE = 3.0
PREFIX_MATCH_SLACK = 4  # tokens per request the radix cache may match (the <s> at least)
RECALL_TARGETS = 2
FILLERS = 12
FILLER_TOKENS = 6
TRAIN_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def recall_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get(RECALL_PAIR_ENV)
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("recall_pair")
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "models" / "train_tiny_pair.py"),
         "--set", f"repeat_chunk={RECALL_CHUNK}", "--out", str(out)],
        capture_output=True, text=True, timeout=TRAIN_TIMEOUT_S)
    if proc.returncode != 0:
        pytest.fail(f"training the recall pair failed:\n{proc.stderr[-3000:]}")
    return out


@pytest.fixture(scope="session")
def recall_card(recall_pair: Path) -> dict:
    return json.loads((recall_pair / "card.json").read_text())


@pytest.fixture(scope="module")
def recall_servers(recall_pair: Path) -> Iterator[LazyServers]:
    common, draft = tiny_pair_args(recall_pair)
    common = common + TINY_MEMORY_ARGS
    dynamic = common + ["--speculative-algorithm", "EAGLE3_DYNAMIC", *draft, *FIXED_THRESHOLD_FLAGS]
    specs = {
        "recall_plain": common,
        "recall_eagle3": common + ["--speculative-algorithm", "EAGLE3", *draft],
        "recall_covering": dynamic,
        "recall_short": dynamic,
        "recall_separate_cache": dynamic,
        "recall_shared_cache": dynamic,
    }
    servers = LazyServers(specs, env=tiny_pair_server_env(), server_envs={
        "recall_covering": {DEFER_ENV: str(COVERING_WINDOW)},
        "recall_short": {DEFER_ENV: str(SHORT_WINDOW)},
        "recall_shared_cache": {SHORT_PREFILL_ENV: ShortPrefill.SHARED_CACHE.value},
    })
    try:
        servers.start(list(specs))
        yield servers
    finally:
        servers.stop_all()


def recall_load(eval_set: dict) -> Tuple[List[Dict], List[int], List[Dict]]:
    """Fillers (short requests that keep the batch above the thresholds while the targets are
    prefilled), then the recall targets ``<s> X X[:16]``: prompts, output lengths, targets."""
    prompts = eval_set["prompts"]
    # The first of the longest prompts: leave_plain sends the last eight, whose prefixes a
    # target would otherwise find in the radix cache with their own stale draft KV.
    longest = [p for p in prompts if len(p["input_ids"]) > RECALL_CHUNK]
    targets = []
    for prompt in longest[:RECALL_TARGETS]:
        span = prompt["input_ids"][1 : 1 + RECALL_CHUNK]
        targets.append({"input_ids": [prompt["input_ids"][0], *span, *span[:RECALL_CUE]]})
    fillers = prompts[:FILLERS]
    return (fillers + targets, [FILLER_TOKENS] * len(fillers) + [RECALL_TOKENS] * len(targets),
            targets)


@pytest.fixture(scope="module")
def recall_runs(recall_servers: LazyServers, recall_pair: Path) -> Dict[str, object]:
    eval_set = json.loads((recall_pair / "eval_prompts.json").read_text())
    load, lengths, targets = recall_load(eval_set)
    covering, covering_stats = deferred_run(recall_servers["recall_covering"], eval_set, load, lengths)
    _, short_stats = deferred_run(recall_servers["recall_short"], eval_set, load, lengths)
    plain = send(recall_servers["recall_plain"], load, lengths, len(load))
    eagle3 = eagle3_acceptance_of(recall_servers["recall_eagle3"], targets, RECALL_TOKENS)
    print(f"recall pair: window {COVERING_WINDOW} {covering_stats}, window {SHORT_WINDOW} "
          f"{short_stats}, EAGLE3 acceptance {eagle3:.3f}")
    target_tokens = sum(len(t["input_ids"]) - PREFIX_MATCH_SLACK for t in targets)
    return {"covering": covering, "plain": plain, "covering_stats": covering_stats,
            "short_stats": short_stats, "eagle3_acceptance": eagle3, "target_tokens": target_tokens}


def assert_the_targets_were_deferred(stats: Dict[str, float], target_tokens: int) -> None:
    """The fillers' prefills alone would pass a count of deferred batches; the targets' prompt
    tokens must be among the deferred ones."""
    assert stats["deferred_batches"] >= 1 and stats["catchup_tokens"] > 0
    assert stats["deferred_tokens"] >= target_tokens


def test_the_recall_pair_copies(recall_card: dict) -> None:
    copying = recall_card.get("copy_accuracy")
    if copying is None:
        pytest.fail(f"{RECALL_PAIR_ENV} names a pair trained without repeat_chunk: its card has no copy_accuracy")
    print(f"recall pair: copy accuracy {copying}, offline acceptance "
          f"{recall_card['offline_acceptance']['mean_accept_length']}")
    assert copying["second"] >= MIN_COPY_ACCURACY


@pytest.mark.uses_servers("recall_plain", "recall_eagle3", "recall_covering", "recall_short")
def test_a_covering_window_is_lossless_and_keeps_acceptance(recall_runs) -> None:
    differences = [i for i, (d, p) in enumerate(zip(recall_runs["covering"], recall_runs["plain"]))
                   if first_difference(d["output_ids"], p["output_ids"]) is not None]
    assert not differences
    stats = recall_runs["covering_stats"]
    assert_the_targets_were_deferred(stats, recall_runs["target_tokens"])
    assert stats["truncated"] == 0
    assert stats["acceptance"] >= (1 - MAX_ACCEPTANCE_LOSS) * recall_runs["eagle3_acceptance"]


@pytest.mark.uses_servers("recall_plain", "recall_eagle3", "recall_covering", "recall_short")
def test_a_short_window_control_loses_acceptance(recall_runs) -> None:
    """The negative control: X's stale draft KV must cost the copying draft more than the
    bar allows, and clearly less than the covering window gets."""
    covering, short = recall_runs["covering_stats"], recall_runs["short_stats"]
    assert recall_runs["eagle3_acceptance"] >= MIN_EAGLE3_RECALL_ACCEPTANCE, (
        "the draft does not copy from the prompt, so stale prompt draft KV cannot cost it")
    assert_the_targets_were_deferred(short, recall_runs["target_tokens"])
    assert short["acceptance"] < (1 - MAX_ACCEPTANCE_LOSS) * recall_runs["eagle3_acceptance"]
    assert covering["acceptance"] >= short["acceptance"] + MIN_CATCHUP_GAIN


def short_then_long(server, targets: List[Dict]) -> Tuple[List[dict], Dict[str, float]]:
    """Each recall prompt asked for two tokens, then each sent alone for the copy: the long
    requests' outputs, their acceptance, the short prefills that skipped the draft and the
    prompt tokens the long requests found cached."""
    before_short = server.dynamic_counters()
    for target in targets:
        server.generate(target["input_ids"], 2)
    before_long = server.dynamic_counters()
    outputs = [server.generate(target["input_ids"], RECALL_TOKENS) for target in targets]
    after = server.dynamic_counters()
    return outputs, {
        "acceptance": spec_acceptance(before_long, after),
        "short_prefills_without_draft": (
            before_long["deferred_draft_prefill_unstashed_batches"]
            - before_short.get("deferred_draft_prefill_unstashed_batches", 0)),
        "cached_tokens": sum(output["meta_info"]["cached_tokens"] for output in outputs),
        "short_prefill": after["short_prefill"],
    }


@pytest.fixture(scope="module")
def short_prefill_runs(recall_servers: LazyServers, recall_pair: Path) -> Dict[str, object]:
    eval_set = json.loads((recall_pair / "eval_prompts.json").read_text())
    _, _, targets = recall_load(eval_set)
    separate, separate_stats = short_then_long(recall_servers["recall_separate_cache"], targets)
    _, shared_stats = short_then_long(recall_servers["recall_shared_cache"], targets)
    plain = send(recall_servers["recall_plain"], targets, [RECALL_TOKENS] * len(targets),
                 len(targets))
    eagle3 = eagle3_acceptance_of(recall_servers["recall_eagle3"], targets, RECALL_TOKENS)
    prompt_tokens = sum(len(target["input_ids"]) for target in targets)
    print(f"short requests first: separate cache {separate_stats}, shared cache {shared_stats}, "
          f"EAGLE3 acceptance {eagle3:.3f}, prompt tokens {prompt_tokens}")
    return {"separate": separate, "plain": plain, "separate_stats": separate_stats,
            "shared_stats": shared_stats, "eagle3_acceptance": eagle3,
            "prompt_tokens": prompt_tokens}


SHORT_PREFILL_SERVERS = ("recall_plain", "recall_eagle3", "recall_separate_cache",
                         "recall_shared_cache")


@pytest.mark.uses_servers(*SHORT_PREFILL_SERVERS)
def test_short_requests_draft_free_prefixes_are_not_reused_by_long_ones(short_prefill_runs
                                                                         ) -> None:
    runs = short_prefill_runs
    stats = runs["separate_stats"]
    differences = [i for i, (d, p) in enumerate(zip(runs["separate"], runs["plain"]))
                   if first_difference(d["output_ids"], p["output_ids"]) is not None]
    assert not differences
    assert stats["short_prefill"] == ShortPrefill.SEPARATE_CACHE.value
    assert stats["short_prefills_without_draft"] >= RECALL_TARGETS
    assert stats["cached_tokens"] <= PREFIX_MATCH_SLACK * RECALL_TARGETS
    assert stats["acceptance"] >= (1 - MAX_ACCEPTANCE_LOSS) * runs["eagle3_acceptance"]


@pytest.mark.uses_servers(*SHORT_PREFILL_SERVERS)
def test_a_shared_cache_control_loses_acceptance(short_prefill_runs) -> None:
    """The negative control: long requests that reuse the short requests' prompts from one
    cache read their stale draft KV, which the copying draft pays for beyond the bar."""
    runs = short_prefill_runs
    shared, separate = runs["shared_stats"], runs["separate_stats"]
    assert runs["eagle3_acceptance"] >= MIN_EAGLE3_RECALL_ACCEPTANCE
    assert shared["short_prefills_without_draft"] >= RECALL_TARGETS
    assert shared["cached_tokens"] >= runs["prompt_tokens"] - PREFIX_MATCH_SLACK * RECALL_TARGETS
    assert shared["acceptance"] < (1 - MAX_ACCEPTANCE_LOSS) * runs["eagle3_acceptance"]
    assert separate["acceptance"] >= shared["acceptance"] + MIN_CATCHUP_GAIN
