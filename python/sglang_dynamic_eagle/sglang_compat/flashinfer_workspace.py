"""flashinfer's float workspace, sized for the verify graphs EAGLE3_DYNAMIC captures.

sglang gives flashinfer attention one float workspace of ``SGLANG_FLASHINFER_WORKSPACE_SIZE``
bytes (384 MiB), enough for stock EAGLE, whose running batch stops at 48. EAGLE3_DYNAMIC captures
its target-verify and draft-extend graphs up to the largest decode graph (256 on an H100), and
there flashinfer's prefill plan under a CUDA graph asks for more: the split-KV partial outputs
of a worst-case layout (one request holding all of the batch's query rows), in tiles of 128 rows,

    bytes = H_q * tiles * 128 * (d + 1) * 4,   tiles = ceil(B * D * g / 128) + B - 1

(flashinfer 0.6, ``PrefillSplitQOKVIndptr`` / ``PrefillPlan`` in ``attention/scheduler.cuh``;
``H_q`` query heads per rank, ``d`` head size, ``B`` graph batch, ``D`` draft tokens per request,
``g`` query heads per KV head). On an H100, Llama-8B shape, B 256, D 4 the server stopped at
start-up asking for 601,882,624 bytes of partial outputs with 402,653,184 available (2026-12-05):
the formula's number. This module raises the workspace to what the largest verify graph needs
when the user has not set it, and otherwise lowers the largest speculative graph to what the
workspace holds, saying so.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Iterator, Optional

from sglang_dynamic_eagle.policy import ALGORITHM_NAME

logger = logging.getLogger(__name__)

ENV = "SGLANG_FLASHINFER_WORKSPACE_SIZE"
SGLANG_DEFAULT_BYTES = 384 * 1024 * 1024  # sglang.srt.environ.Envs' default
# FlashInferAttnBackend.__init__ sets the workspace to 512 MiB for these architectures, over any
# value in the environment (sglang 0.5.17).
SGLANG_FORCED_BYTES = 512 * 1024 * 1024
SGLANG_FORCED_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "MiMoForCausalLM",
                               "Qwen3VLForConditionalGeneration",
                               "Qwen3VLMoeForConditionalGeneration")
ROWS_PER_TILE = 128  # the query tile flashinfer plans a CUDA-graph prefill with (worst case)
# The plan pads to at least 2 * SMs / KV heads work units; 160 SMs covers Hopper (132) and B200.
MAX_SMS = 160
# The other plans in the same buffer (decode, draft) and the 16-byte alignment of each part.
HEADROOM_BYTES = 16 * 1024 * 1024
MIB = 1024 * 1024


def verify_plan_bytes(batch: int, draft_tokens: int, q_heads: int, kv_heads: int,
                      head_dim: int) -> int:
    """Float workspace flashinfer's prefill plan takes for a verify graph of ``batch`` requests."""
    rows = batch * draft_tokens * (q_heads // max(1, kv_heads))
    tiles = max(-(-rows // ROWS_PER_TILE) + batch - 1, 2 * MAX_SMS // max(1, kv_heads))
    return q_heads * tiles * ROWS_PER_TILE * (head_dim + 1) * 4


def largest_batch_within(workspace: int, draft_tokens: int, q_heads: int, kv_heads: int,
                         head_dim: int, batch_limit: int) -> int:
    """The largest batch (<= ``batch_limit``) whose verify plan fits ``workspace`` bytes."""
    batch = batch_limit
    while batch > 1 and verify_plan_bytes(batch, draft_tokens, q_heads, kv_heads,
                                          head_dim) + HEADROOM_BYTES > workspace:
        batch -= 1
    return batch


def uses_flashinfer(server_args) -> bool:
    """Whether any attention of the target or the draft runs on flashinfer, as sglang resolves
    it (its own choice of backend is written to ``server_args`` only after the speculative
    handling; the resolved view has it)."""
    from sglang_dynamic_eagle.sglang_compat.unsupported import resolved

    view = resolved(server_args)
    return "flashinfer" in {getattr(view, name, None) for name in (
        "attention_backend", "prefill_attention_backend", "decode_attention_backend",
        "speculative_draft_attention_backend")}


def size_workspace(server_args, spec_max_bs: int) -> Optional[int]:
    """Raise the workspace for ``spec_max_bs`` or return the smaller batch it holds.

    Returns None when the speculative graphs fit (or flashinfer is not used), else the largest
    batch that fits the workspace the user set (or sglang forces for the model).
    """
    if (not uses_flashinfer(server_args) or spec_max_bs <= 0
            or getattr(server_args, "enable_deterministic_inference", False)):  # sglang: 2 GiB
        return None
    model_config = server_args.get_model_config()  # sglang's own, built before this point
    if getattr(getattr(model_config, "attention_arch", None), "name", "") == "MLA":
        return None  # flashinfer's MLA backend plans otherwise
    tp = max(1, int(getattr(server_args, "tp_size", 1) or 1))
    q_heads = max(1, model_config.num_attention_heads // tp)
    kv_heads = max(1, model_config.get_num_kv_heads(tp))
    shape = (int(server_args.speculative_num_draft_tokens), q_heads, kv_heads,
             int(model_config.head_dim))
    need = verify_plan_bytes(spec_max_bs, *shape) + HEADROOM_BYTES
    architectures = getattr(model_config.hf_config, "architectures", None) or ()
    if any(arch in SGLANG_FORCED_ARCHITECTURES for arch in architectures):
        available, source = SGLANG_FORCED_BYTES, "sglang's fixed size for this model"
    elif ENV in os.environ:
        available, source = int(os.environ[ENV]), f"{ENV}={os.environ[ENV]}"
    else:
        size = max(SGLANG_DEFAULT_BYTES, -(-need // MIB) * MIB)
        if size > SGLANG_DEFAULT_BYTES:
            os.environ[ENV] = str(size)
            logger.info("%s: flashinfer workspace raised to %d MiB (%s) for verify graphs up to "
                        "batch %d.", ALGORITHM_NAME, size // MIB, ENV, spec_max_bs)
        return None
    if need <= available:
        return None
    batch = largest_batch_within(available, *shape, batch_limit=spec_max_bs)
    logger.warning("%s: speculative graphs up to batch %d, not %d: flashinfer's workspace (%s) "
                   "holds verify plans up to there; %s=%d would hold batch %d.", ALGORITHM_NAME,
                   batch, spec_max_bs, source, ENV, -(-need // MIB) * MIB, spec_max_bs)
    return batch


@contextmanager
def decode_only_workspace() -> Iterator[None]:
    """sglang's default size while a backend that only decodes (the plain graphs') is built."""
    if int(os.environ.get(ENV, SGLANG_DEFAULT_BYTES)) <= SGLANG_DEFAULT_BYTES:
        yield
        return
    saved = os.environ[ENV]
    os.environ[ENV] = str(SGLANG_DEFAULT_BYTES)
    try:
        yield
    finally:
        os.environ[ENV] = saved
