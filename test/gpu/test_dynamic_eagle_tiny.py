"""EAGLE3_DYNAMIC with the tiny trained pair (float32, real acceptance).

* lossless: the held-out prompts, sent in waves so that the running batch
  crosses both thresholds many times, give exactly the plain server's tokens
  (and EAGLE3's), and every plain step replays a plain CUDA graph;
* catch-up: requests that decode plainly while short filler requests keep the
  batch large, then speculatively once the fillers finish, reach an
  acceptance within 10% of always-on EAGLE3 on the same prompts, and clearly above a
  server whose catch-up window is one position (the negative control);
* both of the above with chain drafting and with sglang's EAGLE3 tree for Llama
  (5 steps, topk 4, 8 draft tokens);
* capacity: 128 concurrent requests run more than 48 at once (EAGLE's cap);
* logprobs: requests asking for them get one per output token in either mode,
  equal to the plain server's;
* automatic policy (the default): bursts of 16 and lone requests give exactly the plain
  server's tokens, and the server reports what it measured and decided;
* structured output: regex and JSON-schema requests sent in waves that switch modes give
  exactly the plain server's tokens, and those that stopped match their constraint;
* early first token: with the draft's prefill on its side stream slowed down, tokens and
  verify counts are unchanged; without the barrier's wait (negative control) they are not.
"""

from __future__ import annotations

import json
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Sequence, Tuple

import pytest

from gpu_servers import TINY_DYNAMIC_TRITON_CACHE
from token_comparison import TOP_LOGPROBS, compare_outputs, first_difference

pytestmark = pytest.mark.gpu

WAVE_SIZE = 4
CATCHUP_TARGETS = 2  # at most the enable threshold of the tiny dynamic server
CATCHUP_FILLERS = 12
# The targets decode about CATCHUP_FILLER_TOKENS positions plainly before speculation resumes.
CATCHUP_TARGET_TOKENS = 112
CATCHUP_FILLER_TOKENS = 64
MAX_ACCEPTANCE_LOSS = 0.10
# Tokens per verify that a full catch-up must gain over a window of 1 (an independent run with
# a shorter plain stretch measured 3.12 against 2.70).
MIN_CATCHUP_GAIN = 0.15
CAPACITY_REQUESTS = 128
CAPACITY_OUTPUT_TOKENS = 400  # prompts are at most 100 tokens; the model has 2048 positions
LOGPROB_WAVE = 8
# float32 on both servers; a misplaced or wrong-token logprob of this trained model is off by
# far more.
LOGPROB_TOLERANCE = 1e-2
GRAMMAR_REGEX = r"(def|class) [a-z_]{1,12}\((x|y|z)?\):"
GRAMMAR_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "size": {"type": "integer", "minimum": 0, "maximum": 999},
    },
    "required": ["name", "size"],
    "additionalProperties": False,
}
GRAMMAR_PROMPTS = 32
GRAMMAR_MAX_TOKENS = 64
# (EAGLE3 server, EAGLE3_DYNAMIC server) of each draft shape, in the tiny_servers fixture.
DRAFT_SHAPES = {
    "chain": ("tiny_eagle3", "tiny_dynamic"),
    "tree": ("tiny_eagle3_tree", "tiny_dynamic_tree"),
}


def shape_params() -> List:
    """The draft shapes, each marked with the servers its tests use."""
    return [pytest.param(shape, marks=pytest.mark.uses_servers("tiny_plain", *names))
            for shape, names in DRAFT_SHAPES.items()]


def send(
    server, prompts: Sequence[Dict], max_new_tokens: Sequence[int], concurrency: int, **kwargs
) -> List[dict]:
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(
            pool.map(
                lambda p, n: server.generate(p["input_ids"], n, **kwargs), prompts, max_new_tokens
            )
        )


def send_in_waves(server, prompts: Sequence[Dict], max_new_tokens: Sequence[int]) -> List[dict]:
    outputs: List[dict] = []
    for start in range(0, len(prompts), WAVE_SIZE):
        end = start + WAVE_SIZE
        outputs += send(server, prompts[start:end], max_new_tokens[start:end], WAVE_SIZE)
    return outputs


def mixed_lengths(count: int, seed: int) -> List[int]:
    rng = random.Random(seed)
    return [rng.choice([12, 24, 48, 64]) for _ in range(count)]


def spec_acceptance(before: Dict, after: Dict) -> float:
    """Tokens per request per speculative step between two counter snapshots."""
    accepted = after["speculative_accepted_tokens"] - before.get("speculative_accepted_tokens", 0)
    verified = after["speculative_verified_requests"] - before.get(
        "speculative_verified_requests", 0
    )
    return accepted / verified if verified else 0.0


@pytest.mark.parametrize("shape", shape_params())
def test_lossless_across_switches(tiny_servers, eval_set, shape):
    eagle3_name, dynamic_name = DRAFT_SHAPES[shape]
    prompts = eval_set["prompts"]
    lengths = mixed_lengths(len(prompts), seed=3)
    dynamic_server = tiny_servers[dynamic_name]
    before = dynamic_server.dynamic_counters()
    dynamic = send_in_waves(dynamic_server, prompts, lengths)
    after = dynamic_server.dynamic_counters()
    plain = send_in_waves(tiny_servers["tiny_plain"], prompts, lengths)
    eagle3 = send_in_waves(tiny_servers[eagle3_name], prompts, lengths)

    differences = [
        (i, first_difference(d["output_ids"], p["output_ids"]))
        for i, (d, p) in enumerate(zip(dynamic, plain))
        if first_difference(d["output_ids"], p["output_ids"]) is not None
    ]
    eagle3_differences = sum(
        first_difference(d["output_ids"], e["output_ids"]) is not None
        for d, e in zip(dynamic, eagle3)
    )
    switches = (after["switches_to_plain"] - before.get("switches_to_plain", 0)) + (
        after["switches_to_speculative"] - before.get("switches_to_speculative", 0)
    )
    print(
        f"tiny lossless ({shape}): {len(prompts)} prompts, {switches} switches, "
        f"differences vs plain {differences}, vs EAGLE3 {eagle3_differences}, "
        f"counters {after}"
    )
    plain_steps = after["plain_steps"] - before.get("plain_steps", 0)
    plain_graph_steps = after["plain_graph_steps"] - before.get("plain_graph_steps", 0)
    assert len(prompts) >= 64
    assert switches >= 20
    assert not differences
    assert eagle3_differences == 0
    # Waves of 4 stay inside the tiny server's plain graphs (batch sizes up to 32).
    assert plain_steps > 0 and plain_graph_steps == plain_steps


def catchup_load(eval_set) -> Tuple[List[Dict], List[int]]:
    """Targets that decode plainly while the fillers keep the batch large, then speculatively."""
    prompts = eval_set["prompts"]
    load = prompts[: CATCHUP_TARGETS + CATCHUP_FILLERS]
    lengths = [CATCHUP_TARGET_TOKENS] * CATCHUP_TARGETS + [CATCHUP_FILLER_TOKENS] * CATCHUP_FILLERS
    return load, lengths


def acceptance_after_plain_stretch(server, eval_set) -> Dict[str, float]:
    """Acceptance of the speculative steps of the catch-up load, with what catch-up did."""
    load, lengths = catchup_load(eval_set)
    before = server.dynamic_counters()
    send(server, load, lengths, len(load))
    after = server.dynamic_counters()
    return {
        "acceptance": spec_acceptance(before, after),
        "catchup_tokens": after["catchup_tokens"] - before.get("catchup_tokens", 0),
        "truncated": after["catchup_truncated_tokens"] - before.get("catchup_truncated_tokens", 0),
        "catchup_gpu_ms": after["catchup_gpu_ms"],
    }


def verified_acceptance(outputs: Sequence[dict]) -> float:
    """Tokens per verify of these requests (the first token comes from the prefill)."""
    return sum(o["meta_info"]["completion_tokens"] - 1 for o in outputs) / sum(
        o["meta_info"]["spec_verify_ct"] for o in outputs
    )


def eagle3_acceptance_of(server, targets: Sequence[Dict], max_new_tokens: int) -> float:
    """Tokens per verify of the targets sent together to an EAGLE3 server."""
    return verified_acceptance(
        send(server, targets, [max_new_tokens] * len(targets), len(targets)))


@pytest.mark.parametrize("shape", shape_params())
def test_acceptance_recovers_after_plain_stretch(tiny_servers, eval_set, shape):
    eagle3_name, dynamic_name = DRAFT_SHAPES[shape]
    eagle3_acceptance = eagle3_acceptance_of(tiny_servers[eagle3_name],
                                             eval_set["prompts"][:CATCHUP_TARGETS],
                                             CATCHUP_TARGET_TOKENS)
    resumed = acceptance_after_plain_stretch(tiny_servers[dynamic_name], eval_set)
    print(f"catch-up ({shape}): EAGLE3 acceptance {eagle3_acceptance:.3f}, after a plain "
          f"stretch {resumed}")
    assert resumed["catchup_tokens"] > 0
    assert resumed["acceptance"] >= (1 - MAX_ACCEPTANCE_LOSS) * eagle3_acceptance


@pytest.mark.uses_servers("tiny_dynamic", "tiny_dynamic_window1")
def test_catch_up_beats_a_window_of_one_control(tiny_servers, eval_set):
    """The negative control of the test above, in the same run: with a catch-up window of one
    position, the plainly decoded positions keep stale draft KV and acceptance must be clearly
    lower than with the full catch-up."""
    full = acceptance_after_plain_stretch(tiny_servers["tiny_dynamic"], eval_set)
    window1 = acceptance_after_plain_stretch(tiny_servers["tiny_dynamic_window1"], eval_set)
    print(f"catch-up control: full window {full}, window of 1 {window1}")
    assert full["truncated"] == 0 and window1["truncated"] > 0
    assert full["acceptance"] >= window1["acceptance"] + MIN_CATCHUP_GAIN


@pytest.mark.uses_servers("tiny_dynamic")
def test_runs_more_than_48_requests_at_once(tiny_servers, eval_set):
    prompts = (eval_set["prompts"] * 2)[:CAPACITY_REQUESTS]
    dynamic_server = tiny_servers["tiny_dynamic"]
    # Long outputs keep the first requests running while the last ones arrive.
    send(dynamic_server, prompts, [CAPACITY_OUTPUT_TOKENS] * len(prompts), len(prompts))
    counters = dynamic_server.dynamic_counters()
    print(f"capacity: max plain batch {counters['max_plain_batch']}")
    assert counters["max_plain_batch"] > 48


@pytest.mark.uses_servers("tiny_dynamic")
def test_request_slot_kernel_compiled_at_start_up(tiny_servers, eval_set):
    """engine/jit_warmup: the start-up compiled every variant of sglang's request-slot kernel
    (2 per power of two up to the running-request cap) and said so, and traffic at batch sizes
    across that range compiles none: the server's own triton cache holds exactly the variants the
    start-up logged (a variant the warm-up missed would add an entry while serving)."""
    server = tiny_servers["tiny_dynamic"]
    prompts = (eval_set["prompts"] * 4)[:65]
    for concurrency in (1, 3, 6, 12, 24, 48, 65):  # a power of two's worth of batch sizes each
        send(server, prompts[:concurrency], [40] * concurrency, concurrency)
    log = server.log_path.read_text(errors="replace")
    found = re.search(r"pre-compiled (\d+) variants of sglang's request-slot kernel", log)
    entries = list(TINY_DYNAMIC_TRITON_CACHE.rglob("assign_req_to_token_pool.json"))
    print(f"request-slot kernel: {found.group(0) if found else 'no warm-up line'}; "
          f"{len(entries)} cache entries after traffic")
    assert "could not pre-compile" not in log
    assert found and int(found.group(1)) >= 2 * 7 and int(found.group(1)) % 2 == 0  # cap >= 33
    assert len(entries) == int(found.group(1))


@pytest.mark.uses_servers("tiny_dynamic", "tiny_plain")
def test_logprob_requests_in_both_modes(tiny_servers, eval_set):
    prompts = eval_set["prompts"][:LOGPROB_WAVE]
    lengths = [32] * len(prompts)
    dynamic_server = tiny_servers["tiny_dynamic"]
    before = dynamic_server.dynamic_counters()
    # A wave of 8 runs mostly in plain mode (threshold 2); one request alone speculates.
    wave = send(dynamic_server, prompts, lengths, len(prompts), top_logprobs_num=2)
    alone = send(dynamic_server, prompts[:1], lengths[:1], 1, top_logprobs_num=2)
    after = dynamic_server.dynamic_counters()
    plain = send(tiny_servers["tiny_plain"], prompts, lengths, len(prompts), top_logprobs_num=2)

    assert after["plain_steps"] > before.get("plain_steps", 0)
    assert after["speculative_steps"] > before.get("speculative_steps", 0)
    worst = 0.0
    for output, reference in zip(wave + alone, plain + plain[:1]):
        meta, reference_meta = output["meta_info"], reference["meta_info"]
        assert output["output_ids"] == reference["output_ids"]
        assert len(meta["output_token_logprobs"]) == len(output["output_ids"])
        assert all(len(top) == 2 for top in meta["output_top_logprobs"])
        for (logprob, token, _), (reference_logprob, reference_token, _) in zip(
            meta["output_token_logprobs"], reference_meta["output_token_logprobs"]
        ):
            assert token == reference_token
            worst = max(worst, abs(logprob - reference_logprob))
    print(f"logprobs: largest difference from the plain server {worst:.2e}")
    assert worst < LOGPROB_TOLERANCE


@pytest.mark.uses_servers("tiny_dynamic_auto", "tiny_plain")
def test_automatic_policy_is_lossless_and_reports_its_decisions(tiny_servers, eval_set):
    prompts = eval_set["prompts"]
    lengths = mixed_lengths(len(prompts), seed=5)
    auto = tiny_servers["tiny_dynamic_auto"]
    burst, rest = slice(0, 16), slice(16, None)
    outputs = send(auto, prompts[burst], lengths[burst], 16) + send_in_waves(
        auto, prompts[rest], lengths[rest]
    )
    report = auto.dynamic_counters()
    plain_server = tiny_servers["tiny_plain"]
    plain = send(plain_server, prompts[burst], lengths[burst], 16) + send_in_waves(
        plain_server, prompts[rest], lengths[rest]
    )
    differences = [
        i for i, (o, p) in enumerate(zip(outputs, plain))
        if first_difference(o["output_ids"], p["output_ids"]) is not None
    ]
    print(
        f"tiny automatic policy: differences {differences}, policy {report['policy']}, "
        f"acceptance {report['acceptance_estimate']}, crossover {report['crossover_batch']}, "
        f"probes {report['probes']}, speculative steps {report['speculative_steps']}, plain "
        f"steps {report['plain_steps']}, switches {report['switches_to_plain']}/"
        f"{report['switches_to_speculative']}, plain cost {report['plain_cost']}, "
        f"speculative cost {report['speculative_cost']}"
    )
    assert report["policy"] == "throughput"
    assert not differences
    assert report["speculative_steps"] > 0
    assert report["acceptance_estimate"] > 1.5  # the trained draft accepts about 2.4 tokens
    assert report["plain_cost"]["step_ms"] and report["speculative_cost"]["step_ms"]
    assert report["recent_decisions"]


def grammar_payload(prompt: Dict, index: int) -> dict:
    constraint = (
        {"regex": GRAMMAR_REGEX} if index % 2 == 0 else {"json_schema": json.dumps(GRAMMAR_SCHEMA)}
    )
    return {
        "input_ids": prompt["input_ids"],
        "sampling_params": {"temperature": 0.0, "max_new_tokens": GRAMMAR_MAX_TOKENS,
                            **constraint},
    }


def send_payloads_in_waves(server, payloads: Sequence[dict]) -> List[dict]:
    outputs: List[dict] = []
    with ThreadPoolExecutor(max_workers=WAVE_SIZE) as pool:
        for start in range(0, len(payloads), WAVE_SIZE):
            wave = payloads[start : start + WAVE_SIZE]
            outputs += list(pool.map(lambda payload: server.post("/generate", payload), wave))
    return outputs


def satisfies_constraint(output: dict, index: int) -> bool:
    text = output["text"]
    if index % 2 == 0:
        return re.fullmatch(GRAMMAR_REGEX, text) is not None
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return (isinstance(value, dict) and set(value) == {"name", "size"}
            and isinstance(value["size"], int) and len(value["name"]) <= 10)


@pytest.mark.uses_servers("tiny_dynamic", "tiny_plain")
def test_structured_output_is_lossless_across_switches(tiny_servers, eval_set):
    payloads = [grammar_payload(prompt, index)
                for index, prompt in enumerate(eval_set["prompts"][:GRAMMAR_PROMPTS])]
    dynamic_server = tiny_servers["tiny_dynamic"]
    before = dynamic_server.dynamic_counters()
    dynamic = send_payloads_in_waves(dynamic_server, payloads)
    after = dynamic_server.dynamic_counters()
    plain = send_payloads_in_waves(tiny_servers["tiny_plain"], payloads)

    differences = [index for index, (d, p) in enumerate(zip(dynamic, plain))
                   if d["output_ids"] != p["output_ids"]]
    stopped = [index for index, output in enumerate(dynamic)
               if output["meta_info"]["finish_reason"]["type"] == "stop"]
    violations = [index for index in stopped if not satisfies_constraint(dynamic[index], index)]
    switches = {key: after[key] - before.get(key, 0)
                for key in ("switches_to_plain", "switches_to_speculative")}
    print(f"structured output: {len(payloads)} requests, {len(stopped)} stopped, differences "
          f"{differences}, constraint violations {violations}, switches {switches}")
    assert min(switches.values()) >= 4
    assert not differences
    assert stopped and not violations


RETRACTION_LINE = re.compile(r"Testing retraction\. #retracted_reqs: (\d+)")


def retracted_requests(server) -> int:
    """Requests sglang's scheduler retracted on purpose so far (its log lines)."""
    return sum(int(n) for n in RETRACTION_LINE.findall(server.log_path.read_text(errors="replace")))


@pytest.mark.uses_servers("tiny_dynamic_retract", "tiny_plain")
def test_requests_retracted_in_either_mode_stay_lossless(tiny_servers, eval_set):
    """sglang retracts decoding requests when the KV pool runs out (a busy server with long
    outputs) and prefills them again later with what they had generated. With
    SGLANG_TEST_RETRACT its scheduler retracts one request every third forward whatever the pool
    holds: in plain stretches, at switches and while speculating. The outputs must equal plain
    decoding's (float32: a difference only where plain's top-2 margin is below 1e-3). The
    comparison's own negative control is the configuration suite's (a plain step writing its K/V
    one slot early fails it)."""
    prompts = eval_set["prompts"]
    lengths = mixed_lengths(len(prompts), seed=5)
    server, plain = tiny_servers["tiny_dynamic_retract"], tiny_servers["tiny_plain"]
    retracted_before, before = retracted_requests(server), server.dynamic_counters()
    server.flush_cache()
    outputs = send_in_waves(server, prompts, lengths)
    retracted, after = retracted_requests(server) - retracted_before, server.dynamic_counters()
    plain.flush_cache()
    expected = [output for start in range(0, len(prompts), WAVE_SIZE)
                for output in send(plain, prompts[start:start + WAVE_SIZE], lengths[start:start + WAVE_SIZE],
                                   WAVE_SIZE, top_logprobs_num=TOP_LOGPROBS)]
    comparison = compare_outputs(outputs, expected, None)
    switches = [after[key] - before.get(key, 0) for key in ("switches_to_plain", "switches_to_speculative")]
    print(f"tiny retraction: {len(prompts)} prompts, {retracted} requests retracted, switches {switches}, "
          f"against plain: {comparison.summary()}")
    assert retracted >= 20
    assert min(switches) >= 5
    assert not comparison.failures


def one_at_a_time(server, prompts: Sequence[Dict], max_new: int) -> Tuple[List, List]:
    outputs = send(server, prompts, [max_new] * len(prompts), 1)
    return ([o["output_ids"] for o in outputs],
            [o["meta_info"]["spec_verify_ct"] for o in outputs])


@pytest.mark.uses_servers("tiny_plain", "tiny_dynamic_late_first_token", "tiny_dynamic_slow_side",
                          "tiny_dynamic_slow_side_no_barrier")
def test_first_token_before_the_draft_prefill_changes_no_token_and_no_draft(tiny_servers, eval_set):
    """The draft's prefill on its side stream (``engine.early_first_token``), slowed by a GPU
    spin of about 30 ms so that a step that did not wait for it would read its output early:
    one request at a time, every request's tokens equal plain decoding's and it verifies as
    often as on a server that keeps sglang's order (its drafts are the same). The negative
    control, the same spin without the barrier's wait, must differ in one or the other, or fail
    (its next step reads stale request slots: on an H100, 2026-12-06, a device-side assert)."""
    prompts, max_new = eval_set["prompts"], eval_set["max_new_tokens"]
    plain = [o["output_ids"] for o in send(tiny_servers["tiny_plain"], prompts,
                                           [max_new] * len(prompts), 1)]
    late_tokens, late_verifies = one_at_a_time(tiny_servers["tiny_dynamic_late_first_token"],
                                               prompts, max_new)
    tokens, verifies = one_at_a_time(tiny_servers["tiny_dynamic_slow_side"], prompts, max_new)
    reports = {name: tiny_servers[name].dynamic_counters()
               for name in ("tiny_dynamic_late_first_token", "tiny_dynamic_slow_side")}
    differing = (sum(t != p for t, p in zip(tokens, plain)),
                 sum(v != w for v, w in zip(verifies, late_verifies)))
    try:
        control_tokens, control_verifies = one_at_a_time(
            tiny_servers["tiny_dynamic_slow_side_no_barrier"], prompts, max_new)
        control = (sum(t != p for t, p in zip(control_tokens, plain)),
                   sum(v != w for v, w in zip(control_verifies, late_verifies)))
    except Exception as error:  # the control's server failed (its requests were answered wrongly)
        control = repr(error)[:120]
    print(f"early first token, {len(prompts)} requests one at a time: sglang's order differs from "
          f"plain in {sum(t != p for t, p in zip(late_tokens, plain))}; the slow side stream "
          f"(tokens differing from plain, verify counts from sglang's order) {differing}; "
          f"without the barrier's wait {control}; verifies {sum(verifies)} / {sum(late_verifies)}")
    assert late_tokens == plain
    assert reports["tiny_dynamic_late_first_token"]["early_first_token"] is False
    assert reports["tiny_dynamic_slow_side"]["early_first_token"] is True
    assert differing == (0, 0)
    assert control != (0, 0), "negative control"


SPLIT_KV_CONCURRENCY = 16


@pytest.mark.uses_servers("tiny_plain", "tiny_dynamic", "tiny_dynamic_always", "tiny_dynamic_prefill_verify")
def test_a_verify_through_the_split_kv_kernel_changes_no_token(tiny_servers, eval_set):
    """sglang's split-KV verify kernel, which a chain on triton takes by default
    (``sglang_compat.triton_verify``; the tiny pair runs triton in float32): one at a time, and 16
    at a time on a server that speculates at every batch (verifies of up to 16 requests of
    different lengths, where each request's splits are clamped to its own prefix), its tokens
    equal plain decoding's but for ties; one at a time it verifies as often as a server on
    sglang's prefill kernel (``SGLANG_DYNAMIC_EAGLE_SPLITKV_VERIFY=0``), within 2% (the two kernels
    round differently). The reports must say the chains' target backends took the split kernel
    and the other's did not."""
    prompts, max_new = eval_set["prompts"], eval_set["max_new_tokens"]
    plain, splitkv = tiny_servers["tiny_plain"], tiny_servers["tiny_dynamic"]
    always, prefill_kernel = tiny_servers["tiny_dynamic_always"], tiny_servers["tiny_dynamic_prefill_verify"]
    lengths = [max_new] * len(prompts)
    expected = send(plain, prompts, lengths, 1, top_logprobs_num=TOP_LOGPROBS)
    alone_outputs = send(splitkv, prompts, lengths, 1)
    alone = compare_outputs(alone_outputs, expected, None)
    together = compare_outputs(send(always, prompts, lengths, SPLIT_KV_CONCURRENCY), expected, None)
    verifies = sum(o["meta_info"]["spec_verify_ct"] for o in alone_outputs)
    reference = sum(o["meta_info"]["spec_verify_ct"] for o in send(prefill_kernel, prompts, lengths, 1))
    counters = always.dynamic_counters()
    reported = tuple(server.dynamic_counters()["splitkv_verify"] for server in (splitkv, always, prefill_kernel))
    print(f"split-KV verify, {len(prompts)} requests against plain: one at a time {alone.summary()}; "
          f"{SPLIT_KV_CONCURRENCY} at a time {together.summary()} (largest speculative batch "
          f"{counters['max_speculative_batch']}); verifies {verifies} against {reference} on the "
          f"prefill kernel; the target's backend on the split kernel (the default server, the "
          f"always-speculating one, SPLITKV_VERIFY=0) {reported}")
    assert reported == (True, True, False)
    assert counters["max_speculative_batch"] > 2
    assert not alone.failures and not together.failures
    assert abs(verifies - reference) <= 0.02 * reference
