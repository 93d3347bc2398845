#!/usr/bin/env python3
"""How much of a draft extend hides behind plain decode steps when it runs on a second CUDA
stream instead of between them (GPU only; torch alone, no sglang).

A plain decode step of an 8B-shaped target at a full batch is memory-bound (its weights and the
batch's KV); EAGLE-3's draft extend over a prefill's tokens is one decoder layer of matmuls,
compute-bound. Here both are built from torch ops with the shapes of the sustained overload of
2026-12-07 (96 running requests of ~900 KV tokens, a prefill of ~1,070 tokens every ~5.6
decode steps): the decode step as one CUDA graph, the extend eager. Printed per decode step:
the step alone, with the extends serialized on its stream, and with them on a side stream at the
same priority and at a lower one than the decode's; then the share of the extends' time hidden.

    python3 tools/stream_overlap_probe.py [--batch 96] [--kv 900] [--prefill 1070] [--every 5.6]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

HIDDEN, MLP, VOCAB, DRAFT_VOCAB = 4096, 14336, 128256, 32000
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
QKV = (HEADS + 2 * KV_HEADS) * HEAD_DIM


def weights(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.02


def mlp(x: torch.Tensor, layer: dict) -> torch.Tensor:
    gate, up = (x @ layer["gate_up"]).chunk(2, -1)
    return (F.silu(gate) * up) @ layer["down"]


def layer_weights(input_width: int) -> dict:
    return {"qkv": weights(input_width, QKV), "o": weights(HIDDEN, HIDDEN),
            "gate_up": weights(HIDDEN, 2 * MLP), "down": weights(MLP, HIDDEN)}


class Shapes:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.layers = [layer_weights(HIDDEN) for _ in range(args.layers)]
        self.kv = [(weights(args.batch, KV_HEADS, args.kv, HEAD_DIM), weights(args.batch, KV_HEADS, args.kv, HEAD_DIM))
                   for _ in range(args.layers)]
        self.lm_head = weights(HIDDEN, VOCAB)
        self.draft = dict(layer_weights(2 * HIDDEN), fc=weights(3 * HIDDEN, HIDDEN), lm_head=weights(HIDDEN, DRAFT_VOCAB))
        self.decode_input = weights(args.batch, HIDDEN)
        self.target_hidden = weights(args.prefill, 3 * HIDDEN)  # EAGLE-3's three captured layers
        self.embeds = weights(args.prefill, HIDDEN)

    def decode(self) -> torch.Tensor:
        x, batch = self.decode_input, self.args.batch
        for layer, (k, v) in zip(self.layers, self.kv):
            q = (x @ layer["qkv"])[:, :HIDDEN].view(batch, HEADS, 1, HEAD_DIM)
            attended = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).reshape(batch, HIDDEN)
            x = x + attended @ layer["o"]
            x = x + mlp(x, layer)
        return x @ self.lm_head

    def draft_extend(self) -> torch.Tensor:
        tokens, draft = self.args.prefill, self.draft
        hidden = self.target_hidden @ draft["fc"]
        qkv = torch.cat([self.embeds, hidden], -1) @ draft["qkv"]
        q, k, v = qkv.split([HIDDEN, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        q = q.view(tokens, HEADS, HEAD_DIM).transpose(0, 1)
        k = k.reshape(tokens, KV_HEADS, HEAD_DIM).transpose(0, 1)
        v = v.reshape(tokens, KV_HEADS, HEAD_DIM).transpose(0, 1)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = hidden + attended.transpose(0, 1).reshape(tokens, HIDDEN) @ draft["o"]
        x = x + mlp(x, draft)
        return x[-1:] @ draft["lm_head"]


def captured_decode(shapes: Shapes) -> torch.cuda.CUDAGraph:
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(2):
            shapes.decode()
            shapes.draft_extend()
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        shapes.decode()
    torch.cuda.synchronize()
    return graph


def ms_per_step(shapes: Shapes, graph: torch.cuda.CUDAGraph, kind: str, decode_priority: int = 0) -> float:
    """Milliseconds per decode step over ``--steps`` steps; ``kind``: decode (alone), serial
    (each extend on the decode's stream), side (each on a default-priority side stream)."""
    args = shapes.args
    decode_stream, side = torch.cuda.Stream(priority=decode_priority), torch.cuda.Stream()
    due = {int(i * args.every) for i in range(int(args.steps / args.every) + 1)}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    with torch.cuda.stream(decode_stream):
        start.record()
        for step in range(args.steps):
            if step in due and kind == "serial":
                shapes.draft_extend()
            elif step in due and kind == "side":
                side.wait_stream(decode_stream)
                with torch.cuda.stream(side):
                    shapes.draft_extend()
            graph.replay()
        decode_stream.wait_stream(side)
        end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / args.steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=96)
    parser.add_argument("--kv", type=int, default=900, help="KV tokens per running request")
    parser.add_argument("--prefill", type=int, default=1070, help="tokens of each draft extend")
    parser.add_argument("--every", type=float, default=5.6, help="decode steps per prefill")
    parser.add_argument("--steps", type=int, default=112)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shapes = Shapes(args)
    graph = captured_decode(shapes)
    lowest, highest = torch.cuda.Stream.priority_range()  # lower numbers run first
    print(f"{torch.cuda.get_device_name()}: batch {args.batch} x {args.kv} KV tokens, a {args.prefill}-token "
          f"draft extend every {args.every} steps")
    print("| repeat | decode alone (ms/step) | extends serialized | side stream, same priority | "
          "side stream, decode first | hidden, same | hidden, decode first |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for repeat in range(args.repeats):
        alone, serial = ms_per_step(shapes, graph, "decode"), ms_per_step(shapes, graph, "serial")
        same, first = ms_per_step(shapes, graph, "side", lowest), ms_per_step(shapes, graph, "side", highest)
        added = serial - alone
        print(f"| {repeat} | {alone:.3f} | {serial:.3f} | {same:.3f} | {first:.3f} | "
              f"{(serial - same) / added:.2f} | {(serial - first) / added:.2f} |")


if __name__ == "__main__":
    main()
