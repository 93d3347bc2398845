#!/usr/bin/env python3
"""What a follow-up turn loses when its cached history holds draft KV the draft never wrote.

EAGLE3_DYNAMIC decodes plainly while speculation does not pay; a request that finishes in plain
mode leaves its answer in sglang's prefix cache with the target's KV but without the draft's (the
draft-KV catch-up runs only when a running request speculates again). A later turn whose prompt
repeats that history reuses the cached prefix, so its draft attends to whatever those draft KV
slots held. Lossless either way (the target verifies every token); the question is acceptance.

On the committed tiny trained pair (models/tiny-pair, CPU, float32), per follow-up: turn 1 is a
held-out prompt and the target's greedy answer; turn 2 is that history plus another held-out
prompt's tokens, decoded with chain drafting, its draft KV over turn 1's answer

* fresh: as the draft wrote it (EAGLE3, or a cache that was flushed),
* zeros: never written (a fresh KV pool),
* another request's: the draft KV of an unrelated sequence at the same positions (a reused slot),
* and, as the control that shows the draft reads its KV at all, every context row zeroed.

    python3 tools/stale_draft_kv.py [--follow-ups 48] [--answer-tokens 64] [--new-tokens 48]

With ``--prompt-window``, a new request whose prefill wrote the draft's KV over only the newest
rows of its prompt (a draft prefill cut to a window), the older rows zeros or another request's,
then decoding speculatively from its first token.

    python3 tools/stale_draft_kv.py --prompt-window --follow-ups 64

With ``--running PLAIN_TOKENS``, the same for a running request whose last PLAIN_TOKENS were
decoded plainly when it speculates again: its draft KV over them rebuilt whole (the catch-up),
only the newest few (a smaller window, or a catch-up's per-request share), or not at all.

    python3 tools/stale_draft_kv.py --running 96 --follow-ups 16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))

from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from tiny_pair_training.draft import Eagle3Draft  # noqa: E402
from tiny_pair_training.evaluation import reference_chain_decode  # noqa: E402
from tiny_pair_training.scale import FULL  # noqa: E402
from tiny_pair_training.target import greedy_generate, target_features  # noqa: E402

PAIR = ROOT / "models" / "tiny-pair"
CPU = torch.device("cpu")


def load_pair(pair: Path = PAIR):
    target = AutoModelForCausalLM.from_pretrained(pair / "target", dtype=torch.float32).eval()
    draft = Eagle3Draft(FULL)
    draft.load_state_dict({name: tensor.float() if tensor.is_floating_point() else tensor
                           for name, tensor in load_file(pair / "draft" / "model.safetensors").items()})
    return target, draft.eval()


@torch.no_grad()
def greedy(target, tokens: list[int], count: int) -> list[int]:
    """``tokens`` and the target's greedy continuation of ``count`` tokens."""
    return greedy_generate(target, torch.tensor([tokens]), count)[0].tolist()


@torch.no_grad()
def context_kv(target, draft, seq: list[int]):
    """The draft's keys and values of every context row of ``seq`` (row j: token j+1)."""
    aux, _ = target_features(target, torch.tensor([seq[:-1]]))
    rows = target.model.embed_tokens(torch.tensor([seq[1:]]))
    _, k, v, _ = draft.project(rows, draft.fc(aux), torch.arange(len(seq) - 1))
    return k, v


def replacing(rows: list[int], source=None):
    """An edit of the context KV: ``rows`` set to zeros, or to ``source``'s (k, v) there."""
    def edit(k, v):
        k, v = k.clone(), v.clone()
        if source is None:
            k[:, :, rows], v[:, :, rows] = 0.0, 0.0
        else:
            k[:, :, rows], v[:, :, rows] = source[0][:, :, rows], source[1][:, :, rows]
        return k, v
    return edit


def tokens_per_verify(accepted: list[list[int]]) -> float:
    return sum(a + 1 for run in accepted for a in run) / sum(len(run) for run in accepted)


def measure(follow_ups: int, answer_tokens: int, new_tokens: int, steps: int = 3) -> dict[str, float]:
    target, draft = load_pair()
    prompts = json.loads((PAIR / "eval_prompts.json").read_text())["prompts"]
    runs: dict[str, list[list[int]]] = {"fresh": [], "zeros": [], "another request's": [],
                                        "control: every context row zeroed": []}
    for i in range(follow_ups):
        first = prompts[i % len(prompts)]["input_ids"]
        history = greedy(target, first, answer_tokens)
        turn2 = history + prompts[(i + 17) % len(prompts)]["input_ids"][1:]
        # Draft row j reads token j + 1 with the target's features of position j. The prefill's
        # draft extend wrote rows up to len(first) - 1 (whose token is the answer's first, sampled
        # by the prefill); plain steps fed the answer's other tokens and wrote none of rows
        # len(first) .. len(first) + answer_tokens - 2, which the prefix cache keeps (the last
        # answer token was never fed, so the next turn's prefill starts there).
        stale = list(range(len(first), len(first) + answer_tokens - 1))
        unrelated = prompts[(i + 33) % len(prompts)]["input_ids"]
        other = context_kv(target, draft, greedy(target, unrelated, len(turn2) - len(unrelated) + 1))
        for name, edit in (("fresh", None), ("zeros", replacing(stale)),
                           ("another request's", replacing(stale, other)),
                           ("control: every context row zeroed", replacing(list(range(len(turn2) - 1))))):
            runs[name].append(reference_chain_decode(target, draft, turn2, new_tokens, steps, CPU,
                                                     edit_context_kv=edit).accepted)
    return {name: tokens_per_verify(accepted) for name, accepted in runs.items()}


def measure_running(requests: int, plain_tokens: int, new_tokens: int, rebuilt=(8, 32),
                    steps: int = 3) -> dict[str, float]:
    """A running request that decoded its last ``plain_tokens`` plainly, then speculates: its
    draft KV over them rebuilt whole (the catch-up within its window), its newest N only (a
    smaller window or share), or not at all."""
    target, draft = load_pair()
    prompts = json.loads((PAIR / "eval_prompts.json").read_text())["prompts"]
    cases = {"all rebuilt": plain_tokens, **{f"newest {n} rebuilt": n for n in rebuilt}, "none rebuilt": 0}
    runs: dict[str, list[list[int]]] = {name: [] for name in cases}
    for i in range(requests):
        prompt = prompts[i % len(prompts)]["input_ids"]
        context = greedy(target, prompt, plain_tokens)
        # Rows of the tokens plain steps fed (the first generated one's row is the prefill's).
        plain_rows = list(range(len(prompt), len(context) - 1))
        for name, newest in cases.items():
            stale = plain_rows[: max(0, len(plain_rows) - newest)]
            runs[name].append(reference_chain_decode(target, draft, context, new_tokens, steps, CPU,
                                                     edit_context_kv=replacing(stale) if stale else None).accepted)
    return {name: tokens_per_verify(accepted) for name, accepted in runs.items()}


def measure_prompt_window(requests: int, new_tokens: int, windows=(32, 16, 8), steps: int = 3) -> dict[str, float]:
    """A new request whose prefill wrote the draft's KV over only the newest rows of its prompt,
    then speculates: the older prompt rows zeros, or another request's for the middle window."""
    target, draft = load_pair()
    prompts = json.loads((PAIR / "eval_prompts.json").read_text())["prompts"]
    middle = windows[len(windows) // 2]
    cases = {"whole prompt": (None, False), **{f"newest {n}": (n, False) for n in windows},
             f"newest {middle}, older rows another request's": (middle, True), "none": (0, False)}
    runs: dict[str, list[list[int]]] = {name: [] for name in cases}
    for i in range(requests):
        prompt = prompts[i % len(prompts)]["input_ids"]
        # The prefill's draft extend writes rows 0 .. len(prompt) - 1 (the last one reads the first
        # token the prefill sampled); the request then decodes from there.
        context = greedy(target, prompt, 1)
        rows = list(range(len(prompt)))
        unrelated = prompts[(i + 33) % len(prompts)]["input_ids"]
        other = context_kv(target, draft, greedy(target, unrelated, max(1, len(context) - len(unrelated) + 1)))
        for name, (newest, foreign) in cases.items():
            stale = [] if newest is None else rows[: max(0, len(rows) - newest)]
            edit = replacing(stale, other if foreign else None) if stale else None
            runs[name].append(reference_chain_decode(target, draft, context, new_tokens, steps, CPU,
                                                     edit_context_kv=edit).accepted)
    return {name: tokens_per_verify(accepted) for name, accepted in runs.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--follow-ups", type=int, default=48)
    parser.add_argument("--answer-tokens", type=int, default=64, help="turn 1's answer, decoded plainly")
    parser.add_argument("--new-tokens", type=int, default=48, help="tokens turn 2 (or the request) decodes next")
    parser.add_argument("--running", type=int, metavar="PLAIN_TOKENS",
                        help="instead: running requests (as many as --follow-ups) whose last PLAIN_TOKENS "
                             "were decoded plainly, with their draft KV rebuilt in part")
    parser.add_argument("--prompt-window", action="store_true",
                        help="instead: new requests (as many as --follow-ups) whose prefill wrote the draft's "
                             "KV over only the newest rows of the prompt")
    args = parser.parse_args(argv)
    if args.running is not None and args.running < 2:
        parser.error(f"--running {args.running}: give 2 or more plainly decoded tokens")
    if args.running is not None and args.prompt_window:
        parser.error("--running and --prompt-window measure different requests: give one of them")
    torch.manual_seed(0)
    start = time.monotonic()
    if args.prompt_window:
        result = measure_prompt_window(args.follow_ups, args.new_tokens)
        prompts = json.loads((PAIR / "eval_prompts.json").read_text())["prompts"]
        lengths = [len(prompts[i % len(prompts)]["input_ids"]) for i in range(args.follow_ups)]
        what = (f"{args.follow_ups} new requests on the tiny pair, prompts of {min(lengths)}-{max(lengths)} "
                f"tokens, {args.new_tokens} tokens decoded speculatively")
        column = "draft KV over the prompt"
    elif args.running is not None:
        result = measure_running(args.follow_ups, args.running, args.new_tokens)
        what = (f"{args.follow_ups} running requests on the tiny pair, the last {args.running} tokens decoded "
                f"plainly, then {args.new_tokens} speculatively")
        column = "draft KV over the plainly decoded tokens"
    else:
        result = measure(args.follow_ups, args.answer_tokens, args.new_tokens)
        what = (f"{args.follow_ups} follow-ups on the tiny pair, turn 1's answer {args.answer_tokens} tokens, "
                f"turn 2 {args.new_tokens} tokens")
        column = "draft KV over turn 1's answer"
    print(f"{what}, chain of 3 ({time.monotonic() - start:.0f} s):\n")
    first = next(iter(result.values()))
    print(f"| {column} | tokens per verify (bonus included) | of the first row |\n| --- | --- | --- |")
    for name, value in result.items():
        print(f"| {name} | {value:.3f} | {value / first:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
