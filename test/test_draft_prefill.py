"""The last-position draft layer against sglang's own EAGLE-3 layer, on CPU.

The layer is built from sglang's class with small stand-ins for attention (a fixed linear map,
so that every row's attention output depends on that row alone, as the K/V do) and MLP;
sglang's forward and ours run on the same inputs and must agree on the rows that are read.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import List, Optional

import pytest
import torch
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.models import llama, llama_eagle3

from sglang_dynamic_eagle import draft_prefill
from sglang_dynamic_eagle.draft_prefill import (
    DraftPrefillChoice,
    DRAFT_PREFILL_ENV,
    LastPositionDraftLayer,
    draft_prefill_choice,
    last_rows,
    project_q_at_rows,
    splits_q_projection,
    swap_reason,
    use_last_position_mlp,
)

WIDTH = 16


class StandInQKV(torch.nn.Module):
    """sglang's unquantized qkv projection on CPU: weight rows [q; k; v], no bias."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3 * WIDTH, 2 * WIDTH) / 4, requires_grad=False)
        self.bias = None
        self.quant_method = UnquantizedLinearMethod()

    def forward(self, x):
        return self.quant_method.apply(self, x, None), None


def row_rotary(positions, q, k):
    """Stands in for rotary embedding: a position-dependent scaling of each row."""
    scale = 1 + positions.to(q.dtype).unsqueeze(1) / 10
    return q * scale, k / scale


class RowAttention(torch.nn.Module):
    """Stands in for LlamaAttention with its three parts; the attention of a row depends on
    that row alone (as its K/V do), so sglang's layer and ours can be compared row by row."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv_proj = StandInQKV()
        self.q_size = self.kv_size = WIDTH
        self.rotary_emb = row_rotary
        self.out = torch.nn.Linear(WIDTH, WIDTH, bias=False)
        self.rows_attended: List[int] = []
        self.rows_projected: List[int] = []
        self.qkv_attended: List[tuple] = []

    def forward_prepare_native(self, positions, hidden_states):
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, q, k)
        return q, k, v

    def attn(self, q, k, v, forward_batch):
        self.rows_attended.append(q.shape[0])
        self.qkv_attended.append((q, k, v))
        return q * k + v

    def o_proj(self, attended):
        self.rows_projected.append(attended.shape[0])
        return self.out(attended), None

    def forward(self, positions, hidden_states, forward_batch):
        q, k, v = self.forward_prepare_native(positions, hidden_states)
        output, _ = self.o_proj(self.attn(q, k, v, forward_batch))
        return output


class RecordingMlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.down = torch.nn.Linear(3 * WIDTH, WIDTH, bias=False)
        self.rows_seen: List[int] = []

    def forward(self, x):
        self.rows_seen.append(x.shape[0])
        return self.down(torch.nn.functional.silu(self.up(x)))


def sglang_layer() -> llama_eagle3.LlamaDecoderLayer:
    """sglang's layer class with CPU stand-ins for its parallel linear layers."""
    torch.manual_seed(0)
    layer = object.__new__(llama_eagle3.LlamaDecoderLayer)
    torch.nn.Module.__init__(layer)
    layer.is_input_layer = True
    layer.hidden_size = WIDTH
    layer.input_layernorm = RMSNorm(WIDTH)
    layer.hidden_norm = RMSNorm(WIDTH)
    layer.post_attention_layernorm = RMSNorm(WIDTH)
    for norm in (layer.input_layernorm, layer.hidden_norm, layer.post_attention_layernorm):
        norm.weight.data.uniform_(0.5, 1.5)
    layer.self_attn = RowAttention()
    layer.mlp = RecordingMlp()
    return layer


def prefill_batch(extend_lens: List[int], **overrides) -> SimpleNamespace:
    fields = dict(
        forward_mode=ForwardMode.EXTEND,
        capture_hidden_mode=CaptureHiddenMode.LAST,
        return_logprob=False,
        extend_seq_lens=torch.tensor(extend_lens),
        batch_size=len(extend_lens),
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


def run(layer, forward_batch, num_rows: int):
    torch.manual_seed(1)
    embeds = torch.randn(num_rows, WIDTH)
    hidden = torch.randn(num_rows, WIDTH)
    positions = torch.arange(num_rows)
    return layer(positions, embeds, hidden, forward_batch, None)


def as_last_position_layer(layer, split_q: bool = False) -> LastPositionDraftLayer:
    layer.__class__ = LastPositionDraftLayer
    layer.split_q = split_q
    return layer


@pytest.mark.parametrize("split_q", [False, True], ids=["q-everywhere", "q-at-last-rows"])
def test_rows_that_are_read_match_sglangs_layer_and_the_rest_are_zero(split_q) -> None:
    extend_lens = [5, 1, 7]
    num_rows = sum(extend_lens)
    last = [4, 5, 12]
    reference = sglang_layer()
    expected_hidden, expected_residual = run(reference, prefill_batch(extend_lens), num_rows)

    layer = as_last_position_layer(sglang_layer(), split_q)
    hidden, residual = run(layer, prefill_batch(extend_lens), num_rows)

    torch.testing.assert_close(hidden[last], expected_hidden[last], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(residual[last], expected_residual[last], rtol=1e-5, atol=1e-6)
    others = [row for row in range(num_rows) if row not in last]
    assert torch.count_nonzero(hidden[others]) == 0
    assert torch.count_nonzero(residual[others]) == 0
    # Attention (which writes every position's K/V) saw every row; the output projection and
    # the MLP only the last ones.
    assert layer.self_attn.rows_attended == [num_rows]
    assert layer.self_attn.rows_projected == [len(extend_lens)]
    assert layer.mlp.rows_seen == [len(extend_lens)]


def test_with_q_at_the_last_rows_every_rows_k_and_v_are_sglangs() -> None:
    """The K/V written for every position are what sglang's layer writes; Q is sglang's at the
    rows that are read and zero at the others."""
    extend_lens = [5, 1, 7]
    num_rows = sum(extend_lens)
    last = [4, 5, 12]
    reference = sglang_layer()
    run(reference, prefill_batch(extend_lens), num_rows)
    layer = as_last_position_layer(sglang_layer(), split_q=True)
    run(layer, prefill_batch(extend_lens), num_rows)
    (expected_q, expected_k, expected_v), = reference.self_attn.qkv_attended
    (q, k, v), = layer.self_attn.qkv_attended
    torch.testing.assert_close(k, expected_k, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v, expected_v, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(q[last], expected_q[last], rtol=1e-5, atol=1e-6)
    others = [row for row in range(num_rows) if row not in last]
    assert torch.count_nonzero(q[others]) == 0


def test_the_q_split_needs_an_unquantized_projection_without_bias() -> None:
    attention = RowAttention()
    assert splits_q_projection(attention)
    attention.qkv_proj.bias = torch.zeros(3 * WIDTH)
    assert not splits_q_projection(attention)
    quantized = RowAttention()
    quantized.qkv_proj.quant_method = object()
    assert not splits_q_projection(quantized)


def test_project_q_at_rows_of_one_row_per_request_equals_sglangs_projection() -> None:
    attention = RowAttention()
    x = torch.randn(4, 2 * WIDTH)
    positions = torch.arange(4)
    rows = torch.arange(4)
    for got, expected in zip(project_q_at_rows(attention, positions, x, rows),
                             attention.forward_prepare_native(positions, x)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


class MarkEvent:
    """A CUDA event stand-in: whether the GPU has reached it."""

    def __init__(self, done: bool) -> None:
        self.done = done

    def query(self) -> bool:
        return self.done


@pytest.mark.parametrize("target_done, rows_in_mlp", [(True, 7), (False, 2)],
                         ids=["gpu-caught-up", "gpu-behind"])
def test_the_layer_follows_the_gpu_at_the_marked_target_end(target_done, rows_in_mlp) -> None:
    """With the target's extend finished on the GPU, the GPU waits for the host: sglang's layer
    (fewer launches). Still running: the last-position layer (less GPU work). The mark is
    read once: the next forward (a catch-up) has none and takes the last-position layer."""
    extend_lens = [3, 4]
    reference = sglang_layer()
    expected_hidden, _ = run(reference, prefill_batch(extend_lens), 7)
    choice = DraftPrefillChoice()
    layer = as_last_position_layer(sglang_layer())
    layer.choice = choice
    choice.mark_target_end(MarkEvent(target_done))
    hidden, _ = run(layer, prefill_batch(extend_lens), 7)
    run(layer, prefill_batch(extend_lens), 7)
    assert layer.mlp.rows_seen == [rows_in_mlp, 2]
    assert (choice.caught_up, choice.behind) == ((1, 0) if target_done else (0, 1))
    if target_done:
        torch.testing.assert_close(hidden, expected_hidden)


def test_with_tensor_parallelism_every_prefill_takes_the_last_position_layer() -> None:
    """Ranks must run the same layer (their all-reduces differ in size between the two), and
    each rank's GPU reaches the mark at its own time: the choice ignores marks."""
    choice = DraftPrefillChoice(follows_gpu=False)
    choice.mark_target_end(MarkEvent(True))
    assert not choice.gpu_caught_up() and (choice.caught_up, choice.behind) == (0, 0)


def test_a_cleared_mark_is_not_read() -> None:
    choice = DraftPrefillChoice()
    choice.mark_target_end(MarkEvent(True))
    choice.clear()
    assert not choice.gpu_caught_up() and (choice.caught_up, choice.behind) == (0, 0)


@pytest.mark.parametrize(
    "overrides",
    [
        {"forward_mode": ForwardMode.DRAFT_EXTEND_V2},
        {"forward_mode": ForwardMode.MIXED},
        {"forward_mode": ForwardMode.TARGET_VERIFY},
        {"capture_hidden_mode": CaptureHiddenMode.FULL},
        {"return_logprob": True},
        {"extend_seq_lens": None},
    ],
    ids=lambda overrides: "-".join(f"{k}={v}" for k, v in overrides.items()),
)
def test_every_other_forward_runs_sglangs_full_layer(overrides) -> None:
    """... without reading a marked target end: the counters count only the prefills that chose."""
    extend_lens = [3, 4]
    reference = sglang_layer()
    expected_hidden, _ = run(reference, prefill_batch(extend_lens, **overrides), 7)
    layer = as_last_position_layer(sglang_layer())
    layer.choice = DraftPrefillChoice()
    layer.choice.mark_target_end(MarkEvent(True))
    hidden, _ = run(layer, prefill_batch(extend_lens, **overrides), 7)
    torch.testing.assert_close(hidden, expected_hidden)
    assert layer.mlp.rows_seen == [7]
    assert (layer.choice.caught_up, layer.choice.behind) == (0, 0)


def test_one_row_per_request_graph_capture_and_compilation_keep_the_full_layer(monkeypatch) -> None:
    assert last_rows(prefill_batch([1, 1, 1]), torch.zeros(3, WIDTH)) is None
    assert last_rows(prefill_batch([4, 2]), torch.zeros(6, WIDTH)).tolist() == [3, 5]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert last_rows(prefill_batch([4, 2]), torch.zeros(6, WIDTH)) is None
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    capturing = SimpleNamespace(shape=(6, WIDTH), is_cuda=True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert last_rows(prefill_batch([4, 2]), capturing) is None


def sglangs_attention() -> llama.LlamaAttention:
    attention = object.__new__(llama.LlamaAttention)
    torch.nn.Module.__init__(attention)
    attention.qkv_proj = StandInQKV()
    return attention


def fake_draft_model(num_layers: int = 1, model_class=llama_eagle3.LlamaForCausalLMEagle3):
    """A draft model of sglang's classes (no weights), as swap_reason sees it."""
    model = object.__new__(model_class)
    torch.nn.Module.__init__(model)
    layers = [sglang_layer() for _ in range(num_layers)]
    for layer in layers:
        layer.self_attn = sglangs_attention()
    model.model = SimpleNamespace(layers=layers)
    return model


def test_the_swap_applies_to_one_layer_llama_eagle3_drafts_only(monkeypatch) -> None:
    monkeypatch.delenv(DRAFT_PREFILL_ENV, raising=False)
    model = fake_draft_model()
    assert swap_reason(model) is None
    assert use_last_position_mlp(model, DraftPrefillChoice())
    assert type(model.model.layers[0]) is LastPositionDraftLayer
    assert model.model.layers[0].split_q

    assert swap_reason(fake_draft_model(num_layers=2)) == "2-layer draft"

    class OtherDraft(llama_eagle3.LlamaForCausalLMEagle3):
        pass

    other = fake_draft_model(model_class=OtherDraft)
    assert swap_reason(other) == "draft architecture OtherDraft"
    assert not use_last_position_mlp(other, DraftPrefillChoice())
    assert type(other.model.layers[0]) is llama_eagle3.LlamaDecoderLayer


def test_another_attention_keeps_sglangs_path() -> None:
    model = fake_draft_model()
    model.model.layers[0].self_attn = RowAttention()
    assert swap_reason(model) == "draft attention RowAttention"


def test_a_changed_upstream_layer_keeps_sglangs_path(monkeypatch) -> None:
    monkeypatch.setattr(draft_prefill, "UPSTREAM_LAYER_FINGERPRINT", "0" * 16)
    reason: Optional[str] = swap_reason(fake_draft_model())
    assert reason is not None and reason.startswith("sglang's EAGLE-3 layer code changed")


def test_the_pinned_sglang_layer_is_the_one_restated() -> None:
    assert draft_prefill.upstream_layer_fingerprint() == draft_prefill.UPSTREAM_LAYER_FINGERPRINT


def test_the_environment_chooses_sglangs_full_layer(monkeypatch) -> None:
    monkeypatch.setenv(DRAFT_PREFILL_ENV, "full")
    model = fake_draft_model()
    assert swap_reason(model) == f"{DRAFT_PREFILL_ENV}=full"
    assert not use_last_position_mlp(model, DraftPrefillChoice())


def test_a_bad_environment_value_names_the_variable_and_the_choices(monkeypatch) -> None:
    monkeypatch.setenv(DRAFT_PREFILL_ENV, "fast")
    with pytest.raises(ValueError) as error:
        draft_prefill_choice()
    message = str(error.value)
    assert DRAFT_PREFILL_ENV in message and "last-position" in message and "full" in message
    assert "\n" not in message
