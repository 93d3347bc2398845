"""Shared CPU fixtures: tiny model folders, plugin loading, a clean flags environment.

Nothing here needs a GPU. ``ServerArgs`` resolves on ``--device cpu`` from a model
folder that holds only ``config.json`` (no weights, no tokenizer are read while the
arguments are resolved), so the fixtures write tiny configs of the same shape family
as the project's 8B Llama target and its EAGLE-3 draft.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

TINY_EAGLE3_DRAFT = {
    **TINY_LLAMA,
    "architectures": ["LlamaForCausalLMEagle3"],
    "num_hidden_layers": 1,
    "draft_vocab_size": 256,
    "target_hidden_size": 64,
}

# A target whose architecture gets sglang's generic EAGLE defaults (3 steps, topk 1,
# 4 draft tokens); for LlamaForCausalLM sglang picks (5 steps, topk 4, 8 tokens).
TINY_QWEN2 = {
    **TINY_LLAMA,
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
}


def _write_model(folder: Path, config: dict) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return str(folder)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("tiny_models")
    return SimpleNamespace(
        llama=_write_model(root / "llama", TINY_LLAMA),
        qwen2=_write_model(root / "qwen2", TINY_QWEN2),
        draft=_write_model(root / "eagle3-draft", TINY_EAGLE3_DRAFT),
    )


@pytest.fixture(scope="session")
def loaded_plugins():
    """Run sglang's plugin loading once; fail (not skip) if EAGLE3_DYNAMIC is missing.

    ``load_plugins()`` logs and swallows exceptions raised by a plugin's register(),
    so the check below is what turns a broken plugin into a test failure.
    """
    from sglang.srt.plugins import load_plugins
    from sglang.srt.speculative.spec_registry import get_spec

    load_plugins()
    spec = get_spec("EAGLE3_DYNAMIC")
    if spec is None:
        pytest.fail(
            "EAGLE3_DYNAMIC is not registered after sglang.srt.plugins.load_plugins(): "
            "is the project installed (entry point sglang.srt.plugins/dynamic_eagle), "
            "is SGLANG_PLUGINS restricting plugins, or did register() raise (see log)?"
        )
    return spec


@pytest.fixture
def clean_flags_env(monkeypatch):
    """Start without SGLANG_DYNAMIC_EAGLE_FLAGS and restore the caller's value afterwards.

    The ``from_cli_args`` hook writes ``os.environ`` directly; setting and then deleting
    through monkeypatch records the original state, so whatever a test (or the hook)
    leaves behind is undone at teardown.
    """
    from sglang_dynamic_eagle import config
    from sglang_dynamic_eagle.sglang_compat import launcher

    for name in [config.ENV_VAR] + [spec.name for spec in config.ENVIRONMENT]:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(launcher, "_last_exported", None)
    yield monkeypatch


@pytest.fixture(scope="session")
def prepare(loaded_plugins, tiny_models):
    """``prepare(*argv, model=...)``: sglang's CLI parsing + ServerArgs resolution on CPU."""
    from sglang.srt.server_args import prepare_server_args

    def _prepare(*argv: str, model: str = "llama"):
        return prepare_server_args(
            ["--model-path", getattr(tiny_models, model), "--device", "cpu", *argv]
        )

    return _prepare
