"""GPU-test fixtures; the server helpers live in gpu_servers.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_servers import KIT_MODELS


@pytest.fixture(scope="session")
def kit_models() -> Path:
    if not (KIT_MODELS / "llama8b" / "config.json").exists():
        pytest.fail(f"GPU kit models not found at {KIT_MODELS}; run test/gpu/run_on_device.sh")
    return KIT_MODELS
