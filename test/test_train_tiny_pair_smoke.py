"""The tiny-pair trainer end to end at its toy scale on the CPU (about 30 s): it trains both
models, writes them in the layout sglang loads, and its own reference decode agrees with the
saved checkpoints (the script exits non-zero otherwise)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_smoke_training_writes_a_checked_pair(tmp_path: Path) -> None:
    out = tmp_path / "pair"
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "models" / "train_tiny_pair.py"), "--smoke",
         "--device", "cpu", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    card = json.loads((out / "card.json").read_text())
    assert card["reference_check_ok"] is True
    for model in ("target", "draft"):
        assert (out / model / "config.json").exists() and (out / model / "model.safetensors").exists()
    draft_config = json.loads((out / "draft" / "config.json").read_text())
    assert draft_config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert card["offline_acceptance"]["mean_accept_length"] > 1.0
    assert json.loads((out / "eval_prompts.json").read_text())["prompts"]
