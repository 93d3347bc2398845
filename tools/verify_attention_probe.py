#!/usr/bin/env python3
"""What the target's attention costs in a speculative verify on triton, with sglang's two kernels
for it (GPU only; sglang 0.5.17 installed).

On sglang's triton attention backend a verify (each request's draft tokens checked against its
whole KV prefix) runs the prefill kernel ``extend_attention_fwd``, which walks each request's
prefix serially per (request, head); sglang 0.5.17 also ships ``verify_splitkv_fwd``, which splits
the prefix across programs as the decode kernel does, but enables it on AMD gfx95 only. Here both
run on the same verify shapes of an 8B-shaped Llama target (32 query heads, 8 KV heads of 128,
bf16, a chain of 4 verified tokens per request), cycling over distinct per-layer KV buffers as a
forward does: printed, per 32-layer step, each kernel's milliseconds and the largest difference
between their outputs.

    python3 tools/verify_attention_probe.py [--batches 8,19,32,64] [--prefix 800] [--draft-tokens 4]
"""

from __future__ import annotations

import argparse
from typing import Dict, List

import torch

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 32, 8, 128, 32


def verify_layout(batch: int, prefix: int, draft_tokens: int, device: str = "cpu") -> Dict[str, torch.Tensor]:
    """Index tensors of a verify batch as sglang's triton backend builds them: each request's
    draft tokens (``qo_indptr``), its prefix slots (``kv_indptr``, ``kv_indices``: request i's
    prefix in slots i*prefix ..), and the custom mask of a chain (every prefix column on, the
    draft block lower-triangular), one row of prefix + draft_tokens columns per draft token."""
    seq = prefix + draft_tokens
    row = torch.ones(draft_tokens, seq, dtype=torch.bool)
    row[:, prefix:] = torch.tril(torch.ones(draft_tokens, draft_tokens, dtype=torch.bool))
    return {
        "qo_indptr": torch.arange(0, (batch + 1) * draft_tokens, draft_tokens, dtype=torch.int32, device=device),
        "kv_indptr": torch.arange(0, (batch + 1) * prefix, prefix, dtype=torch.int32, device=device),
        "kv_indices": torch.arange(batch * prefix, dtype=torch.int64, device=device),
        "custom_mask": row.flatten().repeat(batch).to(device),
        "mask_indptr": torch.arange(0, (batch + 1) * draft_tokens * seq, draft_tokens * seq, dtype=torch.int64,
                                    device=device),
    }


def step_ms(kernel, calls: List[tuple], repeats: int) -> float:
    """Milliseconds for one pass over ``calls`` (a layer each), the median of ``repeats``."""
    times = []
    for _ in range(repeats + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for args in calls:
            kernel(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times[2:])[len(times[2:]) // 2]


def probe(batch: int, args: argparse.Namespace) -> str:
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    from sglang.kernels.ops.attention.verify_splitkv import verify_splitkv_fwd

    n, prefix = args.draft_tokens, args.prefix
    layout = verify_layout(batch, prefix, n, "cuda")
    pool = batch * prefix + 1

    def bf16(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    buffers = [(bf16(pool, KV_HEADS, HEAD_DIM), bf16(pool, KV_HEADS, HEAD_DIM)) for _ in range(args.kv_buffers)]
    q, k, v = bf16(batch * n, HEADS, HEAD_DIM), bf16(batch * n, KV_HEADS, HEAD_DIM), bf16(batch * n, KV_HEADS, HEAD_DIM)
    outputs = {"extend": torch.empty_like(q), "splitkv": torch.empty_like(q)}
    scale = HEAD_DIM ** -0.5

    def calls(name):
        return [(q, k, v, outputs[name], *buffers[layer % len(buffers)], layout["qo_indptr"], layout["kv_indptr"],
                 layout["kv_indices"], layout["custom_mask"], True, layout["mask_indptr"], n, 1.0, 1.0, scale)
                for layer in range(LAYERS)]

    served = verify_splitkv_fwd(*calls("splitkv")[0], max_bs=batch)
    extend_attention_fwd(*calls("extend")[0])
    torch.cuda.synchronize()
    if not served:
        return f"| {batch} | {prefix} | - | - | - | - | split-KV declined the shape |"
    diff = (outputs["extend"].float() - outputs["splitkv"].float()).abs().max().item()
    extend = step_ms(extend_attention_fwd, calls("extend"), args.repeats)
    split = step_ms(lambda *a: verify_splitkv_fwd(*a, max_bs=batch), calls("splitkv"), args.repeats)
    # Inside a CUDA graph the backend passes its whole preallocated index buffer, and the kernel
    # picks its split count from that buffer's length per request (16 splits from 8,192 up).
    layout["kv_indices"] = torch.cat([layout["kv_indices"], torch.zeros(batch * 8192, dtype=torch.int64, device="cuda")])
    graph_sized = step_ms(lambda *a: verify_splitkv_fwd(*a, max_bs=batch), calls("splitkv"), args.repeats)
    return (f"| {batch} | {prefix} | {extend:.3f} | {split:.3f} | {graph_sized:.3f} | "
            f"{extend / min(split, graph_sized):.2f} | {diff:.2e} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="8,19,32,64")
    parser.add_argument("--prefix", type=int, default=800, help="KV tokens before each request's draft tokens")
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument("--kv-buffers", type=int, default=4, help="distinct layer KV buffers cycled over")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}: verify attention of {LAYERS} layers, {args.draft_tokens} draft tokens a request")
    print("| requests | prefix | extend_attention_fwd (ms/step) | verify_splitkv_fwd (ms/step) | the same, graph-sized "
          "indices | extend / the faster split | largest difference |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for batch in (int(b) for b in args.batches.split(",")):
        print(probe(batch, args), flush=True)


if __name__ == "__main__":
    main()
