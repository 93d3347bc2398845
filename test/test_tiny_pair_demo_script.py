"""models/tiny-pair/demo.sh on CPU, with ``python3 -m sglang.launch_server`` answered by a
stand-in server: its shell logic (start, wait for /health, four concurrent requests, the
completion and counter lines, stopping the server) runs as written."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "tiny-pair" / "demo.sh"
FAKE_SERVER = Path(__file__).resolve().parent / "fakes" / "fake_demo_server.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def python3_shim(directory: Path) -> Path:
    """A ``python3`` on PATH that runs the stand-in server for ``-m sglang.launch_server`` and
    this interpreter for everything else."""
    shim = directory / "python3"
    shim.write_text(
        "#!/bin/bash\n"
        f'if [ "$1 $2" = "-m sglang.launch_server" ]; then shift 2; exec {sys.executable} {FAKE_SERVER} "$@"; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    shim.chmod(0o755)
    return directory


@pytest.mark.skipif(shutil.which("curl") is None, reason="the demo uses curl")
def test_the_demo_prints_a_completion_and_the_counters_and_stops_its_server(tmp_path) -> None:
    port = free_port()
    env = {"PATH": f"{python3_shim(tmp_path)}:/usr/bin:/bin"}
    result = subprocess.run(["bash", str(DEMO), str(port)], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    printed = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert printed["completion of 64 tokens"] == repr("x" * 64)
    assert printed["speculative_steps"] == "40" and printed["plain_steps"] == "80"
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0  # the server was stopped


@pytest.mark.skipif(shutil.which("curl") is None, reason="the demo uses curl")
def test_a_server_that_dies_at_start_up_is_reported_with_its_log(tmp_path) -> None:
    shim = tmp_path / "python3"
    shim.write_text("#!/bin/bash\necho 'CUDA error: no device'; exit 3\n")
    shim.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "TMPDIR": str(tmp_path)}
    result = subprocess.run(["bash", str(DEMO), str(free_port())], capture_output=True,
                            text=True, env=env, timeout=60)
    assert result.returncode == 1
    assert "server not healthy" in result.stdout and "CUDA error: no device" in result.stdout
    assert sorted(path.name for path in tmp_path.iterdir()) == ["python3"]  # nothing left behind
