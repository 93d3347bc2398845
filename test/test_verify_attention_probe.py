"""tools/verify_attention_probe.py's verify layout, read on CPU by a reference attention as sglang's
triton extend kernel reads it (the kernels and their timing need a GPU: not tested here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import verify_attention_probe as probe  # noqa: E402


def attention_by_layout(layout, q, k_new, v_new, k_buffer, v_buffer):
    """Each request's draft rows against its prefix slots and its own draft block, where the
    custom mask allows (one mask row of prefix + draft columns per draft token)."""
    out = torch.empty_like(q)
    batch = len(layout["qo_indptr"]) - 1
    for i in range(batch):
        rows = slice(int(layout["qo_indptr"][i]), int(layout["qo_indptr"][i + 1]))
        slots = layout["kv_indices"][int(layout["kv_indptr"][i]):int(layout["kv_indptr"][i + 1])]
        keys = torch.cat([k_buffer[slots], k_new[rows]])
        values = torch.cat([v_buffer[slots], v_new[rows]])
        n, seq = rows.stop - rows.start, len(keys)
        start = int(layout["mask_indptr"][i])
        mask = layout["custom_mask"][start:start + n * seq].view(n, seq)
        scores = (q[rows] @ keys.T).masked_fill(~mask, float("-inf"))
        out[rows] = scores.softmax(-1) @ values
    return out


@pytest.mark.parametrize("batch,prefix,draft", [(1, 5, 4), (3, 7, 2), (2, 1, 3)])
def test_the_layout_is_a_chain_each_draft_token_seeing_its_prefix_and_the_drafts_before_it(batch, prefix, draft):
    torch.manual_seed(0)
    layout = probe.verify_layout(batch, prefix, draft)
    dim, pool = 8, batch * prefix
    q, k_new, v_new = (torch.randn(batch * draft, dim) for _ in range(3))
    k_buffer, v_buffer = torch.randn(pool, dim), torch.randn(pool, dim)
    got = attention_by_layout(layout, q, k_new, v_new, k_buffer, v_buffer)
    for i in range(batch):  # the same sequence decoded one token at a time
        keys = torch.cat([k_buffer[i * prefix:(i + 1) * prefix], k_new[i * draft:(i + 1) * draft]])
        values = torch.cat([v_buffer[i * prefix:(i + 1) * prefix], v_new[i * draft:(i + 1) * draft]])
        for j in range(draft):
            seen = prefix + j + 1
            expected = (q[i * draft + j] @ keys[:seen].T).softmax(-1) @ values[:seen]
            torch.testing.assert_close(got[i * draft + j], expected)
    assert layout["kv_indices"].dtype == torch.int64 and layout["qo_indptr"].dtype == torch.int32
