"""Compile at start-up the JIT kernel variants that sglang would compile under traffic.

sglang writes each request's KV slots into its request-to-token table with the triton kernel
``assign_req_to_token_pool`` (``mem_cache.allocation``). The kernel takes the next power of two
of its request count as a compile-time constant, and triton compiles one variant per
(power of two, argument dtypes, whether each pointer is 16-byte aligned). Two callers meet them
under traffic:

* a speculative decode step that allocates (``alloc_for_spec_decode``, every request of the
  batch, lengths in int32);
* a prefill (``alloc_for_extend``, the requests it admits, lengths in int64).

The KV slots come from a view into the allocator's free list (int64), so half the calls see an
8-byte-aligned, not 16-byte-aligned, slot pointer. Each variant met for the first time compiles
on the host while the GPU waits. Measured (H100, triton, Poisson 10 req/s, 2026-12-06): every
decode step of 77-127 ms in the run (six) began as triton wrote one of these variants to its
cache; a first token that arrives behind one waits that long more. Compiling every variant
once at start-up (empty ranges: the kernel writes nothing) moves that wait out of serving; with
triton's on-disk cache a later start on the same machine only loads them.
"""

from __future__ import annotations

import logging
from typing import Callable, List, Tuple

import torch

logger = logging.getLogger(__name__)

# (dtype of the length tensors, whether the slot pointer is 16-byte aligned), as the two callers
# above pass them.
VARIANTS: Tuple[Tuple[torch.dtype, bool], ...] = (
    (torch.int32, True), (torch.int32, False), (torch.int64, True), (torch.int64, False))


def powers_of_two_up_to(limit: int) -> List[int]:
    """1, 2, 4, ... up to the first power of two >= ``limit`` (the largest ``bs_upper`` a call
    with at most ``limit`` requests uses)."""
    sizes = [1]
    while sizes[-1] < limit:
        sizes.append(sizes[-1] * 2)
    return sizes


def warm_request_slot_kernel(req_to_token: torch.Tensor,
                             assign: Callable[..., None]) -> int:
    """Call ``assign`` (sglang's ``assign_req_to_token_pool_func``) once per variant, for every
    power of two up to the request pool (the table has one row more: row 0 is never handed
    out), with start == end (no slot is written). Returns the number of calls."""
    device = req_to_token.device
    slots = torch.zeros(2, dtype=torch.int64, device=device)  # [1:] is 8 bytes off alignment
    calls = 0
    for count in powers_of_two_up_to(max(1, req_to_token.shape[0] - 1)):
        rows = torch.zeros(count, dtype=torch.int64, device=device)
        for dtype, aligned in VARIANTS:
            lengths = torch.zeros(count, dtype=dtype, device=device)
            assign(rows, req_to_token, lengths, lengths, slots[:1] if aligned else slots[1:],
                   count)
            calls += 1
    return calls


def warm_sglang_jit_kernels(model_runner) -> None:
    """Start-up hook: compile the variants above for ``model_runner``'s request table. A failure
    is logged and serving goes on (the kernels then compile on first use, as in sglang)."""
    from sglang.srt.mem_cache import allocation  # registry: engine (assign_req_to_token_pool_func)

    try:
        calls = warm_request_slot_kernel(model_runner.req_to_token_pool.req_to_token,
                                         allocation.assign_req_to_token_pool_func)
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 - a warm-up must not stop the server
        logger.warning("EAGLE3_DYNAMIC: could not pre-compile sglang's request-slot kernel "
                       "(%s); its first calls at each new batch size will compile while "
                       "serving.", error)
        return
    logger.info("EAGLE3_DYNAMIC: pre-compiled %d variants of sglang's request-slot kernel.",
                calls)
