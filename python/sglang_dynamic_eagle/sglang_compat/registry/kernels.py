"""What the plugin relies on in sglang 0.5.17's attention kernels (part of ``registry.RELIANCES``)."""

from __future__ import annotations

from typing import Tuple

from sglang_dynamic_eagle.sglang_compat.registry.reliance import ATTRIBUTE_SWAP, HOOK, UpstreamReliance

KERNEL_RELIANCES: Tuple[UpstreamReliance, ...] = (
    UpstreamReliance(
        target="sglang.srt.layers.attention.triton_backend.TritonAttnBackend.__init__",
        how="HookRegistry AFTER hook (triton_verify.after_backend_init): unless "
        "SGLANG_DYNAMIC_EAGLE_SPLITKV_VERIFY=0, on an EAGLE3_DYNAMIC server with a chain and "
        "decode-phase CUDA graphs, sets the target's backend's use_verify_splitkv and wraps its "
        "verify_splitkv_fwd (triton_verify.capped), before any graph is captured; it reads the "
        "backend's topk, use_mla, enable_deterministic, dcp_size and token_to_kv_pool's "
        "kv_cache_layout, and the model runner's kv_cache_dtype, to leave where it was not run",
        why="sglang runs a verify's attention on triton with its prefill kernel, which walks each "
        "request's prefix serially; its split-KV verify kernel did the same work 2.4-4.7x faster "
        "from 19 requests up on an H100 (2026-12-07), but sglang enables it on AMD gfx95 only; "
        "in a server it took an overload's throughput to 1.15x plain's (acceptance 3.0)",
        drop_when="sglang enables the split-KV verify kernel on NVIDIA",
        kind=HOOK,
        code=("sglang.srt.layers.attention.triton_backend.TritonAttnBackend.__init__",
              "sglang.kernels.ops.attention.verify_splitkv.verify_splitkv_fwd"),
        patched_by=("sglang_dynamic_eagle.sglang_compat.triton_verify.after_backend_init",),
    ),
    UpstreamReliance(
        target="sglang.kernels.ops.attention.verify_splitkv.VerifySplitKV._alloc",
        how="HookRegistry AFTER hook (triton_verify.zero_new_partials): the split-KV kernel's "
        "fp32 partial outputs are zeroed once when allocated (torch.empty upstream)",
        why="the kernel's second stage weighs every split's partial, those of splits without keys "
        "by zero, and reads partials the first stage never wrote (a request of fewer than 512 keys "
        "leaves some of its 16 splits empty); zero times a NaN or an infinity left in that memory is NaN",
        drop_when="sglang zeroes the partials or skips splits without keys",
        kind=HOOK,
        code=("sglang.kernels.ops.attention.verify_splitkv.VerifySplitKV._alloc",),
        patched_by=("sglang_dynamic_eagle.sglang_compat.triton_verify.zero_new_partials",),
    ),
    UpstreamReliance(
        target="TritonAttnBackend.use_verify_splitkv / verify_splitkv_fwd of each triton backend",
        how="set after the backend's __init__; verify_splitkv_fwd is called with max_bs set to the "
        "largest speculative graph's batch and declines a larger batch, which then takes "
        "extend_attention_fwd",
        why="forward_extend takes the split-KV path on a target verify when use_verify_splitkv is "
        "set and verify_splitkv_fwd returns True; the kernel sizes its fp32 partials by max_bs "
        "(sglang passes the request pool's size, about 1 MiB a request at Llama-8B's shape) and "
        "reallocates them for a larger call, which would leave captured graphs on freed memory",
        drop_when="sglang enables the kernel on NVIDIA and sizes its partials by the graphs",
        kind=ATTRIBUTE_SWAP,
        code=("sglang.srt.layers.attention.triton_backend.TritonAttnBackend.forward_extend",
              "sglang.kernels.ops.attention.verify_splitkv.VerifySplitKV.grow_buffers"),
        patched_by=("sglang_dynamic_eagle.sglang_compat.triton_verify.after_backend_init",),
    ),
)
