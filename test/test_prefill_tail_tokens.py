"""The draft prefill's tail tokens: the same values as sglang's function, for EAGLE3_DYNAMIC only."""

from __future__ import annotations

import inspect

from types import SimpleNamespace
from typing import List, Optional

import pytest
import torch
from sglang.srt.speculative import eagle_utils
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sglang_dynamic_eagle.sglang_compat import registry
from sglang_dynamic_eagle.sglang_compat.hooks.prefill_tail_tokens import tail_tokens_without_sync
from sglang_dynamic_eagle.sglang_compat.spec_algo import DynamicEagleSpecAlgo

# The original, also where the plugin's hook is already applied in this test session.
SGLANGS_TAIL_TOKENS = inspect.unwrap(eagle_utils._eagle_prefill_tail_tokens)
DYNAMIC = object.__new__(DynamicEagleSpecAlgo)


def prefill_batch(num_reqs: int, chunked_row: Optional[int], next_prompt_token: Optional[int],
                  algorithm=DYNAMIC) -> SimpleNamespace:
    reqs = [SimpleNamespace(rid=row) for row in range(num_reqs)]
    return SimpleNamespace(
        reqs=reqs,
        chunked_req=reqs[chunked_row] if chunked_row is not None else None,
        chunked_req_next_prompt_token=next_prompt_token,
        input_ids=torch.zeros(4, dtype=torch.int64),
        spec_algorithm=algorithm,
    )


def sampled() -> torch.Tensor:
    return torch.tensor([11, 12, 13], dtype=torch.int32)


@pytest.mark.parametrize(
    "chunked_row, next_prompt_token",
    [(None, None), (2, 77), (0, 5), (None, 9)],
    ids=["no chunked request", "chunked last", "chunked first", "token without its request"],
)
def test_same_tokens_as_sglang(chunked_row, next_prompt_token) -> None:
    batch = prefill_batch(3, chunked_row, next_prompt_token)
    tokens = sampled()
    expected = SGLANGS_TAIL_TOKENS(batch, tokens)
    got = tail_tokens_without_sync(SGLANGS_TAIL_TOKENS, batch, tokens)
    assert got.dtype == expected.dtype == torch.int64
    assert got.tolist() == expected.tolist()
    assert tokens.tolist() == [11, 12, 13]  # the sampled tokens are not written to


def test_other_algorithms_get_sglangs_function() -> None:
    calls: List[str] = []

    def original(batch, next_token_ids):
        calls.append("original")
        return next_token_ids

    batch = prefill_batch(3, 2, 77, algorithm=SpeculativeAlgorithm.EAGLE3)
    assert tail_tokens_without_sync(original, batch, sampled()).tolist() == [11, 12, 13]
    assert calls == ["original"]


def test_the_hook_is_on_the_name_eagles_draft_prefill_calls(loaded_plugins) -> None:
    from sglang.srt.speculative import eagle_worker_v2

    assert registry._wraps_hook(
        eagle_worker_v2._eagle_prefill_tail_tokens, tail_tokens_without_sync
    )
