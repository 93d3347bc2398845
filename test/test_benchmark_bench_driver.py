"""The bench driver: bench_serving's run_benchmark once per run (benchmark/sweeplib/bench_driver.py)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib import bench, bench_driver  # noqa: E402


@pytest.fixture
def serving(monkeypatch):
    """sglang's bench_serving module, with the attributes the driver replaces restored afterwards."""
    from sglang.benchmark import serving

    monkeypatch.setattr(serving, "flush_server_cache", serving.flush_server_cache)
    monkeypatch.setattr(serving, "run_benchmark", serving.run_benchmark)
    return serving


def test_each_run_gets_the_namespace_bench_servings_command_line_gives(serving, monkeypatch, tmp_path):
    settings = bench.BenchSettings("tok", 512, 256, 7, True, ("--tokenize-prompt",), "python3")
    flags = bench.bench_serving_flags(settings, "127.0.0.1", 30001, str(tmp_path / "bench.jsonl"))
    from_cli = []
    monkeypatch.setattr(serving, "run_benchmark", from_cli.append)
    monkeypatch.setattr(sys, "argv", ["bench_serving", *flags, "--max-concurrency", "4", "--num-prompts", "8"])
    serving.cli_main()
    from_driver = []
    monkeypatch.setattr(serving, "run_benchmark", from_driver.append)
    assert bench_driver.main(["4:8", "--", *flags]) == 0
    assert vars(from_driver[0]) == vars(from_cli[0])
    assert from_driver[0].max_concurrency == 4 and from_driver[0].num_prompts == 8
    assert serving.ArgumentParser is bench_driver.argparse.ArgumentParser  # put back
    assert serving.flush_server_cache is bench_driver.flush_when_idle


def test_driver_runs_every_group_with_its_own_flags(serving, monkeypatch):
    calls = []
    monkeypatch.setattr(serving, "run_benchmark",
                        lambda args: calls.append((args.output_file, args.max_concurrency, args.num_prompts)))
    argv = ["1:1", "--", "--output-file", "warm", bench_driver.GROUP_SEPARATOR,
            "1:4", "4:8", "--", "--output-file", "measured"]
    assert bench_driver.main(argv) == 0
    assert calls == [("warm", 1, 1), ("measured", 1, 4), ("measured", 4, 8)]


def test_driver_goes_on_after_bench_serving_exits(serving, monkeypatch):
    calls = []

    def run_benchmark(args):
        calls.append(args.output_file)
        if args.output_file == "warm":
            sys.exit(1)  # what bench_serving does when the server is not ready

    monkeypatch.setattr(serving, "run_benchmark", run_benchmark)
    argv = ["1:1", "--", "--output-file", "warm", bench_driver.GROUP_SEPARATOR, "1:4", "--", "--output-file", "m"]
    assert bench_driver.main(argv) == 1
    assert calls == ["warm", "m"]


class FakeRequests:
    """The parts of `requests` that flush_when_idle uses, answering like an sglang server."""

    RequestException = OSError

    def __init__(self, server_info: dict | None) -> None:
        self.server_info = server_info
        self.calls: list[str] = []

    def post(self, url, params=None, timeout=None):
        self.calls.append(f"POST {url}" + (f"?timeout={params['timeout']}" if params else ""))
        return types.SimpleNamespace(raise_for_status=lambda: None)

    def get(self, url, timeout=None):
        self.calls.append(f"GET {url}")
        if self.server_info is None:
            raise OSError("connection refused")
        return types.SimpleNamespace(json=lambda: self.server_info)


def test_each_runs_state_after_bench_servings_warm_up_is_recorded(serving, monkeypatch, tmp_path):
    """The flush after bench_serving's warm-up request waits for an idle server and is followed by
    a GC freeze and a /server_info snapshot, appended to the run's after-warm-up file with the
    run's concurrency."""
    output = tmp_path / "bench.jsonl"
    fake = FakeRequests({"internal_states": [{"dynamic_eagle": {"speculative_steps": 7}}]})
    monkeypatch.setitem(sys.modules, "requests", fake)
    monkeypatch.setattr(serving, "run_benchmark",
                        lambda args: serving.flush_server_cache("http://h:1", "sglang"))
    assert bench_driver.main(["1:4", "8:16", "--", "--output-file", str(output)]) == 0
    lines = [json.loads(line) for line in
             Path(bench_driver.after_warmup_file(str(output))).read_text().splitlines()]
    assert [line["max_concurrency"] for line in lines] == [1, 8]
    assert lines[0]["server_info"]["internal_states"][0]["dynamic_eagle"] == {"speculative_steps": 7}
    assert fake.calls[:3] == [f"POST http://h:1/flush_cache?timeout={bench_driver.FLUSH_WAIT_S}",
                              "POST http://h:1/freeze_gc", "GET http://h:1/server_info"]


def test_a_failed_snapshot_leaves_the_run_without_one(serving, monkeypatch, tmp_path):
    output = tmp_path / "bench.jsonl"
    monkeypatch.setitem(sys.modules, "requests", FakeRequests(None))
    monkeypatch.setattr(serving, "run_benchmark",
                        lambda args: serving.flush_server_cache("http://h:1", "sglang"))
    assert bench_driver.main(["1:4", "--", "--output-file", str(output)]) == 0
    assert not Path(bench_driver.after_warmup_file(str(output))).exists()
