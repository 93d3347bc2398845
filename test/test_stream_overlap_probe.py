"""tools/stream_overlap_probe.py's stand-ins for a decode step and a draft extend, on CPU in
float32 with small sizes (the tool itself needs a GPU: its timing is not tested here)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import stream_overlap_probe as probe  # noqa: E402


def test_the_decode_step_and_the_draft_extend_have_the_shapes_they_stand_in_for(monkeypatch):
    monkeypatch.setattr(probe, "weights", lambda *shape: torch.randn(*shape) * 0.02)
    sizes = dict(HIDDEN=64, MLP=96, VOCAB=100, DRAFT_VOCAB=50, HEADS=4, KV_HEADS=2, HEAD_DIM=16)
    for name, value in dict(sizes, QKV=(4 + 2 * 2) * 16).items():
        monkeypatch.setattr(probe, name, value)
    args = argparse.Namespace(batch=3, kv=16, prefill=40, every=5.6, steps=10, layers=1, repeats=1)
    shapes = probe.Shapes(args)
    assert shapes.decode().shape == (3, probe.VOCAB)
    assert shapes.draft_extend().shape == (1, probe.DRAFT_VOCAB)
    assert shapes.draft["qkv"].shape == (2 * probe.HIDDEN, probe.QKV)  # EAGLE-3: embedding and fc output
    assert shapes.target_hidden.shape == (40, 3 * probe.HIDDEN)  # three captured target layers
