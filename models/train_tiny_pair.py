"""Train a tiny Llama target and an EAGLE-3 draft for it, from scratch, in a few minutes.

The pair exists so that GPU tests can check speculative decoding with real accepted tokens:
the target is a `LlamaForCausalLM` (HF transformers format) trained on the Python standard
library; the draft is a `LlamaForCausalLMEagle3` checkpoint in the layout sglang 0.5.17 loads
for `--speculative-algorithm EAGLE3` (SpecForge / EAGLE-3 naming: `fc`, `midlayer.*`, `norm`,
`lm_head`, `d2t`, `t2d`; the embedding is shared with the target at load time).

What sglang does, and this script mirrors:
  * The target captures `hidden_states + residual` before layers `id + 1` for each id in the
    draft's `eagle_config.eagle_aux_hidden_state_layer_ids`, i.e. the outputs of decoder
    layers `id` (HF numbering), concatenated in layer order.
  * Draft row j of a request gets token x[j+1] and target features of position j, at rope
    position j; the draft's decoder layer attends over concat(input_layernorm(embed),
    hidden_norm(h)) where h = fc(features); its pre-norm residual stream is the hidden state
    fed to the next draft step (which skips fc), one rope position further on.

Usage:
  python models/train_tiny_pair.py --out /tmp/tiny-pair --tar /tmp/tiny-pair.tar   # GPU, ~3 min
  python models/train_tiny_pair.py --smoke --out /tmp/tiny-smoke                   # CPU, < 2 min
  python models/train_tiny_pair.py --set repeat_chunk=96 --out /tmp/recall-pair     # a pair that copies
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import logging
import random
import sys
import time
from pathlib import Path

import tokenizers
import torch
import transformers

# The stages live in the tiny_pair_training package next to this script; put this folder on
# sys.path so the import works from any working directory (and under python -P).
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_pair_training.corpus import load_corpus, repeated_chunks  # noqa: E402
from tiny_pair_training.draft import train_draft  # noqa: E402
from tiny_pair_training.evaluation import (check_against_reference, copy_accuracy,  # noqa: E402
                                           make_prompts, offline_acceptance, reference_ok)
from tiny_pair_training.export import (check_saved, count_params, pack, save_draft,  # noqa: E402
                                       save_target, write_prompts)
from tiny_pair_training.scale import AUX_LAYER_IDS, FULL, HELDOUT_MODULO, SMOKE, Scale  # noqa: E402
from tiny_pair_training.target import greedy_generate, train_target  # noqa: E402
from tiny_pair_training.tokenizer import encode_docs, train_tokenizer  # noqa: E402

logger = logging.getLogger("train_tiny_pair")


def run(scale: Scale, out: Path, seed: int, device: torch.device) -> dict:
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    random.seed(seed)
    torch.manual_seed(seed)
    corpus = load_corpus(scale.max_train_chars)
    tokenizer = train_tokenizer([t for _, t in corpus.train], scale.vocab_size)
    train_docs = encode_docs(tokenizer, [t for _, t in corpus.train])
    heldout_docs = encode_docs(tokenizer, [t for _, t in corpus.heldout])
    if scale.repeat_chunk:
        train_docs = [repeated_chunks(d, scale.repeat_chunk) for d in train_docs]
        heldout_docs = [repeated_chunks(d, scale.repeat_chunk) for d in heldout_docs]
    stream = torch.tensor([i for d in train_docs for i in d], dtype=torch.long)
    heldout = torch.tensor([i for d in heldout_docs for i in d], dtype=torch.long)
    timings["tokenizer_s"] = round(time.monotonic() - t0, 1)
    logger.info("tokens: %d train, %d held-out", stream.numel(), heldout.numel())

    t1 = time.monotonic()
    target, target_stats = train_target(scale, stream, heldout, device, seed)
    timings["target_s"] = round(time.monotonic() - t1, 1)

    t1 = time.monotonic()
    rng = random.Random(seed)
    named_train = [(name, ids) for (name, _), ids in zip(corpus.train, train_docs)]
    gen_prompts = torch.tensor([p.input_ids for p in make_prompts(
        named_train, (scale.gen_prompt_len,), scale.gen_seqs, rng)])
    data = torch.cat([greedy_generate(target, gen_prompts[i : i + scale.gen_batch].to(device),
                                      scale.gen_len).cpu()
                      for i in range(0, len(gen_prompts), scale.gen_batch)])
    timings["generate_s"] = round(time.monotonic() - t1, 1)
    logger.info("draft data: %s tokens", tuple(data.shape))

    t1 = time.monotonic()
    draft, draft_stats = train_draft(scale, target, data, device, seed)
    timings["draft_s"] = round(time.monotonic() - t1, 1)

    t1 = time.monotonic()
    named_heldout = [(name, ids) for (name, _), ids in zip(corpus.heldout, heldout_docs)]
    prompts = make_prompts(named_heldout, scale.eval_prompt_lens, scale.eval_prompts_per_len,
                           random.Random(seed + 2))
    acceptance, outputs, per_prompt = offline_acceptance(
        target, draft, prompts, scale.eval_max_new, scale.ttt_steps, device)
    reference = [check_against_reference(target, draft, prompts[i].input_ids, outputs[i],
                                         per_prompt[i], scale.ttt_steps, device)
                 for i in range(scale.reference_prompts)]
    if not reference_ok(reference):
        logger.error("parallel evaluation disagrees with the step-by-step reference")
    copying = (copy_accuracy(target, heldout_docs, scale.repeat_chunk, scale.eval_prompts_per_len,
                             scale.target_seq, device) if scale.repeat_chunk else None)
    timings["eval_s"] = round(time.monotonic() - t1, 1)
    logger.info("offline acceptance: %s; reference check: %s; copy accuracy: %s", acceptance, reference, copying)

    (out / "target").mkdir(parents=True, exist_ok=True)
    save_target(target, tokenizer, out / "target")
    save_draft(draft, scale, out / "target", out / "draft")
    write_prompts(prompts, outputs, scale.eval_max_new, out / "eval_prompts.json")
    checks = check_saved(out, target, draft, scale, prompts[0].input_ids)
    timings["total_s"] = round(time.monotonic() - t0, 1)
    return {
        "seed": seed, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__},
        "scale": dataclasses.asdict(scale),
        "aux_layer_ids": list(AUX_LAYER_IDS),
        "corpus": {"train_files": len(corpus.train), "heldout_files": len(corpus.heldout),
                   "train_tokens": stream.numel(), "heldout_tokens": heldout.numel(),
                   "heldout_rule": f"sha1(path relative to stdlib) % {HELDOUT_MODULO} == 0"},
        "params": {"target": count_params(target), "draft": count_params(draft)},
        "target": target_stats, "draft": draft_stats,
        "offline_acceptance": acceptance, "copy_accuracy": copying, "reference_check": reference,
        "reference_check_ok": reference_ok(reference),
        "saved_checks": checks, "timings": timings,
    }


def with_overrides(scale: Scale, overrides: list[str]) -> Scale:
    """Apply FIELD=VALUE overrides, each parsed as a Python literal."""
    changes = {}
    for item in overrides:
        field, value = item.split("=", 1)
        if field not in {f.name for f in dataclasses.fields(Scale)}:
            raise SystemExit(f"unknown Scale field {field!r}")
        changes[field] = ast.literal_eval(value)
    return dataclasses.replace(scale, **changes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder (created)")
    parser.add_argument("--tar", type=Path, help="also pack the output folder into this tar")
    parser.add_argument("--smoke", action="store_true", help="toy scale, for a CPU check")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a Scale field, e.g. --set target_steps=2000")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    scale = with_overrides(SMOKE if args.smoke else FULL, args.set)
    device = torch.device(args.device)
    if device.type == "cpu":
        # Tiny ops: several threads gain little and stall badly when the CPU is shared.
        torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    card = run(scale, args.out, args.seed, device)
    (args.out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    logger.info("card: %s", json.dumps({k: card[k] for k in ("target", "draft",
                                                                 "offline_acceptance", "timings")}))
    if args.tar:
        pack(args.out, args.tar)
    if args.smoke and not card["reference_check_ok"]:
        raise SystemExit("reference check failed")


if __name__ == "__main__":
    main()
