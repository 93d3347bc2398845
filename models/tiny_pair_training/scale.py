"""Sizes and budgets of a run (FULL on the GPU, SMOKE on the CPU) and the shared constants."""

from __future__ import annotations

import dataclasses

PAD, BOS, EOS = 0, 1, 2
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]
# HF decoder layers whose outputs the draft reads (sglang captures before layer id + 1).
AUX_LAYER_IDS = (0, 1, 2)
HELDOUT_MODULO = 20  # a file is held out when sha1(relative path) % 20 == 0 (5% of files)
# Both models' safetensors together: the committed pair stays small enough to ship inside the
# repository and to copy with a checkout next to a 58 MB offline sglang install (well under 8 MB).
MAX_WEIGHT_BYTES = 5_000_000


@dataclasses.dataclass(frozen=True)
class Scale:
    """Sizes and budgets of one run; FULL is the GPU run, SMOKE a CPU check of the pipeline."""

    vocab_size: int
    max_train_chars: int | None
    hidden: int
    target_intermediate: int
    target_layers: int
    heads: int
    kv_heads: int
    head_dim: int
    target_steps: int
    target_batch: int
    target_seq: int
    target_lr: float
    target_max_s: float
    gen_seqs: int
    gen_prompt_len: int
    gen_len: int
    gen_batch: int
    draft_intermediate: int
    draft_vocab_size: int
    draft_steps: int
    draft_batch: int
    draft_lr: float
    draft_max_s: float
    ttt_steps: int
    eval_prompt_lens: tuple[int, ...]
    eval_prompts_per_len: int
    eval_max_new: int
    reference_prompts: int
    # > 0: every document's tokens in chunks of this many, each chunk twice in a row, so that
    # the models learn to copy from this far back (a draft that must read its context).
    repeat_chunk: int = 0


FULL = Scale(
    vocab_size=1024, max_train_chars=None, hidden=192, target_intermediate=512, target_layers=4,
    heads=3, kv_heads=1, head_dim=64, target_steps=3000, target_batch=64, target_seq=512,
    target_lr=3e-3, target_max_s=50.0, gen_seqs=8192, gen_prompt_len=64, gen_len=192,
    gen_batch=1024, draft_intermediate=384, draft_vocab_size=512, draft_steps=3000,
    draft_batch=64, draft_lr=2e-3, draft_max_s=45.0, ttt_steps=3,
    eval_prompt_lens=(24, 40, 64, 100), eval_prompts_per_len=16, eval_max_new=64,
    reference_prompts=4,
)
SMOKE = Scale(
    vocab_size=384, max_train_chars=300_000, hidden=128, target_intermediate=256,
    target_layers=4, heads=2, kv_heads=1, head_dim=64, target_steps=150, target_batch=8,
    target_seq=64, target_lr=3e-3, target_max_s=30.0, gen_seqs=32, gen_prompt_len=16,
    gen_len=32, gen_batch=32, draft_intermediate=192, draft_vocab_size=192, draft_steps=100,
    draft_batch=8, draft_lr=2e-3, draft_max_s=20.0, ttt_steps=3, eval_prompt_lens=(12, 16),
    eval_prompts_per_len=2, eval_max_new=16, reference_prompts=2,
)
ROPE_THETA = 10000.0
RMS_EPS = 1e-5
MAX_POSITIONS = 2048
