"""The bench driver: bench_serving's run_benchmark once per request line (benchmark/sweeplib/bench_driver.py)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
import types
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib import bench, bench_driver  # noqa: E402
from sweeplib.workloads import Segment  # noqa: E402
from benchmark_helpers import FAKES, free_port  # noqa: E402

TOKENIZER = Path(__file__).resolve().parents[1] / "models" / "tiny-pair" / "target"


@pytest.fixture
def serving(monkeypatch):
    """sglang's bench_serving module, with the attributes the driver replaces restored afterwards."""
    from sglang.benchmark import serving

    monkeypatch.setattr(serving, "flush_server_cache", serving.flush_server_cache)
    monkeypatch.setattr(serving, "run_benchmark", serving.run_benchmark)
    monkeypatch.setitem(serving.ASYNC_REQUEST_FUNCS, "sglang", serving.ASYNC_REQUEST_FUNCS["sglang"])
    return serving


def drive(requests: list[dict]) -> list[dict]:
    out = io.StringIO()
    assert bench_driver.main([json.dumps(request) + "\n" for request in requests], out) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_each_run_is_what_bench_servings_command_line_makes_of_its_flags(serving, monkeypatch, tmp_path):
    flags = bench.segment_flags(Segment(1024, 512, 40, rate=2.0, range_ratio=0.25), "tok", "127.0.0.1", 30001, 7,
                                str(tmp_path / "bench.jsonl"), ("--tokenize-prompt",))
    runs = []
    monkeypatch.setattr(serving, "run_benchmark", runs.append)
    argv = list(sys.argv)
    assert drive([{"flags": flags}, {"flags": ["--request-rate", "x"]}])[0]["ok"]
    (args,) = runs  # the second run's flags do not parse: it is answered as failed
    assert (args.request_rate, args.num_prompts, args.random_range_ratio, args.max_concurrency) == (2.0, 40, 0.25, None)
    assert (args.port, args.seed, args.tokenize_prompt, args.flush_cache) == (30001, 7, True, True)
    assert sys.argv == argv and serving.flush_server_cache is bench_driver.flush_when_idle


def test_driver_goes_on_after_bench_serving_exits(serving, monkeypatch):
    calls = []

    def run_benchmark(args):
        calls.append(args.output_file)
        if args.output_file == "first":
            sys.exit(1)  # what bench_serving does when the server is not ready

    monkeypatch.setattr(serving, "run_benchmark", run_benchmark)
    replies = drive([{"flags": ["--output-file", "first"]}, {"flags": ["--output-file", "second"]}])
    assert calls == ["first", "second"]
    assert [reply["ok"] for reply in replies] == [False, True] and "SystemExit" in replies[0]["error"]


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


def test_each_runs_state_after_bench_servings_warm_up_is_answered(serving, monkeypatch):
    """The flush after bench_serving's warm-up request waits for an idle server and is followed by
    a GC freeze and a /server_info snapshot, which the run's answer carries; a failed fetch
    leaves it out, and a run without a flush answers none (not the previous run's)."""
    info = {"internal_states": [{"dynamic_eagle": {"speculative_steps": 7}}]}
    fake = FakeRequests(info)
    monkeypatch.setitem(sys.modules, "requests", fake)
    monkeypatch.setattr(serving, "run_benchmark", lambda args: args.flush_cache and serving.flush_server_cache(
        "http://h:1", "sglang"))
    replies = drive([{"flags": ["--flush-cache"]}, {"flags": []}])
    assert replies[0]["after_warmup"] == info and replies[1]["after_warmup"] is None
    assert fake.calls[:3] == [f"POST http://h:1/flush_cache?timeout={bench_driver.FLUSH_WAIT_S}",
                              "POST http://h:1/freeze_gc", "GET http://h:1/server_info"]
    monkeypatch.setitem(sys.modules, "requests", FakeRequests(None))
    assert drive([{"flags": ["--flush-cache"]}])[0] == {"ok": True, "error": None, "after_warmup": None}


@pytest.fixture
def fake_server(tmp_path):
    port = free_port()
    process = subprocess.Popen([sys.executable, str(FAKES / "fake_sglang_server.py"), "--port", str(port),
                                "--model-path", str(TOKENIZER)], env={"FAKE_SERVER_DIR": str(tmp_path)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            break
        except OSError:
            time.sleep(0.1)
    yield port
    process.kill()
    process.wait()


@pytest.mark.parametrize("visible", [True, False])
def test_bench_serving_against_a_stand_in_stamps_the_first_token_only_with_visible_special_tokens(
        serving, fake_server, tmp_path, visible):
    """The stand-in's text stays empty until the last chunk unless a request asks for
    skip_special_tokens=False (as dummy weights under simulated acceptance do). With
    visible_special_tokens every request says so, with its own output length (mixed lengths),
    and bench_serving's TTFT is the first token's; without, TTFT is the whole request."""
    output = tmp_path / "bench.jsonl"
    flags = bench.segment_flags(Segment(24, 40, 6, rate=50.0, range_ratio=0.25), str(TOKENIZER), "127.0.0.1",
                                fake_server, 3, str(output))
    (reply,) = drive([{"flags": flags, "visible_special_tokens": visible}])
    assert reply["ok"], reply["error"]
    line = bench.last_line(output)
    stats = bench.request_stats(line)
    assert all(stats["ok"]) and len(stats["ok"]) == 6
    sent = [json.loads(text)["sampling_params"] for text in (tmp_path / "requests.jsonl").read_text().splitlines()]
    measured = sent[1:]  # the first is bench_serving's warm-up request
    assert sorted(p["max_new_tokens"] for p in measured) == sorted(stats["output_len"])
    assert all((p.get("skip_special_tokens") is False) == visible for p in sent)
    assert all(p.get("ignore_eos") is True for p in measured) and len(set(stats["output_len"])) > 1
    for ttft, e2e in zip(stats["ttft_s"], stats["e2e_s"]):
        assert (ttft < 0.5 * e2e) == visible
    assert serving.ASYNC_REQUEST_FUNCS["sglang"] is serving.async_request_sglang_generate  # put back


def test_a_shared_prompt_workload_sends_each_groups_system_prompt_before_each_question(serving, fake_server,
                                                                                    tmp_path):
    """shared-R through bench_serving's generated-shared-prefix dataset: every request starts with
    one of the segment's system prompts, each group gets its share, and questions and output
    lengths differ (so the radix cache sees one prefix per group and distinct tails)."""
    from sweeplib.workloads import workload

    (shared,) = workload("shared-40@0.4")
    segment = shared.segments[0]
    assert (segment.groups, segment.prompts) == (8, 16)
    flags = bench.segment_flags(segment, str(TOKENIZER), "127.0.0.1", fake_server, 3, str(tmp_path / "out.jsonl"))
    (reply,) = drive([{"flags": flags, "visible_special_tokens": True}])
    assert reply["ok"], reply["error"]
    sent = [json.loads(text) for text in (tmp_path / "requests.jsonl").read_text().splitlines()][1:]
    assert len(sent) == 16 and all(isinstance(request["text"], str) for request in sent)
    systems = [request["text"].partition("\n\n")[0] for request in sent]
    assert sorted(systems.count(system) for system in set(systems)) == [2] * 8
    assert len({request["text"] for request in sent}) == 16
    assert len({request["sampling_params"]["max_new_tokens"] for request in sent}) > 1
