"""The MLA + MoE dummy pair's configs (models/mla_moe_dummy_pair.py): written as the script
says, and resolved by sglang's real argument path on CPU like an EAGLE3 server would be."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "models" / "mla_moe_dummy_pair.py"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("mla_moe")
    tokenizer = root / "tokenizer"
    tokenizer.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tokenizer / name).write_text("{}")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(root / "pair"), "--tokenizer-from", str(tokenizer)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    target, draft = (Path(line) for line in proc.stdout.split())
    return {"target": target, "draft": draft}


def test_the_script_writes_an_mla_moe_target_and_a_matching_draft(pair) -> None:
    target = json.loads((pair["target"] / "config.json").read_text())
    draft = json.loads((pair["draft"] / "config.json").read_text())
    assert target["architectures"] == ["DeepseekV3ForCausalLM"]
    assert target["kv_lora_rank"] == 512 and target["qk_rope_head_dim"] == 64
    assert target["n_routed_experts"] > target["num_experts_per_tok"] > 1
    assert draft["architectures"] == ["LlamaForCausalLMEagle3"]
    assert draft["target_hidden_size"] == target["hidden_size"]
    assert draft["vocab_size"] == target["vocab_size"]
    for folder in pair.values():
        assert (folder / "tokenizer.json").exists() and (folder / "tokenizer_config.json").exists()


def test_a_missing_tokenizer_is_named(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "pair"), "--tokenizer-from", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0 and "lacks tokenizer.json" in proc.stderr


@pytest.mark.usefixtures("clean_flags_env")
def test_sglang_resolves_it_for_eagle3_dynamic_like_eagle3(pair, loaded_plugins) -> None:
    from sglang.srt.server_args import prepare_server_args

    def resolve(algorithm: str):
        return prepare_server_args([
            "--model-path", str(pair["target"]), "--device", "cpu",
            "--speculative-algorithm", algorithm,
            "--speculative-draft-model-path", str(pair["draft"]),
        ])

    def draft_shape(args) -> tuple:
        return (args.speculative_num_steps, args.speculative_eagle_topk,
                args.speculative_num_draft_tokens)

    eagle3, dynamic = resolve("EAGLE3"), resolve("EAGLE3_DYNAMIC")
    assert dynamic.use_mla_backend() and eagle3.use_mla_backend()
    assert draft_shape(dynamic) == draft_shape(eagle3) == (3, 1, 4)
    assert eagle3.max_running_requests == 48 and dynamic.max_running_requests is None
