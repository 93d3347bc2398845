"""Compile at start-up the JIT kernels that sglang would otherwise compile while serving.

* ``clamp_position`` (``forward_batch_info``): ``ForwardBatch.init_new`` computes DECODE
  positions with it; a speculative server never builds a DECODE batch, so without this the first
  switch to plain mode stalled for the compile (7 s measured on an H200, 2026-11-29).
* ``assign_req_to_token_pool``, below.

A decode step of a speculative server that needs new KV slots writes them into sglang's
request-to-token table with the triton kernel ``assign_req_to_token_pool``
(``mem_cache.allocation``, called by ``alloc_for_spec_decode`` with every request of the batch
and int32 lengths). EAGLE3_DYNAMIC's steps in both modes do (sglang allocates, in
``eagle_prepare_for_decode``, before the worker chooses the mode); a plain server's decode steps
and every prefill write the table with other kernels. The kernel takes the next power of two of the
batch as a compile-time constant, and triton compiles one variant per (power of two, whether
each pointer is 16-byte aligned). With one-token pages the slots are a view into the allocator's
int64 free list, so their pointer is aligned or not from call to call. Each variant met for the
first time compiles on the host while the GPU waits. Measured (H100, triton, Poisson 10 req/s,
2026-12-06): every decode step of 77-127 ms in the run (six) ended as triton finished compiling
one of these variants; a first token that arrives behind one waits that long more. Compiling
every variant once at start-up (empty ranges: the kernel writes nothing) moves that wait out of
serving; with triton's on-disk cache a later start on the same machine only loads them.

Not covered: with pages larger than one token, sglang's paged allocator compiles its own
``alloc_extend_kernel`` per power of two as well.
"""

from __future__ import annotations

import logging
from typing import Callable, List, Tuple

import torch

logger = logging.getLogger(__name__)

# Whether the slot pointer is 16-byte aligned (a view into the int64 free list: either).
ALIGNMENTS: Tuple[bool, ...] = (True, False)
LENGTH_DTYPE = torch.int32  # what alloc_for_spec_decode passes (eagle_prepare_for_decode)


def powers_of_two_up_to(limit: int) -> List[int]:
    """1, 2, 4, ... up to the first power of two >= ``limit`` (the largest ``bs_upper`` a call
    with at most ``limit`` requests uses)."""
    sizes = [1]
    while sizes[-1] < limit:
        sizes.append(sizes[-1] * 2)
    return sizes


def warm_request_slot_kernel(req_to_token: torch.Tensor, max_requests: int,
                             assign: Callable[..., None]) -> int:
    """Call ``assign`` (sglang's ``assign_req_to_token_pool_func``) once per variant, for every
    power of two up to ``max_requests`` (at most the table's rows less one: row 0 is never
    handed out), with start == end (no slot is written). Returns the number of calls."""
    device = req_to_token.device
    slots = torch.zeros(2, dtype=torch.int64, device=device)  # [1:] is 8 bytes off alignment
    calls = 0
    for count in powers_of_two_up_to(max(1, min(max_requests, req_to_token.shape[0] - 1))):
        rows = torch.zeros(count, dtype=torch.int64, device=device)
        lengths = torch.zeros(count, dtype=LENGTH_DTYPE, device=device)
        for aligned in ALIGNMENTS:
            assign(rows, req_to_token, lengths, lengths, slots[:1] if aligned else slots[1:],
                   count)
            calls += 1
    return calls


def warm_sglang_jit_kernels(model_runner, max_requests: int) -> None:
    """Start-up hook: compile the kernels above for ``model_runner`` (the request-slot kernel up
    to ``max_requests``, the running-request cap). A failure is logged and serving goes on (that
    kernel then compiles on first use, as in sglang)."""
    def positions() -> str:
        from sglang.srt.model_executor import forward_batch_info  # registry: engine (clamp_position)

        forward_batch_info.clamp_position(torch.ones(1, dtype=torch.int64, device=model_runner.device))
        return ""

    def request_slots() -> str:
        from sglang.srt.mem_cache import allocation  # registry: engine (assign_req_to_token_pool)

        calls = warm_request_slot_kernel(model_runner.req_to_token_pool.req_to_token,
                                         max_requests, allocation.assign_req_to_token_pool_func)
        return f"{calls} variants of "

    _compile("sglang's DECODE-position kernel", positions)
    _compile("sglang's request-slot kernel", request_slots)


def _compile(what: str, build: Callable[[], str]) -> None:
    try:
        done = build()
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 - a warm-up must not stop the server
        logger.warning("EAGLE3_DYNAMIC: could not pre-compile %s (%s); its first calls will "
                       "compile while serving.", what, error)
        return
    logger.info("EAGLE3_DYNAMIC: pre-compiled %s%s.", done, what)
