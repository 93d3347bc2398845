"""The draft prefill's tail tokens without holding the scheduler until the target prefill ends.

EAGLE's draft prefill feeds each request its prompt shifted by one, ending in the token the
target just sampled; a request whose prefill is cut into chunks ends its chunk in its next
prompt token instead (sglang's ``eagle_utils._eagle_prefill_tail_tokens``). sglang writes that
token with ``tail_tokens[i] = next_prompt_token``: a Python int into a CUDA tensor, a blocking
copy. The host then waits for the target extend enqueued just before, so the scheduler, which
streams a prefill's first tokens only after it has launched the next batch, delivers every
prefill batch's first tokens one target prefill late whenever the next batch holds a chunked
request (most batches under load: each ends in one). Measured on one H200 (2026-12-01,
``torch.cuda.set_sync_debug_mode`` in the scheduler process): the only synchronising call of
a prefill in EAGLE3_DYNAMIC.

:func:`tail_tokens_without_sync` is the same computation with the token copied from pinned
memory, asynchronously. It applies to EAGLE3_DYNAMIC servers only; other algorithms keep
sglang's function, so an EAGLE3 baseline measured next to ours is sglang's own.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from sglang_dynamic_eagle.sglang_compat.spec_algo import DynamicEagleSpecAlgo


def _chunked_row(batch) -> Optional[int]:
    for row, req in enumerate(batch.reqs):
        if req is batch.chunked_req:
            return row
    return None


def tail_tokens_without_sync(original_fn: Callable, batch, next_token_ids: torch.Tensor):
    """HookRegistry AROUND hook on ``eagle_worker_v2._eagle_prefill_tail_tokens``."""
    if not isinstance(batch.spec_algorithm, DynamicEagleSpecAlgo):
        return original_fn(batch, next_token_ids)
    tail_tokens = next_token_ids.to(batch.input_ids.dtype)
    next_prompt_token = batch.chunked_req_next_prompt_token
    row = _chunked_row(batch) if next_prompt_token is not None else None
    if row is None:
        return tail_tokens
    tail_tokens = tail_tokens.clone()
    on_gpu = tail_tokens.is_cuda
    host = torch.tensor([next_prompt_token], dtype=tail_tokens.dtype, pin_memory=on_gpu)
    tail_tokens[row : row + 1].copy_(host, non_blocking=on_gpu)
    return tail_tokens
