"""Draft prefill that runs the draft's queries, output projection and MLP only where a proposal is read.

A one-layer EAGLE-3 draft's K/V at a position come from that position's token embedding and
target hidden states alone (the input layer's qkv projection). After a prefill (and after a
draft-KV catch-up, which is the same EXTEND forward) only each request's last position is
read: the logits processor keeps the last row of every request, and so does the LAST hidden
capture that seeds the first draft step. sglang's layer still runs the post-attention norm and
the MLP (about 60% of the layer's matmul work at Llama-8B shapes) over every prompt token.

:class:`LastPositionDraftLayer` runs embedding, norms, the K and V projections and attention
(which writes the K/V of every position) over all rows as sglang does, and the Q projection
(two thirds of the qkv GEMM at EAGLE-3's shapes: 4096 of 6144 outputs for an 8B Llama), the
attention's output projection, the post-attention norm and the MLP over the last row of each
request only; the other rows of Q are zeros (their attention outputs are never read) and so are
the other rows of the layer's output, which nothing reads. The Q split needs an unquantized qkv
projection without bias (sglang's EAGLE-3 layer has none); otherwise Q runs over every row.
Per row the arithmetic is sglang's; a GEMM over fewer rows may round differently in the last
bit, which can change a draft proposal (acceptance), never an output token (the target
verifies every one).

It applies to EXTEND forwards that capture LAST hidden states without logprobs, outside CUDA
graph capture (a captured graph has fixed shapes; prefills that replay a prefill graph keep
sglang's full layer). It removes GPU work and adds about ten small launches (host work), so a
prefill takes it only while the GPU is behind the host (:class:`DraftPrefillChoice`): when the
GPU has already finished the target's extend by the time the draft's layer is launched, the GPU
is waiting for the host's launches (a lone short prompt: one H200, 512 tokens, 2026-12-03, the
last-position layer's launch took 2.8 ms of host time against 2.2 ms for sglang's), and sglang's
layer, with fewer launches, delivers the first token sooner. Drafts of another architecture or
with more than one layer keep sglang's path. The swap is refused, with one log line, when
sglang's layer code is not the code this was written against (``UPSTREAM_LAYER_FINGERPRINT``).
``SGLANG_DYNAMIC_EAGLE_DRAFT_PREFILL=full`` keeps sglang's layer (for comparison, or should a
draft misbehave).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
from types import SimpleNamespace
from typing import Optional, Tuple

import torch
from sglang.srt.layers import linear
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.models import llama, llama_eagle3

from sglang_dynamic_eagle.startup_errors import StartupError

logger = logging.getLogger(__name__)

# sha256 (first 16 hex digits) of the source of FINGERPRINTED in sglang 0.5.17.
UPSTREAM_LAYER_FINGERPRINT = "967b2dad38cc88ec"
DRAFT_PREFILL_ENV = "SGLANG_DYNAMIC_EAGLE_DRAFT_PREFILL"
LAST_POSITION = "last-position"
FULL = "full"


def draft_prefill_choice() -> str:
    """The environment's choice (checked at server start-up)."""
    choice = os.environ.get(DRAFT_PREFILL_ENV, LAST_POSITION)
    if choice not in (LAST_POSITION, FULL):
        raise StartupError(
            f"{DRAFT_PREFILL_ENV}={choice!r} is invalid: set it to {LAST_POSITION} (the "
            "default: the draft's output projection and MLP only where a proposal is read) or "
            f"{FULL} (sglang's layer over every prompt token), or unset it."
        )
    return choice


# What the swap's correctness rests on: the layer and attention forwards it restates, the model
# forward around the layer (final norm, which output the LAST capture takes), the logits
# processor's choice of the rows it reads, and the qkv projection it splits (its forward, its
# [q; k; v] weight layout, its unquantized GEMM).
FINGERPRINTED = (
    llama_eagle3.LlamaDecoderLayer.forward,
    llama_eagle3.LlamaModel.forward,
    llama.LlamaAttention.forward,
    llama.LlamaAttention.forward_prepare_native,
    LogitsProcessor._get_pruned_states,
    linear.ColumnParallelLinear.forward,
    linear.QKVParallelLinear.weight_loader,
    UnquantizedLinearMethod.apply,
)


def upstream_layer_fingerprint() -> str:
    source = "".join(inspect.getsource(function) for function in FINGERPRINTED)
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def last_rows(forward_batch: ForwardBatch, hidden_states: torch.Tensor) -> Optional[torch.Tensor]:
    """Row index of every request's last extended position, or None where the full layer
    must run (not a plain EXTEND, hidden capture other than LAST, logprobs, CUDA graph capture
    or torch.compile tracing, where shapes are fixed, or nothing to skip)."""
    if torch.compiler.is_compiling():
        return None
    if forward_batch.forward_mode != ForwardMode.EXTEND:
        return None
    if not forward_batch.capture_hidden_mode.is_last() or forward_batch.return_logprob:
        return None
    if forward_batch.extend_seq_lens is None or hidden_states.shape[0] <= forward_batch.batch_size:
        return None
    if hidden_states.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    return torch.cumsum(forward_batch.extend_seq_lens, dim=0) - 1


def _rows_into_zeros(values: torch.Tensor, rows: torch.Tensor, num_rows: int) -> torch.Tensor:
    full = values.new_zeros((num_rows, values.shape[-1]))
    full[rows] = values
    return full


def splits_q_projection(attention: torch.nn.Module) -> bool:
    """Whether the qkv projection can run as a Q GEMM and a K/V GEMM on its own weight rows."""
    qkv = attention.qkv_proj
    return (
        type(qkv.quant_method) is UnquantizedLinearMethod
        and qkv.bias is None
        and not getattr(qkv, "gather_output", False)
    )


def _output_rows(qkv: torch.nn.Module, x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """sglang's GEMM of ``qkv`` computing only its output features ``start:stop``."""
    return qkv.quant_method.apply(SimpleNamespace(weight=qkv.weight[start:stop]), x, None)


def project_q_at_rows(
    attention: torch.nn.Module, positions: torch.Tensor, x: torch.Tensor, rows: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``forward_prepare_native`` with Q computed at ``rows`` only (zeros elsewhere)."""
    q_size, kv_size = attention.q_size, attention.kv_size
    qkv = attention.qkv_proj
    k, v = _output_rows(qkv, x, q_size, q_size + 2 * kv_size).split([kv_size, kv_size], dim=-1)
    q = x.new_zeros((x.shape[0], q_size))
    q[rows] = _output_rows(qkv, x[rows], 0, q_size)
    q, k = attention.rotary_emb(positions, q, k)
    return q, k, v


class DraftPrefillChoice:
    """Which draft layer a prefill's draft extend runs, from whether the GPU has caught up with
    the host: the worker marks the end of the target's extend (a CUDA event), the layer reads
    the mark once, without waiting. A forward without a mark (the draft-KV catch-up) takes the
    last-position layer.

    ``follows_gpu=False`` (tensor parallelism) ignores every mark: each rank's GPU reaches it at
    its own time, and ranks that ran different layers would all-reduce tensors of different
    sizes (the last-position layer's output projection and MLP run over one row per request)."""

    def __init__(self, follows_gpu: bool = True) -> None:
        self._follows_gpu = follows_gpu
        self._target_end: Optional[torch.cuda.Event] = None
        self.caught_up = 0  # marked prefills that found the GPU caught up (sglang's layer)
        self.behind = 0  # and those that found it behind (the last-position layer)

    def mark_target_end(self, event: torch.cuda.Event) -> None:
        if self._follows_gpu:
            self._target_end = event

    def clear(self) -> None:
        """After the prefill: a draft extend that replayed a prefill CUDA graph never read its
        mark, and the next catch-up must not."""
        self._target_end = None

    def gpu_caught_up(self) -> bool:
        """Whether the marked target extend has finished on the GPU (clears the mark)."""
        event, self._target_end = self._target_end, None
        if event is None:
            return False
        if event.query():
            self.caught_up += 1
            return True
        self.behind += 1
        return False


class LastPositionDraftLayer(llama_eagle3.LlamaDecoderLayer):
    """sglang's EAGLE-3 input layer with Q, the output projection and the MLP restricted to
    the rows that are read, while the GPU is behind the host."""

    split_q: bool = False  # set by use_last_position_mlp
    choice: Optional[DraftPrefillChoice] = None  # set by use_last_position_mlp

    def forward(
        self,
        positions: torch.Tensor,
        embeds: torch.Tensor,
        hidden_states: torch.Tensor,
        forward_batch: ForwardBatch,
        residual: Optional[torch.Tensor],
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        rows = last_rows(forward_batch, hidden_states) if self.is_input_layer else None
        if rows is None or (self.choice is not None and self.choice.gpu_caught_up()):
            return super().forward(positions, embeds, hidden_states, forward_batch, residual)
        residual = hidden_states
        attention_input = torch.cat(
            [self.input_layernorm(embeds), self.hidden_norm(hidden_states)], dim=-1
        )
        # sglang's LlamaAttention.forward for an extend, with Q and o_proj on the rows read only.
        attention = self.self_attn
        if self.split_q:
            q, k, v = project_q_at_rows(attention, positions, attention_input, rows)
        else:
            q, k, v = attention.forward_prepare_native(
                positions=positions, hidden_states=attention_input)
        attended = attention.attn(q, k, v, forward_batch)  # writes every position's K/V
        attention_output, _ = attention.o_proj(attended[rows])
        last_hidden, last_residual = self.post_attention_layernorm(attention_output, residual[rows])
        num_rows = hidden_states.shape[0]
        return (
            _rows_into_zeros(self.mlp(last_hidden), rows, num_rows),
            _rows_into_zeros(last_residual, rows, num_rows),
        )


def swap_reason(draft_model: torch.nn.Module) -> Optional[str]:
    """Why the draft keeps sglang's layer (None: the swap applies)."""
    if draft_prefill_choice() == FULL:
        return f"{DRAFT_PREFILL_ENV}={FULL}"
    if type(draft_model) is not llama_eagle3.LlamaForCausalLMEagle3:
        return f"draft architecture {type(draft_model).__name__}"
    layers = draft_model.model.layers
    if len(layers) != 1 or type(layers[0]) is not llama_eagle3.LlamaDecoderLayer:
        return f"{len(layers)}-layer draft"
    if type(layers[0].self_attn) is not llama.LlamaAttention:
        return f"draft attention {type(layers[0].self_attn).__name__}"
    fingerprint = upstream_layer_fingerprint()
    if fingerprint != UPSTREAM_LAYER_FINGERPRINT:
        return f"sglang's EAGLE-3 layer code changed (fingerprint {fingerprint})"
    return None


def use_last_position_mlp(draft_model: torch.nn.Module, choice: DraftPrefillChoice) -> bool:
    """Swap the draft's layer for :class:`LastPositionDraftLayer` where it applies; ``choice``
    decides per prefill."""
    reason = swap_reason(draft_model)
    if reason is not None:
        logger.info("EAGLE3_DYNAMIC: draft prefill runs sglang's full layer (%s).", reason)
        return False
    layer = draft_model.model.layers[0]
    layer.__class__ = LastPositionDraftLayer
    layer.split_q = splits_q_projection(layer.self_attn)
    layer.choice = choice
    logger.info("EAGLE3_DYNAMIC: draft prefill runs the draft's %soutput projection and MLP at "
                "each request's last position only while the GPU is behind the host.",
                "queries, " if layer.split_q else "")
    return True
