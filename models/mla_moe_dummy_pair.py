#!/usr/bin/env python3
"""Write a small DeepSeek-V3-shaped target (MLA attention, routed + shared MoE experts) and an
EAGLE-3 draft config for it, to serve with dummy weights (``--load-format dummy``).

The shapes keep what MLA kernels specialise on (KV LoRA rank 512, RoPE head dim 64) and what
makes the model a DeepSeek-V3 MoE (sigmoid routing with group-limited top-k, a shared expert,
a first dense layer), at 8 layers of width 2048 so that it loads in seconds. The tokenizer
files are copied from another model folder (the GPU tests' 8B-shaped Llama one); prompts must use ids
below that tokenizer's size.

    python models/mla_moe_dummy_pair.py --out <folder> --tokenizer-from <model folder>

writes ``<folder>/dsv3-small`` and ``<folder>/eagle3-dsv3-small``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Dict, Tuple

TARGET_NAME = "dsv3-small"
DRAFT_NAME = "eagle3-dsv3-small"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
HIDDEN_SIZE = 2048
VOCAB_SIZE = 32000

_COMMON = {
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 8192,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

TARGET_CONFIG: Dict = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": HIDDEN_SIZE,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1024,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": 768,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "n_routed_experts": 16,
    "num_experts_per_tok": 4,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 4,
    "topk_group": 2,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    **_COMMON,
}

DRAFT_CONFIG: Dict = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": HIDDEN_SIZE,
    "intermediate_size": 5632,
    "num_hidden_layers": 1,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "draft_vocab_size": VOCAB_SIZE,
    "target_hidden_size": HIDDEN_SIZE,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    **_COMMON,
}


def _write_model(folder: Path, config: Dict, tokenizer_from: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_from / name, folder / name)
    return folder


def write_pair(out: Path, tokenizer_from: Path) -> Tuple[Path, Path]:
    """(target folder, draft folder), written under ``out``."""
    missing = [name for name in TOKENIZER_FILES if not (tokenizer_from / name).exists()]
    if missing:
        raise FileNotFoundError(f"--tokenizer-from {tokenizer_from} lacks {', '.join(missing)}")
    return (
        _write_model(out / TARGET_NAME, TARGET_CONFIG, tokenizer_from),
        _write_model(out / DRAFT_NAME, DRAFT_CONFIG, tokenizer_from),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write both models into")
    parser.add_argument("--tokenizer-from", type=Path, required=True,
                        help="model folder whose tokenizer files are copied")
    args = parser.parse_args()
    for folder in write_pair(args.out, args.tokenizer_from):
        print(folder)


if __name__ == "__main__":
    main()
