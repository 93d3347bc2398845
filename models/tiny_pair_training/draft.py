"""The EAGLE-3 draft: its modules, rope, training-time-test logits and targets, draft training."""

from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaForCausalLM

from tiny_pair_training.scale import AUX_LAYER_IDS, PAD, RMS_EPS, ROPE_THETA, Scale
from tiny_pair_training.target import (autocast, make_optimizer, round_to_bf16, scheduled_steps,
                                       target_features)

logger = logging.getLogger("train_tiny_pair")


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
