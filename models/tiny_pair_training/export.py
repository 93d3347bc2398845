"""Saving both models in the layout sglang loads, packing, and the checks of the saved folders."""

from __future__ import annotations

import copy
import json
import logging
import shutil
import tarfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM,
                          PreTrainedTokenizerFast)

from tiny_pair_training.draft import Eagle3Draft
from tiny_pair_training.evaluation import EvalPrompt
from tiny_pair_training.scale import (AUX_LAYER_IDS, BOS, EOS, MAX_POSITIONS, MAX_WEIGHT_BYTES,
                                      PAD, RMS_EPS, ROPE_THETA, Scale)

logger = logging.getLogger("train_tiny_pair")


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
