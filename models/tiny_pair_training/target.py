"""The target: its config, the training helpers both trainings share, target training,
the features the draft reads, and greedy generation."""

from __future__ import annotations

import logging
import math
import time
from typing import Iterator

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from tiny_pair_training.scale import (AUX_LAYER_IDS, BOS, EOS, MAX_POSITIONS, PAD, RMS_EPS,
                                      ROPE_THETA, Scale)

logger = logging.getLogger("train_tiny_pair")


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
