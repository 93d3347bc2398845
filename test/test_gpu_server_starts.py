"""The GPU tests' server selection and start order (test/gpu/gpu_servers.py), without servers."""

import importlib.util
import sys
from pathlib import Path
from typing import List

import pytest

GPU_TESTS = Path(__file__).parent / "gpu"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, GPU_TESTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


if "token_comparison" not in sys.modules:
    _load("token_comparison")
gpu_servers = _load("gpu_servers")


class MarkedItem:
    """What servers_used_by reads of a collected test: its markers."""

    def __init__(self, *marks: pytest.MarkDecorator) -> None:
        self._marks = [mark.mark for mark in marks]

    def iter_markers(self, name: str):
        return (mark for mark in self._marks if mark.name == name)


SPECS = {name: [] for name in ("plain", "eagle3", "dynamic", "broken")}


def test_servers_used_by_joins_the_markers_in_test_order_and_skips_other_modules_servers():
    items = [
        MarkedItem(pytest.mark.uses_servers("dynamic", "plain")),
        MarkedItem(),
        MarkedItem(pytest.mark.uses_servers("plain", "tiny_plain", "eagle3"),
                   pytest.mark.gpu),
    ]
    assert gpu_servers.servers_used_by(items, SPECS) == ["dynamic", "plain", "eagle3"]


def test_servers_used_by_reads_only_its_marker():
    assert gpu_servers.servers_used_by([MarkedItem(pytest.mark.gpu("plain"))], SPECS) == []


def test_start_launches_every_named_server_before_waiting_for_any(monkeypatch):
    events: List[str] = []
    monkeypatch.setattr(gpu_servers, "start_server",
                        lambda name, args, env: events.append(f"start {name}") or name)
    monkeypatch.setattr(gpu_servers, "wait_healthy",
                        lambda server: events.append(f"wait {server}"))
    servers = gpu_servers.LazyServers(SPECS)
    servers.start(["plain", "dynamic", "plain"])
    servers.start(["dynamic", "eagle3"])
    assert servers["plain"] == "plain"
    assert events == ["start plain", "start dynamic", "wait plain", "wait dynamic",
                      "start eagle3", "wait eagle3"]


def test_a_server_no_marker_named_starts_on_first_use(monkeypatch):
    events: List[str] = []
    monkeypatch.setattr(gpu_servers, "start_server",
                        lambda name, args, env: events.append(f"start {name} {env}") or name)
    monkeypatch.setattr(gpu_servers, "wait_healthy", lambda server: events.append("wait"))
    servers = gpu_servers.LazyServers(SPECS, env={"A": "1"}, server_envs={"broken": {"B": "2"}})
    assert servers["broken"] == "broken"
    assert servers["broken"] == "broken"
    assert events == ["start broken {'A': '1', 'B': '2'}", "wait"]


def test_a_server_that_fails_to_start_is_stopped_and_fails_only_the_tests_that_ask_for_it(
        monkeypatch):
    stopped: List[str] = []
    monkeypatch.setattr(gpu_servers, "start_server", lambda name, args, env: name)
    monkeypatch.setattr(gpu_servers, "stop_server", stopped.append)

    def wait_healthy(server: str) -> None:
        if server == "broken":
            raise gpu_servers.lifecycle.ServerError("broken exited")

    monkeypatch.setattr(gpu_servers, "wait_healthy", wait_healthy)
    servers = gpu_servers.LazyServers(SPECS)
    servers.start(["broken", "plain"])
    assert stopped == ["broken"]
    assert servers["plain"] == "plain"
    for _ in range(2):
        with pytest.raises(gpu_servers.lifecycle.ServerError, match="broken exited"):
            servers["broken"]
    assert stopped == ["broken"]


def test_sglang_defaults_drop_exactly_the_backend_flags_and_their_values():
    args = ["--model-path", "m", *gpu_servers.COMMON_SERVER_ARGS, "--max-total-tokens", "9"]
    assert gpu_servers.with_sglang_defaults(args) == [
        "--model-path", "m", "--cuda-graph-max-bs-decode", "128", "--max-total-tokens", "9"]


def test_the_suites_run_pinned_backends_unless_told_sglangs(monkeypatch):
    monkeypatch.delenv(gpu_servers.BACKENDS_ENV, raising=False)
    assert gpu_servers.backend_args() == gpu_servers.COMMON_SERVER_ARGS
    monkeypatch.setenv(gpu_servers.BACKENDS_ENV, "sglang")
    assert gpu_servers.backend_args() == ["--cuda-graph-max-bs-decode", "128"]
    assert gpu_servers.backend_args(float32=True) == [
        "--attention-backend", "triton", "--cuda-graph-max-bs-decode", "128"]
    monkeypatch.setenv(gpu_servers.BACKENDS_ENV, "fa3")
    with pytest.raises(ValueError, match="SGLANG_DE_TEST_BACKENDS='fa3': use pinned"):
        gpu_servers.backend_args()


def test_the_8b_suite_runs_sglangs_backends_unless_told_pinned(monkeypatch):
    monkeypatch.delenv(gpu_servers.BACKENDS_ENV, raising=False)
    target, _ = gpu_servers.dummy8b_args(gpu_servers.Path("/m"), backends="sglang")
    assert "--attention-backend" not in target and "--disable-prefill-cuda-graph" not in target
    assert gpu_servers.dummy8b_args(gpu_servers.Path("/m"))[0][-len(gpu_servers.COMMON_SERVER_ARGS):] == \
        gpu_servers.COMMON_SERVER_ARGS
    monkeypatch.setenv(gpu_servers.BACKENDS_ENV, "pinned")
    target, _ = gpu_servers.dummy8b_args(gpu_servers.Path("/m"), backends="sglang")
    assert target[-len(gpu_servers.COMMON_SERVER_ARGS):] == gpu_servers.COMMON_SERVER_ARGS


def test_the_tiny_suites_run_sglangs_backends_unless_told_pinned(monkeypatch):
    """The tiny-pair suite, its checks and the sampling tests (the conftest's servers) run
    sglang's sampling and prefill graphs with triton attention (float32); the soak and the
    acceptance-mixture tests, which call tiny_pair_args() without it, stay pinned."""
    monkeypatch.delenv(gpu_servers.BACKENDS_ENV, raising=False)
    target, _ = gpu_servers.tiny_pair_args(backends="sglang")
    assert "--sampling-backend" not in target and "--disable-prefill-cuda-graph" not in target
    assert target[target.index("--attention-backend") + 1] == "triton"
    assert "--disable-prefill-cuda-graph" in gpu_servers.tiny_pair_args()[0]
    conftest = (Path(__file__).resolve().parent / "gpu" / "conftest.py").read_text()
    assert 'tiny_pair_args(backends="sglang")' in conftest
    monkeypatch.setenv(gpu_servers.BACKENDS_ENV, "pinned")
    assert "--disable-prefill-cuda-graph" in gpu_servers.tiny_pair_args(backends="sglang")[0]


class _PassServer:
    """A server whose passes are recorded: each pass of the reference returns its own outputs,
    and every pass must come after a flush of the radix cache."""

    def __init__(self, name: str, passes) -> None:
        self.name, self._passes, self.log = name, list(passes), []

    def flush_cache(self) -> None:
        self.log.append("flush")

    def generate(self, input_ids, max_new_tokens, **kwargs):
        self.log.append("generate")
        return self._passes[0][input_ids[0]]

    def next_pass(self) -> None:
        self._passes.pop(0)


def test_the_reference_is_held_at_the_worse_of_two_cold_passes(monkeypatch):
    """Two passes of the reference, each after a cache flush; the bound is the larger flip
    count."""
    prompts = [{"input_ids": [i], "max_new_tokens": 1} for i in range(4)]
    first = {i: {"flips": i < 1} for i in range(4)}
    second = {i: {"flips": i < 3} for i in range(4)}
    reference = _PassServer("eagle3", [first, second])

    def send(server, chosen, wave_size, **kwargs):
        outputs = [server.generate(p["input_ids"], 1) for p in chosen]
        if len(server._passes) > 1:
            server.next_pass()
        return outputs

    monkeypatch.setattr(gpu_servers, "send_in_waves", send)
    monkeypatch.setattr(gpu_servers, "compare_outputs", lambda outputs, expected, margin: SimpleFlips(
        [o for o in outputs if o["flips"]]))
    outputs, flips = gpu_servers.reference_flip_count(reference, prompts, 2, [], 0.25, "t")
    assert flips == 3 and outputs == [first[i] for i in range(4)]
    assert reference.log == ["flush"] + ["generate"] * 4 + ["flush"] + ["generate"] * 4
    # Negative control: one pass would have set the bound at 1 flip.
    assert len([o for o in outputs if o["flips"]]) == 1


class SimpleFlips:
    def __init__(self, flips) -> None:
        self.flips = flips

    def summary(self) -> str:
        return f"bf16 flips {len(self.flips)}"
