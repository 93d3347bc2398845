"""The tiny trained pair in models/tiny-pair, served by sglang: EAGLE-3 is lossless and accepts.

A plain server and an EAGLE3 server (3 steps, topk 1, 4 draft tokens) run the trained target;
the held-out prompts of eval_prompts.json go in as token ids, greedy, 64 new tokens each.
Checks: EAGLE3's outputs equal the plain outputs token for token (one request at a time and
all at once), the mean acceptance length (tokens per verify step, bonus included, the first
token from prefill excluded) is at least 2.0, and the plain server reproduces the greedy
outputs that transformers computed at training time (up to numerical ties).

TINY_PAIR_DTYPE (default float32) is the served dtype. In float32 no difference is allowed;
in bfloat16 (the fallback if float32 cannot be served) a difference counts as a numerical tie
only if the plain server's top-2 logprob margin at the first differing token is below 1e-3.
Both servers run with TRITON_F32_DEFAULT=ieee (exact float32 in Triton's attention kernels).
sglang 0.5.17 cannot serve float32 with its CUDA kernels (sgl_kernel's rmsnorm has no float32
path), so float32 servers run its custom ops in pure torch through the test-only plugin in
test/gpu/native_ops_plugin; plain and speculative servers alike.
TINY_PAIR_REPORT, if set, is a file to write the summary table to (it is also printed).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpu_servers import TINY_PAIR
from gpu_servers import TINY_PAIR_DTYPE as DTYPE
from token_comparison import TIE_MARGIN, first_difference, top2_margin

pytestmark = [pytest.mark.gpu, pytest.mark.uses_servers("tiny_plain", "tiny_eagle3")]

MIN_ACCEPT_LENGTH = 2.0


@dataclass
class Difference:
    prompt: int
    position: int
    margin: float


@dataclass
class Comparison:
    differences: list[Difference]

    def failures(self, allow_ties: bool) -> list[Difference]:
        return [d for d in self.differences if not (allow_ties and d.margin < TIE_MARGIN)]

    def describe(self) -> str:
        return ", ".join(f"prompt {d.prompt} token {d.position} margin {d.margin:.2e}"
                         for d in self.differences) or "-"


@dataclass
class Results:
    prompts: int
    max_new_tokens: int
    sequential: Comparison
    batched: Comparison
    transformers: Comparison
    accept_length: float
    sglang_accept_length: float
    server_accept_length: float | None
    offline_accept_length: float | None
    seconds: dict[str, float]


def compare(outputs: list[list[int]], plain: list[dict]) -> Comparison:
    differences = []
    for index, (ids, reference) in enumerate(zip(outputs, plain)):
        position = first_difference(ids, reference["output_ids"])
        if position is not None:
            differences.append(Difference(index, position, top2_margin(reference, position)))
    return Comparison(differences)


def timed(label: str, seconds: dict[str, float], fn, *args, **kwargs):
    start = time.monotonic()
    result = fn(*args, **kwargs)
    seconds[label] = round(time.monotonic() - start, 1)
    return result


def send(server, prompts: list[dict], max_new_tokens: int, concurrency: int,
         **kwargs) -> list[dict]:
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(
            lambda p: server.generate(p["input_ids"], max_new_tokens, **kwargs), prompts))


def accept_lengths(outputs: list[dict]) -> tuple[float, float]:
    """(tokens per verify step without the prefill token, sglang's completion/verify)."""
    verifies = sum(o["meta_info"]["spec_verify_ct"] for o in outputs)
    completion = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    return (completion - len(outputs)) / verifies, completion / verifies


def summary_table(r: Results) -> str:
    rows = [
        ("mean acceptance length (verify tokens / verify steps)", f"{r.accept_length:.3f}"),
        ("sglang spec_accept_length (completion / verify steps)", f"{r.sglang_accept_length:.3f}"),
        ("server avg_spec_accept_length", f"{r.server_accept_length}"),
        ("offline acceptance (card.json, same definition)", f"{r.offline_accept_length}"),
        ("EAGLE3 one at a time vs plain: differing prompts", str(len(r.sequential.differences))),
        ("EAGLE3 all at once vs plain: differing prompts", str(len(r.batched.differences))),
        ("plain vs transformers fp32 (training time): differing",
         str(len(r.transformers.differences))),
        ("seconds: plain / EAGLE3 one at a time / EAGLE3 all at once",
         f"{r.seconds['plain']} / {r.seconds['eagle3']} / {r.seconds['eagle3_batched']}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"tiny-pair on sglang, dtype {DTYPE}, EAGLE3 steps 3 topk 1 draft tokens 4, "
             f"{r.prompts} prompts x {r.max_new_tokens} new tokens (greedy)"]
    lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"  differences one at a time: {r.sequential.describe()}",
              f"  differences all at once:   {r.batched.describe()}",
              f"  differences vs transformers: {r.transformers.describe()}"]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def results(tiny_servers, eval_set) -> Results:
    servers = tiny_servers
    prompts, max_new = eval_set["prompts"], eval_set["max_new_tokens"]
    seconds: dict[str, float] = {}
    plain = timed("plain", seconds, send, servers["tiny_plain"], prompts, max_new, 1,
                  top_logprobs_num=2)
    eagle = timed("eagle3", seconds, send, servers["tiny_eagle3"], prompts, max_new, 1)
    server_accept = servers["tiny_eagle3"].internal_state().get("avg_spec_accept_length")
    batched = timed("eagle3_batched", seconds, send, servers["tiny_eagle3"], prompts, max_new,
                    len(prompts))
    card = json.loads((TINY_PAIR / "card.json").read_text())
    accept, sglang_accept = accept_lengths(eagle)
    result = Results(
        prompts=len(prompts), max_new_tokens=max_new,
        sequential=compare([o["output_ids"] for o in eagle], plain),
        batched=compare([o["output_ids"] for o in batched], plain),
        transformers=compare([p["hf_greedy_output_ids"] for p in prompts], plain),
        accept_length=accept, sglang_accept_length=sglang_accept,
        server_accept_length=server_accept,
        offline_accept_length=card["offline_acceptance"]["mean_accept_length"],
        seconds=seconds,
    )
    table = summary_table(result)
    print("\n" + table)
    if os.environ.get("TINY_PAIR_REPORT"):
        Path(os.environ["TINY_PAIR_REPORT"]).write_text(table + "\n")
    return result


def test_eagle3_one_at_a_time_equals_plain(results: Results) -> None:
    assert not results.sequential.failures(allow_ties=DTYPE != "float32"), \
        results.sequential.describe()


def test_eagle3_all_at_once_equals_plain(results: Results) -> None:
    assert not results.batched.failures(allow_ties=DTYPE != "float32"), \
        results.batched.describe()


def test_acceptance_length(results: Results) -> None:
    assert results.accept_length >= MIN_ACCEPT_LENGTH


def test_plain_server_reproduces_training_time_outputs(results: Results) -> None:
    if DTYPE != "float32":
        pytest.skip("the training-time outputs were computed in float32")
    assert not results.transformers.failures(allow_ties=True), results.transformers.describe()
