"""Evaluation: prompts, offline acceptance of chain drafting, and the step-by-step reference
decode that checks the parallel evaluation."""

from __future__ import annotations

import dataclasses
import random

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

from tiny_pair_training.draft import Eagle3Draft, draft_ttt_logits, repeat_kv
from tiny_pair_training.scale import BOS
from tiny_pair_training.target import greedy_generate, target_features


@dataclasses.dataclass
class EvalPrompt:
    source: str
    input_ids: list[int]


def make_prompts(docs: list[tuple[str, list[int]]], lengths: tuple[int, ...], per_length: int,
                 rng: random.Random) -> list[EvalPrompt]:
    """<s> followed by a window of a document, `per_length` prompts of each total length."""
    prompts = []
    for length in lengths:
        candidates = [(name, ids) for name, ids in docs if len(ids) > length + 1]
        for _ in range(per_length):
            name, ids = rng.choice(candidates)
            start = rng.randrange(1, len(ids) - length)
            prompts.append(EvalPrompt(f"{name}@{start}", [BOS, *ids[start : start + length - 1]]))
    return prompts


@torch.no_grad()
def draft_chain_predictions(draft: Eagle3Draft, target: LlamaForCausalLM, seqs: torch.Tensor,
                            steps: int) -> torch.Tensor:
    """Target ids proposed by draft steps 0..steps-1 at every row: [steps, B, T]."""
    aux, _ = target_features(target, seqs)
    logits = draft_ttt_logits(draft, target.model.embed_tokens, aux, seqs, steps)
    d2t = draft.draft_to_target()
    return torch.stack([d2t[lg.argmax(-1)] for lg in logits])


def walk_verifies(preds: torch.Tensor, seq: list[int], prompt_len: int, max_new: int,
                  steps: int) -> list[int]:
    """Accepted drafts per verify step of greedy chain speculation (topk 1) over a greedy seq.

    After prefill the target has emitted seq[P]; the chain from row i = (last committed) - 1
    proposes preds[k, i] for seq[i+2+k]; a verify commits the accepted drafts plus one token.
    """
    accepted, produced, row = [], 1, prompt_len - 1
    while produced < max_new:
        a = 0
        while a < steps and row + 2 + a < len(seq) and preds[a, row] == seq[row + 2 + a]:
            a += 1
        accepted.append(a)
        produced += a + 1
        row += a + 1
    return accepted


def offline_acceptance(target: LlamaForCausalLM, draft: Eagle3Draft, prompts: list[EvalPrompt],
                       max_new: int, steps: int, device: torch.device
                       ) -> tuple[dict, list[list[int]], list[list[int]]]:
    """Mean accepted length per verify (bonus included) of chain drafting with `steps` steps."""
    outputs, per_prompt = [], []
    by_length: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_length.setdefault(len(p.input_ids), []).append(i)
    results: dict[int, tuple[list[int], list[int]]] = {}
    for length, idx in by_length.items():
        batch = torch.tensor([prompts[i].input_ids for i in idx], device=device)
        seqs = greedy_generate(target, batch, max_new)
        preds = draft_chain_predictions(draft, target, seqs, steps).cpu()
        for j, i in enumerate(idx):
            seq = seqs[j].tolist()
            results[i] = (seq[length:], walk_verifies(preds[:, j], seq, length, max_new, steps))
    for i in range(len(prompts)):
        outputs.append(results[i][0])
        per_prompt.append(results[i][1])
    return summarize_acceptance(per_prompt, max_new, steps), outputs, per_prompt


def summarize_acceptance(per_prompt: list[list[int]], max_new: int, steps: int) -> dict:
    verifies = sum(len(a) for a in per_prompt)
    committed = sum(min(sum(x + 1 for x in a), max_new - 1) for a in per_prompt)
    all_steps = [x for a in per_prompt for x in a]
    reached = [sum(1 for x in all_steps if x >= k) for k in range(steps + 1)]
    return {
        "prompts": len(per_prompt), "max_new_tokens": max_new, "num_steps": steps,
        "verify_steps": verifies,
        "mean_accept_length": round(committed / verifies, 4),
        "sglang_style_accept_length": round(len(per_prompt) * max_new / verifies, 4),
        "conditional_step_acceptance": [round(reached[k + 1] / max(1, reached[k]), 4)
                                        for k in range(steps)],
    }


@dataclasses.dataclass
class ReferenceRun:
    output: list[int]
    accepted: list[int]
    chain_logits: list[tuple[int, int, torch.Tensor]]  # (row, step, logits) of compared steps


@torch.no_grad()
def reference_chain_decode(target: LlamaForCausalLM, draft: Eagle3Draft, prompt: list[int],
                           max_new: int, steps: int, device: torch.device,
                           edit_context_kv=None) -> ReferenceRun:
    """Step-by-step greedy EAGLE-3 decoding without the parallel training-time-test trick:
    recomputes everything per verify step, with plain causal attention over the draft prefix
    and explicit chain keys. An independent check of draft_ttt_logits and walk_verifies.
    ``edit_context_kv(k, v) -> (k, v)``, if given, replaces the draft's keys and values of the
    context rows before they are read (what a draft KV cache the draft did not write holds)."""
    embed, d2t = target.model.embed_tokens, draft.draft_to_target()
    seq = prompt + [target_features(target, torch.tensor([prompt], device=device))[1][0, -1].item()]
    run = ReferenceRun(output=[], accepted=[], chain_logits=[])
    while len(seq) - len(prompt) < max_new:
        n = len(seq)
        aux, _ = target_features(target, torch.tensor([seq[:-1]], device=device))
        rows = torch.tensor([seq[1:]], device=device)
        q, k, v, residual = draft.project(embed(rows), draft.fc(aux), torch.arange(n - 1))
        if edit_context_kv is not None:
            k, v = edit_context_kv(k, v)
        heads = q.shape[1]
        out = F.scaled_dot_product_attention(q, repeat_kv(k, heads), repeat_kv(v, heads),
                                             is_causal=True)
        logits, hidden = draft.finish(out, residual)
        step_logits = [logits[0, -1]]
        hidden, keys, values = hidden[:, -1:], [k], [v]
        for m in range(1, steps):
            token = torch.tensor([[d2t[step_logits[-1].argmax()].item()]], device=device)
            q, k, v, residual = draft.project(embed(token), hidden, torch.tensor([n - 2 + m]))
            keys.append(k)
            values.append(v)
            out = F.scaled_dot_product_attention(q, repeat_kv(torch.cat(keys, 2), heads),
                                                 repeat_kv(torch.cat(values, 2), heads))
            logits, hidden = draft.finish(out, residual)
            step_logits.append(logits[0, -1])
        chain = [d2t[lg.argmax()].item() for lg in step_logits]
        _, greedy = target_features(target, torch.tensor([seq + chain], device=device))
        verified = greedy[0, n - 1 :].tolist()
        a = 0  # drafts past the output budget count as rejected, as in walk_verifies
        while a < steps and n + a < len(prompt) + max_new and chain[a] == verified[a]:
            a += 1
        run.accepted.append(a)
        # Steps 0..a ran on accepted inputs only: the parallel form must reproduce them.
        run.chain_logits += [(n - 2, m, step_logits[m]) for m in range(min(a + 1, steps))]
        seq += chain[:a] + [verified[a]]
    run.output = seq[len(prompt) : len(prompt) + max_new]
    return run


@torch.no_grad()
def check_against_reference(target: LlamaForCausalLM, draft: Eagle3Draft, prompt: list[int],
                            output: list[int], accepted: list[int], steps: int,
                            device: torch.device) -> dict:
    """Compare the parallel evaluation of one prompt with reference_chain_decode."""
    ref = reference_chain_decode(target, draft, prompt, len(output), steps, device)
    seq = torch.tensor([prompt + output], device=device)
    aux, _ = target_features(target, seq)
    ttt = draft_ttt_logits(draft, target.model.embed_tokens, aux, seq, steps)
    diffs = [(ttt[m][0, row] - lg).abs().max().item() for row, m, lg in ref.chain_logits
             if row + 1 + m < seq.shape[1]]
    return {"same_tokens": ref.output == output, "same_accepts": ref.accepted == accepted,
            "compared_logit_rows": len(diffs), "max_logit_diff": max(diffs, default=0.0)}


def reference_ok(results: list[dict]) -> bool:
    return all(r["same_tokens"] and r["same_accepts"] and r["max_logit_diff"] < 1e-3
               for r in results)


@torch.no_grad()
def copy_accuracy(target: LlamaForCausalLM, docs: list[list[int]], chunk: int, max_docs: int,
                  max_positions: int, device: torch.device) -> dict:
    """Teacher-forced greedy accuracy of the target on documents of repeated chunks, at first
    copies (new text) and at second copies (predictable by copying from ``chunk`` back), over
    each document's first ``max_positions`` tokens (the length the target was trained on)."""
    hits = {"first": 0, "second": 0}
    counts = {"first": 0, "second": 0}
    for doc in docs[:max_docs]:
        tokens = torch.tensor([doc[:max_positions]], device=device)
        predicted = target(input_ids=tokens).logits[0, :-1].argmax(-1).tolist()
        for position, (guess, actual) in enumerate(zip(predicted, tokens[0, 1:].tolist()), start=1):
            copy = "second" if ((position - 1) // chunk) % 2 == 1 else "first"
            hits[copy] += guess == actual
            counts[copy] += 1
    return {copy: round(hits[copy] / counts[copy], 4) if counts[copy] else None for copy in hits}
