"""The README's tiny-pair demo (models/tiny-pair/demo.sh) runs as written and shows both modes."""

from __future__ import annotations

import subprocess

import pytest

from gpu_servers import TINY_PAIR, free_port

pytestmark = pytest.mark.gpu

COUNTERS = ("speculative_steps", "plain_steps", "switches_to_plain", "switches_to_speculative")


def test_the_tiny_pair_demo_runs_as_written_and_shows_both_modes() -> None:
    result = subprocess.run(["bash", str(TINY_PAIR / "demo.sh"), str(free_port())],
                            capture_output=True, text=True, timeout=900)
    print(result.stdout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    printed = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert printed["completion of 64 tokens"].strip("'\"")
    assert all(int(printed[name]) > 0 for name in COUNTERS), printed
