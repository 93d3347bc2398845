"""The README's quickstart launch command, run as written with the 8B-shaped dummy models standing
in for the Hugging Face ones: every other flag is the README's, so that when the README drops a
flag (the attention backend, once fa3 has run) this test serves sglang's choice."""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List

import pytest

from gpu_servers import REPO_ROOT, dummy_weights_env, start_server, stop_server, wait_healthy

MODEL_FLAGS = {"--model-path": "llama8b", "--speculative-draft-model-path": "eagle3-llama8b"}


def quickstart_command(readme: str) -> List[str]:
    """The `python -m sglang.launch_server ...` lines of the README's Quickstart, as arguments."""
    section = readme.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if "sglang.launch_server" in line)
    command = []
    for line in lines[start:]:
        command.append(line.strip().rstrip("\\").strip())
        if not line.rstrip().endswith("\\"):
            break
    return shlex.split(" ".join(command))


def with_dummy_models(command: List[str], model_folders: Path) -> List[str]:
    """The server flags of ``command`` (after `-m sglang.launch_server`), the models replaced by
    the 8B-shaped folders with dummy weights, nothing else changed."""
    args = command[command.index("sglang.launch_server") + 1:]
    for flag, folder in MODEL_FLAGS.items():
        args[args.index(flag) + 1] = str(model_folders / folder)
    return args + ["--load-format", "dummy", "--speculative-draft-load-format", "dummy"]


def test_the_quickstart_is_found_and_only_its_models_are_replaced() -> None:
    command = quickstart_command((REPO_ROOT / "README.md").read_text())
    assert command[:3] == ["python", "-m", "sglang.launch_server"]
    assert command[command.index("--speculative-algorithm") + 1] == "EAGLE3_DYNAMIC"
    args = with_dummy_models(command, Path("/m"))
    assert args[args.index("--model-path") + 1] == "/m/llama8b"
    assert args[args.index("--speculative-draft-model-path") + 1] == "/m/eagle3-llama8b"
    kept = [a for a in command[3:] if a not in MODEL_FLAGS and not a.startswith(("meta-llama/", "yuhuili/"))]
    assert [a for a in args if a not in MODEL_FLAGS and not a.startswith("/m/")][:len(kept)] == kept


@pytest.mark.gpu
def test_the_quickstart_serves_as_written(model_folders: Path) -> None:
    """sglang's defaults apart from the README's flags; simulated acceptance 3.0 so that the dummy
    draft proposes tokens the target accepts: a lone request speculates, and 64 at once run in
    one decode batch (EAGLE3 caps it at 48). Which mode serves the 64 is the policy's call: at
    acceptance 3.0 speculation pays there on fa3 (H200, 2026-12-05: every step speculative at 64
    and 128 requests) and not on triton."""
    command = quickstart_command((REPO_ROOT / "README.md").read_text())
    env = {**dummy_weights_env(), "SGLANG_SIMULATE_ACC_LEN": "3.0"}
    server = start_server("quickstart", with_dummy_models(command, model_folders), env)
    try:
        wait_healthy(server)
        before = server.dynamic_counters()
        single = server.generate(list(range(100, 300)), 64)
        assert len(single["output_ids"]) == 64
        lone = server.dynamic_counters()
        with ThreadPoolExecutor(64) as pool:
            outputs = list(pool.map(lambda i: server.generate(list(range(100 + i, 400 + i)), 128), range(64)))
        assert all(len(o["output_ids"]) == 128 for o in outputs)
        burst = server.dynamic_counters()
        print(f"quickstart as written ({shlex.join(command)}): {burst}")
        assert lone["speculative_steps"] > before["speculative_steps"], (before, lone)
        assert max(burst["max_plain_batch"], burst["max_speculative_batch"]) > 48, burst
        info = server.get("/server_info")
        if "--attention-backend" in command:
            assert info["attention_backend"] == command[command.index("--attention-backend") + 1]
        print("attention backend", info.get("attention_backend"), "sampling backend",
              info.get("sampling_backend"), "CUDA graphs", info.get("cuda_graph_config"))
    finally:
        stop_server(server)
