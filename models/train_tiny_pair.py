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
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import hashlib
import json
import logging
import math
import random
import shutil
import sysconfig
import tarfile
import time
from pathlib import Path
from typing import Iterator

import tokenizers
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import decoders, models, pre_tokenizers, processors, trainers
from torch import nn
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM,
                          PreTrainedTokenizerFast)

logger = logging.getLogger("train_tiny_pair")

PAD, BOS, EOS = 0, 1, 2
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>"]
# HF decoder layers whose outputs the draft reads (sglang captures before layer id + 1).
AUX_LAYER_IDS = (0, 1, 2)
HELDOUT_MODULO = 20  # a file is held out when sha1(relative path) % 20 == 0 (5% of files)
# Both models' safetensors together. Device calls carry the checkout (the committed pair
# included) next to the 58 MB GPU kit within 64 MiB, so the pair stays well under 8 MB.
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


# ----------------------------------------------------------------------------- corpus


@dataclasses.dataclass
class Corpus:
    train: list[tuple[str, str]]  # (relative path, text)
    heldout: list[tuple[str, str]]


def is_heldout(rel_path: str) -> bool:
    return int(hashlib.sha1(rel_path.encode()).hexdigest(), 16) % HELDOUT_MODULO == 0


def load_corpus(max_train_chars: int | None) -> Corpus:
    """The standard library's .py files, split deterministically by a hash of their path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py")
        if not {"site-packages", "dist-packages", "__pycache__"} & set(p.parts)
    )
    # A hash order keeps a --smoke subset spread over the whole library.
    files.sort(key=lambda p: hashlib.sha1(str(p.relative_to(root)).encode()).hexdigest())
    corpus = Corpus(train=[], heldout=[])
    train_chars = 0
    for path in files:
        rel = str(path.relative_to(root))
        text = path.read_text(encoding="utf-8", errors="replace")
        if not text.strip():
            continue
        if is_heldout(rel):
            corpus.heldout.append((rel, text))
        elif max_train_chars is None or train_chars < max_train_chars:
            corpus.train.append((rel, text))
            train_chars += len(text)
    if max_train_chars is not None:
        corpus.heldout = corpus.heldout[: max(4, len(corpus.train) // HELDOUT_MODULO)]
    logger.info("corpus %s: %d train files (%.1f MB), %d held-out files", root,
                len(corpus.train), train_chars / 1e6, len(corpus.heldout))
    return corpus


# ----------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with <pad>/<s>/</s> = 0/1/2; encoding prepends <s> like Llama."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS)]
    )
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [PAD, BOS, EOS]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        model_max_length=MAX_POSITIONS,
    )


def encode_docs(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> list[list[int]]:
    """Each document as <s> tokens </s>."""
    encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    return [[BOS, *e.ids, EOS] for e in encodings]


# ----------------------------------------------------------------------------- target


def target_config(scale: Scale) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=scale.vocab_size, hidden_size=scale.hidden,
        intermediate_size=scale.target_intermediate, num_hidden_layers=scale.target_layers,
        num_attention_heads=scale.heads, num_key_value_heads=scale.kv_heads,
        head_dim=scale.head_dim, max_position_embeddings=MAX_POSITIONS, rms_norm_eps=RMS_EPS,
        rope_theta=ROPE_THETA, tie_word_embeddings=True, bos_token_id=BOS, eos_token_id=EOS,
        pad_token_id=PAD, architectures=["LlamaForCausalLM"],
    )


def lr_at(step: int, total: int, peak: float) -> float:
    """Linear warmup (10% of the steps, at most 100), cosine decay to 10% of the peak."""
    warmup = max(1, min(100, total // 10))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def make_optimizer(params: list[nn.Parameter], lr: float, device: torch.device):
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.05,
                             fused=device.type == "cuda")


def autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def sample_windows(stream: torch.Tensor, batch: int, length: int,
                   gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=gen)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])


def scheduled_steps(label: str, opt: torch.optim.Optimizer, steps: int, peak_lr: float,
                    max_s: float) -> Iterator[int]:
    """Step indices with the learning-rate schedule applied; stops at the time budget."""
    start = time.monotonic()
    for step in range(steps):
        if time.monotonic() - start > max_s:
            logger.warning("%s: time budget reached at step %d", label, step)
            return
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr)
        yield step


def train_target(scale: Scale, stream: torch.Tensor, heldout: torch.Tensor,
                 device: torch.device, seed: int) -> tuple[LlamaForCausalLM, dict]:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(target_config(scale)).to(device)
    opt = make_optimizer(list(model.parameters()), scale.target_lr, device)
    gen = torch.Generator().manual_seed(seed)
    start, losses = time.monotonic(), []
    for step in scheduled_steps("target", opt, scale.target_steps, scale.target_lr,
                                scale.target_max_s):
        x = sample_windows(stream, scale.target_batch, scale.target_seq, gen).to(device)
        with autocast(device):
            loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 250 == 0:
            logger.info("target step %d loss %.3f", step, loss.item())
    round_to_bf16(model)
    stats = {
        "steps": len(losses), "seconds": round(time.monotonic() - start, 1),
        "final_train_loss": round(sum(losses[-50:]) / len(losses[-50:]), 4),
        "heldout_loss": round(heldout_loss(model, heldout, scale, device), 4),
    }
    logger.info("target: %s", stats)
    return model, stats


@torch.no_grad()
def heldout_loss(model: LlamaForCausalLM, heldout: torch.Tensor, scale: Scale,
                 device: torch.device) -> float:
    n = min(heldout.numel() // scale.target_seq, 64)
    x = heldout[: n * scale.target_seq].view(n, scale.target_seq).to(device)
    return sum(model(input_ids=x[i : i + 8], labels=x[i : i + 8]).loss.item() * len(x[i : i + 8])
               for i in range(0, n, 8)) / n


def round_to_bf16(module: nn.Module) -> None:
    """Keep float32 storage but bf16 values: the models are saved in bf16 and served in fp32."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    module.float().eval().requires_grad_(False)


@torch.no_grad()
def target_features(target: LlamaForCausalLM, tokens: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated outputs of layers AUX_LAYER_IDS (what sglang hands the draft), greedy ids."""
    captured: dict[int, torch.Tensor] = {}

    def hook(layer_id: int):
        def capture(_module, _inputs, output):
            captured[layer_id] = output[0] if isinstance(output, tuple) else output
        return capture

    handles = [target.model.layers[i].register_forward_hook(hook(i)) for i in AUX_LAYER_IDS]
    try:
        logits = target(input_ids=tokens).logits
    finally:
        for handle in handles:
            handle.remove()
    aux = torch.cat([captured[i] for i in sorted(AUX_LAYER_IDS)], dim=-1).float()
    return aux, logits.argmax(-1)


@torch.no_grad()
def greedy_generate(target: LlamaForCausalLM, prompts: torch.Tensor, n_new: int) -> torch.Tensor:
    """Greedy continuation without stopping at </s> (like sglang with ignore_eos)."""
    out = target(input_ids=prompts, use_cache=True)
    past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    pieces = [prompts, nxt]
    for _ in range(n_new - 1):
        out = target(input_ids=nxt, past_key_values=past, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        pieces.append(nxt)
    return torch.cat(pieces, dim=1)


# ----------------------------------------------------------------------------- draft


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = RMS_EPS) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class DraftAttention(nn.Module):
    def __init__(self, in_dim: int, hidden: int, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(in_dim, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)


class DraftMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """sglang's llama_eagle3 LlamaDecoderLayer with is_input_layer=True."""

    def __init__(self, scale: Scale) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(scale.hidden)
        self.hidden_norm = RMSNorm(scale.hidden)
        self.self_attn = DraftAttention(2 * scale.hidden, scale.hidden, scale.heads,
                                        scale.kv_heads, scale.head_dim)
        self.post_attention_layernorm = RMSNorm(scale.hidden)
        self.mlp = DraftMLP(scale.hidden, scale.draft_intermediate)


class Eagle3Draft(nn.Module):
    """Parameter names are those of EAGLE-3 checkpoints; sglang maps midlayer -> layers.0."""

    def __init__(self, scale: Scale) -> None:
        super().__init__()
        self.fc = nn.Linear(len(AUX_LAYER_IDS) * scale.hidden, scale.hidden, bias=False)
        self.midlayer = DraftLayer(scale)
        self.norm = RMSNorm(scale.hidden)
        self.lm_head = nn.Linear(scale.hidden, scale.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(scale.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(scale.vocab_size, dtype=torch.bool))

    def set_vocab(self, draft_to_target: torch.Tensor) -> None:
        """draft_to_target: sorted target ids of the draft vocabulary."""
        self.d2t.copy_(draft_to_target - torch.arange(len(draft_to_target),
                                                      device=draft_to_target.device))
        self.t2d.zero_()
        self.t2d[draft_to_target] = True

    def draft_to_target(self) -> torch.Tensor:
        return self.d2t + torch.arange(len(self.d2t), device=self.d2t.device)

    def target_to_draft(self) -> torch.Tensor:
        """Draft id of every target id, -1 where the draft cannot emit it."""
        index = torch.full_like(self.t2d, -1, dtype=torch.long)
        index[self.draft_to_target()] = torch.arange(len(self.d2t), device=self.d2t.device)
        return index

    def project(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B,h,T,d], k and v [B,kv,T,d] with rope applied, and the residual stream."""
        layer, attn = self.midlayer, self.midlayer.self_attn
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
        b, t, _ = x.shape
        q = attn.q_proj(x).view(b, t, attn.heads, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, attn.kv_heads, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, attn.kv_heads, attn.head_dim).transpose(1, 2)
        cos, sin = rope_cos_sin(positions, attn.head_dim, x.device)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, hidden

    def finish(self, attn_out: torch.Tensor, residual: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits over the draft vocabulary and the pre-norm hidden state for the next step."""
        layer = self.midlayer
        b, _, t, _ = attn_out.shape
        residual = layer.self_attn.o_proj(attn_out.transpose(1, 2).reshape(b, t, -1)) + residual
        residual = layer.mlp(layer.post_attention_layernorm(residual)) + residual
        return self.lm_head(self.norm(residual)), residual


def rope_cos_sin(positions: torch.Tensor, head_dim: int, device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    freqs = positions.to(device).float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotation (HF Llama, sglang get_rope is_neox_style=True)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def repeat_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def ttt_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]
                  ) -> torch.Tensor:
    """Training-time-test attention of draft step len(keys)-1 at every row i.

    Row i attends to step-0 keys of rows 0..i (target features, causal) and to the keys that
    draft steps 1..k produced at row i itself (its own earlier chain positions).
    """
    heads, t, scale = q.shape[1], q.shape[2], q.shape[-1] ** -0.5
    k0, v0 = repeat_kv(keys[0], heads), repeat_kv(values[0], heads)
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = [(q @ k0.transpose(-1, -2) * scale).float().masked_fill(~causal, float("-inf"))]
    scores += [(q * repeat_kv(k, heads)).sum(-1, keepdim=True).float() * scale for k in keys[1:]]
    probs = torch.cat(scores, dim=-1).softmax(-1).to(q.dtype)
    out = probs[..., :t] @ v0
    for m, v in enumerate(values[1:]):
        out = out + probs[..., t + m : t + m + 1] * repeat_kv(v, heads)
    return out


def shift_left(x: torch.Tensor, n: int, fill: int) -> torch.Tensor:
    return torch.cat([x[:, n:], x.new_full((x.shape[0], n), fill)], dim=1)


def draft_ttt_logits(draft: Eagle3Draft, embed: nn.Embedding, aux: torch.Tensor,
                     tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Logits of draft steps 0..steps-1 at every row i (row i: last committed token x[i+1]).

    Step k at row i reads token x[i+1+k] (the token the chain proposed and that was accepted
    when the step matters) at rope position i+k and predicts the target's token x[i+2+k].
    """
    t = tokens.shape[1]
    hidden = draft.fc(aux)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    logits = []
    for k in range(steps):
        q, key, value, residual = draft.project(
            embed(shift_left(tokens, 1 + k, PAD)), hidden,
            torch.arange(t, device=tokens.device) + k)
        keys.append(key)
        values.append(value)
        step_logits, hidden = draft.finish(ttt_attention(q, keys, values), residual)
        logits.append(step_logits)
    return logits


def ttt_targets(tokens: torch.Tensor, greedy: torch.Tensor, steps: int
                ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(label, valid) of each step: step k at row i learns greedy[i+1+k], the target's token
    after x[0..i+1+k]; for k >= 1 that only matters when x[i+1+m] == greedy[i+m], m = 1..k."""
    t = tokens.shape[1]
    consistent = torch.zeros_like(tokens, dtype=torch.bool)
    consistent[:, :-1] = tokens[:, 1:] == greedy[:, :-1]
    rows = torch.arange(t, device=tokens.device)
    out = []
    chain_ok = torch.ones_like(consistent)
    for k in range(steps):
        if k > 0:
            chain_ok = chain_ok & shift_left(consistent, k, 0).bool()
        valid = chain_ok & (rows + 1 + k <= t - 1)[None, :]
        out.append((shift_left(greedy, 1 + k, PAD), valid))
    return out


def select_draft_vocab(greedy: torch.Tensor, size: int, vocab_size: int
                       ) -> tuple[torch.Tensor, float]:
    """The `size` most frequent target greedy tokens, sorted, and the share of tokens they cover."""
    counts = torch.bincount(greedy.flatten().cpu(), minlength=vocab_size)
    top = counts.topk(size).indices.sort().values
    return top, counts[top].sum().item() / counts.sum().item()


def train_draft(scale: Scale, target: LlamaForCausalLM, data: torch.Tensor,
                device: torch.device, seed: int) -> tuple[Eagle3Draft, dict]:
    torch.manual_seed(seed)
    draft = Eagle3Draft(scale).to(device)
    greedy_sample = torch.cat([target_features(target, data[i : i + 64].to(device))[1]
                               for i in range(0, min(len(data), 2048), 64)])
    vocab, coverage = select_draft_vocab(greedy_sample, scale.draft_vocab_size, scale.vocab_size)
    draft.set_vocab(vocab.to(device))
    t2d_index = draft.target_to_draft()
    embed = target.model.embed_tokens
    opt = make_optimizer([p for p in draft.parameters()], scale.draft_lr, device)
    gen = torch.Generator().manual_seed(seed + 1)
    start = time.monotonic()
    history: list[list[float]] = []
    for step in scheduled_steps("draft", opt, scale.draft_steps, scale.draft_lr,
                                scale.draft_max_s):
        idx = torch.randint(0, len(data), (scale.draft_batch,), generator=gen)
        tokens = data[idx].to(device)
        aux, greedy = target_features(target, tokens)
        with autocast(device):
            logits = draft_ttt_logits(draft, embed, aux, tokens, scale.ttt_steps)
        loss, accs = ttt_loss(logits, ttt_targets(tokens, greedy, scale.ttt_steps), t2d_index)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        history.append(accs)
        if step % 250 == 0:
            logger.info("draft step %d loss %.3f step accuracies %s", step, loss.item(),
                        [round(a, 3) for a in accs])
    round_to_bf16(draft)
    recent = history[-50:]
    stats = {
        "steps": len(history), "seconds": round(time.monotonic() - start, 1),
        "draft_vocab_coverage_of_target_greedy_tokens": round(coverage, 4),
        "train_step_accuracy": [round(sum(a[k] for a in recent) / len(recent), 4)
                                for k in range(scale.ttt_steps)],
    }
    logger.info("draft: %s", stats)
    return draft, stats


def ttt_loss(logits: list[torch.Tensor], targets: list[tuple[torch.Tensor, torch.Tensor]],
             t2d_index: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """Cross-entropy against the target's greedy token (in draft ids), weights 0.8^k."""
    total = logits[0].new_zeros((), dtype=torch.float32)
    accs = []
    for k, (step_logits, (labels, valid)) in enumerate(zip(logits, targets)):
        draft_labels = t2d_index[labels]
        valid = valid & (draft_labels >= 0)
        chosen = step_logits[valid].float()
        total = total + 0.8**k * F.cross_entropy(chosen, draft_labels[valid])
        accs.append((chosen.argmax(-1) == draft_labels[valid]).float().mean().item())
    return total, accs


# ----------------------------------------------------------------------------- evaluation


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
                           max_new: int, steps: int, device: torch.device) -> ReferenceRun:
    """Step-by-step greedy EAGLE-3 decoding without the parallel training-time-test trick:
    recomputes everything per verify step, with plain causal attention over the draft prefix
    and explicit chain keys. An independent check of draft_ttt_logits and walk_verifies."""
    embed, d2t = target.model.embed_tokens, draft.draft_to_target()
    seq = prompt + [target_features(target, torch.tensor([prompt], device=device))[1][0, -1].item()]
    run = ReferenceRun(output=[], accepted=[], chain_logits=[])
    while len(seq) - len(prompt) < max_new:
        n = len(seq)
        aux, _ = target_features(target, torch.tensor([seq[:-1]], device=device))
        rows = torch.tensor([seq[1:]], device=device)
        q, k, v, residual = draft.project(embed(rows), draft.fc(aux), torch.arange(n - 1))
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


# ----------------------------------------------------------------------------- saving


def save_target(target: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    bf16 = copy.deepcopy(target).to(torch.bfloat16)
    bf16.generation_config.pad_token_id = PAD
    bf16.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # transformers 5 writes `dtype` and its own tokenizer class name; older readers look for
    # `torch_dtype` and PreTrainedTokenizerFast (which transformers 5 maps to the same class).
    update_json(out / "config.json", torch_dtype="bfloat16")
    update_json(out / "tokenizer_config.json", tokenizer_class="PreTrainedTokenizerFast")


def update_json(path: Path, **updates: object) -> None:
    data = json.loads(path.read_text())
    data.update(updates)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def draft_config(scale: Scale) -> dict:
    config = LlamaConfig(
        vocab_size=scale.vocab_size, hidden_size=scale.hidden,
        intermediate_size=scale.draft_intermediate, num_hidden_layers=1,
        num_attention_heads=scale.heads, num_key_value_heads=scale.kv_heads,
        head_dim=scale.head_dim, max_position_embeddings=MAX_POSITIONS, rms_norm_eps=RMS_EPS,
        rope_theta=ROPE_THETA, tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=EOS,
        pad_token_id=PAD, architectures=["LlamaForCausalLMEagle3"],
    ).to_diff_dict()
    config.update(
        draft_vocab_size=scale.draft_vocab_size, target_hidden_size=scale.hidden,
        torch_dtype="bfloat16", dtype="bfloat16",
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(AUX_LAYER_IDS),
                      "use_aux_hidden_state": True},
    )
    return config


def save_draft(draft: Eagle3Draft, scale: Scale, target_dir: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: (t if name in ("d2t", "t2d") else t.to(torch.bfloat16)).contiguous().cpu()
               for name, t in draft.state_dict().items()}
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.dumps(draft_config(scale), indent=2, sort_keys=True)
    (out / "config.json").write_text(config + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(target_dir / name, out / name)


def write_prompts(prompts: list[EvalPrompt], outputs: list[list[int]], max_new: int,
                  path: Path) -> None:
    path.write_text(json.dumps({
        "max_new_tokens": max_new,
        "note": "held-out stdlib windows; hf_greedy_output_ids from transformers in float32",
        "prompts": [{"source": p.source, "input_ids": p.input_ids, "hf_greedy_output_ids": o}
                    for p, o in zip(prompts, outputs)],
    }) + "\n")


def pack(out: Path, tar_path: Path) -> None:
    with tarfile.open(tar_path, "w") as tar:
        tar.add(out, arcname=out.name)
    logger.info("packed %s (%.2f MB)", tar_path, tar_path.stat().st_size / 1e6)


# ----------------------------------------------------------------------------- checks


@torch.no_grad()
def check_saved(out: Path, target: LlamaForCausalLM, draft: Eagle3Draft, scale: Scale,
                prompt: list[int]) -> dict:
    """Reload both folders the way a consumer would and compare with the in-memory models."""
    tokenizer = AutoTokenizer.from_pretrained(out / "target")
    sample = "def f(x):\n    return x + 1\n"
    ids = tokenizer(sample)["input_ids"]
    assert ids[0] == BOS and tokenizer.decode(ids, skip_special_tokens=True) == sample
    reloaded = AutoModelForCausalLM.from_pretrained(out / "target", dtype=torch.float32).eval()
    x = torch.tensor([prompt])
    max_diff = (reloaded(input_ids=x).logits - target.cpu()(input_ids=x).logits).abs().max().item()
    assert max_diff < 1e-4, f"reloaded target differs by {max_diff}"
    saved = load_file(out / "draft" / "model.safetensors")
    expected = {k: v.cpu() for k, v in draft.state_dict().items()}
    assert saved.keys() == expected.keys()
    for name, tensor in saved.items():
        assert torch.equal(tensor.to(expected[name].dtype), expected[name]), name
    sizes = {name: (out / name / "model.safetensors").stat().st_size
             for name in ("target", "draft")}
    assert sum(sizes.values()) <= MAX_WEIGHT_BYTES, sizes
    config = json.loads((out / "draft" / "config.json").read_text())
    assert config["draft_vocab_size"] == scale.draft_vocab_size
    return {"tokenizer_roundtrip": True, "reloaded_target_max_logit_diff": max_diff,
            "draft_tensors": sorted(saved), "safetensors_bytes": sizes}


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ----------------------------------------------------------------------------- main


def run(scale: Scale, out: Path, seed: int, device: torch.device) -> dict:
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    random.seed(seed)
    torch.manual_seed(seed)
    corpus = load_corpus(scale.max_train_chars)
    tokenizer = train_tokenizer([t for _, t in corpus.train], scale.vocab_size)
    train_docs = encode_docs(tokenizer, [t for _, t in corpus.train])
    heldout_docs = encode_docs(tokenizer, [t for _, t in corpus.heldout])
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
    timings["eval_s"] = round(time.monotonic() - t1, 1)
    logger.info("offline acceptance: %s; reference check: %s", acceptance, reference)

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
        "offline_acceptance": acceptance, "reference_check": reference,
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
