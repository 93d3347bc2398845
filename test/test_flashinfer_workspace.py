"""flashinfer's workspace at EAGLE3_DYNAMIC's verify graphs (``sglang_compat.flashinfer_workspace``).

The numbers come from a server that stopped in graph capture on an H100 (2026-12-05, Llama-8B
shape, flashinfer attention, verify graphs to batch 256 with 4 draft tokens): "Buffer overflow
when allocating memory for batch_prefill_tmp_v with size 601882624 ... only 402653184 bytes
available"; the same server started with the workspace at 1 GiB.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import List

import pytest

from sglang.srt.model_executor.cuda_graph_config import PhaseConfig

from sglang_dynamic_eagle.sglang_compat import flashinfer_workspace as fw
from sglang_dynamic_eagle.sglang_compat.spec_algo import _limit_speculative_graphs

pytestmark = pytest.mark.usefixtures("clean_flags_env")

LOGGED_TMP_V = 601_882_624  # batch_prefill_tmp_v the server asked for
LOGGED_AVAILABLE = 402_653_184  # sglang's 384 MiB
LLAMA_8B = (32, 8, 128)  # query heads, KV heads, head size
FULL_BS = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 96, 128, 160, 192, 224, 256]


def _model_config(architecture: str = "LlamaForCausalLM") -> SimpleNamespace:
    q_heads, kv_heads, head_dim = LLAMA_8B
    return SimpleNamespace(num_attention_heads=q_heads, head_dim=head_dim,
                           get_num_kv_heads=lambda tp: max(1, kv_heads // tp),
                           hf_config=SimpleNamespace(architectures=[architecture]))


def _server_args(backend: str = "flashinfer", architecture: str = "LlamaForCausalLM",
                 bs: List[int] = FULL_BS) -> SimpleNamespace:
    decode = PhaseConfig(backend="full", bs=list(bs), max_bs=None)
    config = _model_config(architecture)
    return SimpleNamespace(attention_backend=backend, prefill_attention_backend=None,
                           decode_attention_backend=None, tp_size=1,
                           speculative_num_draft_tokens=4,
                           cuda_graph_config=SimpleNamespace(decode=decode),
                           get_model_config=lambda: config)


@pytest.fixture
def no_workspace_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fw.ENV, raising=False)


def test_the_plan_size_is_what_flashinfer_asked_for() -> None:
    size = fw.verify_plan_bytes(256, 4, *LLAMA_8B)
    head_dim = LLAMA_8B[2]
    assert size * head_dim // (head_dim + 1) == LOGGED_TMP_V  # partial outputs; the rest, scores
    assert size > LOGGED_AVAILABLE
    # Stock EAGLE's 48 requests fit sglang's default, as EAGLE3's server did on that machine.
    assert fw.verify_plan_bytes(48, 4, *LLAMA_8B) + fw.HEADROOM_BYTES <= LOGGED_AVAILABLE


def test_an_unset_workspace_is_raised_for_the_largest_verify_graph(no_workspace_env) -> None:
    args = _server_args()
    _limit_speculative_graphs(args)
    size = int(os.environ[fw.ENV])
    assert size >= fw.verify_plan_bytes(256, 4, *LLAMA_8B) + fw.HEADROOM_BYTES
    assert size < 1024 * 1024 * 1024  # the 1 GiB the GPU run used was more than needed
    assert max(args.cuda_graph_config.decode.bs) == 256


def test_other_attention_backends_are_left_alone(no_workspace_env) -> None:
    args = _server_args(backend="fa3")
    _limit_speculative_graphs(args)
    assert fw.ENV not in os.environ
    assert max(args.cuda_graph_config.decode.bs) == 256


def test_a_workspace_the_user_set_caps_the_speculative_graphs(monkeypatch, caplog) -> None:
    monkeypatch.setenv(fw.ENV, str(LOGGED_AVAILABLE))
    args = _server_args()
    _limit_speculative_graphs(args)
    top = max(args.cuda_graph_config.decode.bs)
    assert os.environ[fw.ENV] == str(LOGGED_AVAILABLE)  # the user's value stays
    assert fw.verify_plan_bytes(top, 4, *LLAMA_8B) + fw.HEADROOM_BYTES <= LOGGED_AVAILABLE
    assert fw.verify_plan_bytes(top + 1, 4, *LLAMA_8B) + fw.HEADROOM_BYTES > LOGGED_AVAILABLE
    assert 48 < top < 256
    assert args.cuda_graph_config.decode.max_bs == 256  # plain graphs keep every size
    assert fw.ENV in caplog.text


def test_sglangs_fixed_size_for_qwen_caps_the_speculative_graphs(no_workspace_env) -> None:
    args = _server_args(architecture="Qwen3ForCausalLM")
    _limit_speculative_graphs(args)
    top = max(args.cuda_graph_config.decode.bs)
    assert fw.verify_plan_bytes(top, 4, *LLAMA_8B) + fw.HEADROOM_BYTES <= fw.SGLANG_FORCED_BYTES
    assert top < 256
    assert fw.ENV not in os.environ  # sglang would overwrite it


def test_the_plain_graphs_backend_gets_sglangs_default(monkeypatch) -> None:
    monkeypatch.setenv(fw.ENV, str(700 * fw.MIB))
    with fw.decode_only_workspace():
        assert os.environ[fw.ENV] == str(fw.SGLANG_DEFAULT_BYTES)
    assert os.environ[fw.ENV] == str(700 * fw.MIB)


def test_the_backend_sglang_chose_counts(no_workspace_env, monkeypatch) -> None:
    """sglang writes its own choice of backend to ServerArgs after the speculative handling;
    the resolved view already holds it (here: flashinfer chosen, the field still None)."""
    from sglang_dynamic_eagle.sglang_compat import unsupported

    args = _server_args(backend=None)
    monkeypatch.setattr(unsupported, "resolved",
                        lambda server_args: SimpleNamespace(attention_backend="flashinfer"))
    _limit_speculative_graphs(args)
    assert int(os.environ[fw.ENV]) > fw.SGLANG_DEFAULT_BYTES


@pytest.mark.parametrize("case", ["mla", "deterministic"])
def test_where_sglang_plans_otherwise_nothing_changes(no_workspace_env, case) -> None:
    args = _server_args()
    if case == "mla":  # flashinfer's MLA backend plans its own way
        args.get_model_config().attention_arch = SimpleNamespace(name="MLA")
    else:  # sglang sets 2 GiB and turns split-KV off
        args.enable_deterministic_inference = True
    _limit_speculative_graphs(args)
    assert fw.ENV not in os.environ
    assert max(args.cuda_graph_config.decode.bs) == 256


def test_few_kv_heads_pad_to_the_gpus_work_units() -> None:
    """flashinfer pads a CUDA-graph plan to 2 * SMs / KV heads units at least."""
    assert fw.verify_plan_bytes(16, 4, 64, 1, 128) >= 64 * 2 * 132 * fw.ROWS_PER_TILE * 128 * 4
