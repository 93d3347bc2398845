"""A verify's attention on triton through sglang's split-KV kernel (on by default for chains).

sglang 0.5.17's triton backend runs a speculative verify's attention with its prefill kernel
(``extend_attention_fwd``), which walks each request's prefix serially per (request, head). It
also ships a split-KV verify kernel (``verify_splitkv_fwd``: the prefix split across programs as
its decode kernel does, for a chain, topk 1), but enables it on AMD gfx95 only. On an H100, on
8B-shaped verify shapes, the split kernel did the same work 2.4x faster at 19 requests of 800
tokens and 3.3-4.7x faster from 32 requests or 4,000 tokens up, its outputs within one bf16
step of the prefill kernel's (``benchmark/results/2026-12-07-h100-triton-verify-attention-kernels``).
That growth is most of what a triton speculative step adds per request, so it sets where
speculation stops paying there and how long an arrival waits behind a speculative step. In a
server (H100, 8B-shaped pair, Poisson traffic) TTFT p99 at 55% load read 1.07x plain's at
acceptance 3.0 (1.42x on the prefill kernel, a separate run) and throughput at an overload 1.15x
at acceptance 3.0 (0.98x at 1.6), with no token changed on the tiny pair in float32
(``benchmark/results/2026-12-07-h100-dummy8b-triton-splitkv-verify-in-server``).

An EAGLE3_DYNAMIC server's triton backends take it for chains unless
``SGLANG_DYNAMIC_EAGLE_SPLITKV_VERIFY=0``: :func:`after_backend_init` (an AFTER hook on
``TritonAttnBackend.__init__``, so before any graph is captured) sets the backend's
``use_verify_splitkv`` and caps the kernel's batch. The kernel keeps fp32 partials for
``max_bs`` requests (32 heads x 16 splits x 4 rows x 128: 1 MiB a request at Llama-8B's shape) and reallocates them when a later call is larger, which a captured
graph would not survive; sglang passes its request pool's size (thousands of requests here, with
no cap of 48). :func:`capped` passes the largest speculative graph's batch instead, and a larger
batch (an eager verify) takes the prefill kernel. Its second stage weighs every split's partial
output, those of splits that had no keys by zero, so a partial never written must not hold a NaN
or an infinity (zero times either is NaN): :func:`zero_new_partials` (an AFTER hook on the scratch's
allocation, ``VerifySplitKV._alloc``) zeroes them once; what the kernel writes later is finite.
Only the target's backend takes it (the draft's never verify), only with the decode phase's
CUDA graphs on, and only where it was run (:func:`left_on_the_prefill_kernel`). One hazard is
left: the kernel rewrites only the partials of splits that hold keys, so a NaN or an infinity
one request's attention wrote (NaN activations) stays in its row until a later request there
writes that split, and a shorter request in that row reads it as 0 x NaN; closing it needs a
change to the kernel, and the prefill kernel has no such path.
"""

from __future__ import annotations

import functools
import logging
from typing import Callable, Optional

import torch
from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend

from sglang_dynamic_eagle.config import SPLITKV_VERIFY_ENV, load_config
from sglang_dynamic_eagle.policy import ALGORITHM_NAME
from sglang_dynamic_eagle.sglang_compat.launcher import selects_algorithm
from sglang_dynamic_eagle.sglang_compat.startup_errors import refused_if_out_of_memory

logger = logging.getLogger(__name__)

QO_INDPTR_ARG = 6  # verify_splitkv_fwd's positional arguments mirror extend_attention_fwd's


def capped(kernel: Callable[..., bool], max_bs: int) -> Callable[..., bool]:
    """``kernel`` with its scratch sized for ``max_bs`` requests; a larger batch declines (False),
    and the backend then runs its prefill kernel. The scratch is allocated at the first call, in
    the warm-up before sglang captures the verify's graphs, from the memory sglang's plan leaves
    to activations: running out there is refused in one line that names the ways out (sglang's
    own message, which this error passes through, names only its flags). Running out later (an
    eager verify whose split count needs another copy) declines instead, logged: the prefill
    kernel serves that verify and the server keeps serving."""
    started = False

    @functools.wraps(kernel)
    def verify(*args, **kwargs) -> bool:
        nonlocal started
        if args[QO_INDPTR_ARG].shape[0] - 1 > max_bs:
            return False
        kwargs["max_bs"] = max_bs
        if started:
            try:
                return kernel(*args, **kwargs)
            except torch.OutOfMemoryError as error:
                logger.warning("%s: out of GPU memory for sglang's split-KV verify scratch; this verify "
                               "takes the prefill kernel (torch: %s)", ALGORITHM_NAME,
                               (str(error).splitlines() or [""])[0][:200])
                return False
        with refused_if_out_of_memory(f"sglang's split-KV verify scratch for {max_bs} requests (about "
                                      "1 MiB a request on an 8B model)",
                                      f"--cuda-graph-max-bs-decode, or set {SPLITKV_VERIFY_ENV}=0 for "
                                      "sglang's prefill kernel"):
            served = kernel(*args, **kwargs)
        started = True
        return served

    return verify


def largest_speculative_graph(server_args) -> Optional[int]:
    """The largest batch of the speculative graphs; None without decode-phase CUDA graphs."""
    graphs = getattr(getattr(server_args, "cuda_graph_config", None), "decode", None)
    sizes = getattr(graphs, "bs", None) or ()
    if (getattr(server_args, "disable_cuda_graph", False) or not sizes
            or getattr(graphs, "backend", None) == Backend.DISABLED
            or check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)):
        return None
    return max(sizes)


def zero_new_partials(result, scratch, *args, **kwargs):
    """AFTER hook on ``VerifySplitKV._alloc``: its partial outputs start at zero (module docstring)."""
    scratch.att_out.zero_()
    return result


RUN_KV_DTYPES = (torch.bfloat16, torch.float32)  # bf16 on the 8B shape, float32 on the tiny pair


def left_on_the_prefill_kernel(backend, model_runner, max_bs: Optional[int]) -> Optional[str]:
    """Why the target's backend keeps sglang's prefill kernel for a verify, or None. The kernel
    was run only on token-major bf16 and float32 KV of a GQA model: an MLA model (its 576-wide
    heads and 128 KiB a head of scratch), a float16 KV cache (where an overflow to infinity is
    likelier, and would stay in the partials, module docstring), a quantised one (its scales) and
    other KV layouts pass sglang's shape checks without having been run, so they stay on the
    kernel sglang chose; deterministic inference and decode context parallelism never reach it."""
    if getattr(backend, "topk", 0) != 1:
        return "a tree (the kernel serves chains only)"
    if max_bs is None:
        return "no speculative CUDA graphs"
    if getattr(backend, "use_mla", False):
        return "an MLA model, where it has not been run"
    if getattr(model_runner, "kv_cache_dtype", torch.bfloat16) not in RUN_KV_DTYPES:
        return "a float16 or quantised KV cache, where it has not been run"
    if getattr(getattr(backend, "token_to_kv_pool", None), "kv_cache_layout", "nhd") != "nhd":
        return "a KV layout other than token-major, where it has not been run"
    if getattr(backend, "enable_deterministic", False) or getattr(backend, "dcp_size", 1) > 1:
        return "deterministic inference or decode context parallelism take their own kernels"
    return None


def after_backend_init(result, backend, model_runner=None, *args, **kwargs):
    """AFTER hook on ``TritonAttnBackend.__init__``: see the module docstring. Other servers'
    backends and the draft's are left as sglang built them, and so is the target's where
    :func:`left_on_the_prefill_kernel` gives a reason (logged)."""
    server_args = getattr(model_runner, "server_args", None)
    if (not selects_algorithm(server_args) or not load_config().splitkv_verify
            or getattr(model_runner, "is_draft_worker", False) or getattr(backend, "skip_prefill", False)):
        return result
    max_bs = largest_speculative_graph(server_args)
    why_not = left_on_the_prefill_kernel(backend, model_runner, max_bs)
    if why_not is not None:
        logger.info("%s: a verify's attention stays on triton's prefill kernel (%s).", ALGORITHM_NAME, why_not)
        return result
    backend.use_verify_splitkv = True
    backend.verify_splitkv_fwd = capped(backend.verify_splitkv_fwd, max_bs)
    logger.info("%s: a verify's attention through sglang's split-KV kernel (up to %d requests).",
                ALGORITHM_NAME, max_bs)
    return result


def report(worker) -> dict:
    """For /server_info: whether the target's attention backend verifies through the split kernel."""
    runner = getattr(getattr(worker, "_target_worker", None), "model_runner", None)
    return {"splitkv_verify": bool(getattr(getattr(runner, "attn_backend", None), "use_verify_splitkv", False))}
