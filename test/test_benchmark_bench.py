"""Running bench_serving and reading its result lines (benchmark/sweeplib/bench.py, bench_driver.py)."""

from __future__ import annotations

import json
import statistics
import sys
import time
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib import bench, bench_driver  # noqa: E402
from benchmark_helpers import bench_result_line  # noqa: E402


def test_parse_bench_result_reads_metrics_and_ttft_details():
    ttfts = [0.020, 0.690, 0.700, 0.030]
    itls = [[0.005] * 255, [], [], [0.005] * 255]
    line = bench_result_line(1234.5, ttfts, itls, e2e_ms=700.0, accept_length=3.0)
    parsed = bench.parse_bench_result(json.loads(json.dumps(line)))
    for key in bench.RECORDED_METRICS:
        assert parsed.metrics[key] == line[key]
    diag = parsed.ttft_diagnostics
    assert diag["first_request_ttft_ms"] == pytest.approx(ttfts[0] * 1000)
    assert diag["median_ttft_excluding_first_ms"] == pytest.approx(statistics.median(ttfts[1:]) * 1000)
    assert diag["requests_with_text_only_in_last_chunk"] == sum(1 for i in itls if not i)
    assert diag["requests_without_visible_text"] == 0
    assert diag["median_ttft_to_median_e2e"] == pytest.approx(line["median_ttft_ms"] / 700.0)
    deciles = diag["ttft_deciles_ms"]
    assert len(deciles) == 9 and deciles == sorted(deciles)
    assert deciles[0] >= 20.0 and deciles[-1] <= 700.0


def test_requests_that_never_show_text_are_counted_apart():
    line = bench_result_line(100.0, [0.0, 0.5, 0.0], [[], [], []])
    diag = bench.parse_bench_result(line).ttft_diagnostics
    assert diag["requests_without_visible_text"] == 2
    assert diag["first_request_ttft_ms"] is None
    assert diag["requests_with_text_only_in_last_chunk"] == 1
    assert diag["ttft_deciles_ms"] is None  # one visible request has no spread


def test_read_new_lines_returns_only_complete_new_lines(tmp_path):
    path = tmp_path / "bench.jsonl"
    assert bench.read_new_lines(path, 0) == ([], 0)
    path.write_text(json.dumps({"c": 1}) + "\n" + '{"c": ')
    lines, offset = bench.read_new_lines(path, 0)
    assert [json.loads(line) for line in lines] == [{"c": 1}]
    with path.open("a") as file:
        file.write('4}\n')
    lines, offset = bench.read_new_lines(path, offset)
    assert [json.loads(line) for line in lines] == [{"c": 4}]
    assert bench.read_new_lines(path, offset) == ([], offset)


def fake_driver(tmp_path: Path, lines: list[dict], sleep_s: float) -> tuple[list[str], Path]:
    """A stand-in for bench_driver.py that appends result lines like bench_serving does."""
    output = tmp_path / "bench.jsonl"
    script = (
        "import json, sys, time\n"
        f"for line in {lines!r}:\n"
        f"    time.sleep({sleep_s})\n"
        f"    open({str(output)!r}, 'a').write(json.dumps(line) + '\\n')\n"
    )
    return [sys.executable, "-c", script], output


def test_run_bench_driver_reports_each_result_line(tmp_path):
    lines = [{"max_concurrency": c} for c in (1, 4, 16)]
    command, output = fake_driver(tmp_path, lines, sleep_s=0.1)
    seen = []
    exit_code = bench.run_bench_driver(command, [(output, seen.append)], tmp_path / "driver.log", 60.0,
                                       server_alive=lambda: True)
    assert exit_code == 0 and seen == lines


def test_run_bench_driver_reads_every_watched_file_in_order(tmp_path):
    first, second = tmp_path / "warmup.jsonl", tmp_path / "bench.jsonl"
    script = (
        "import json, time\n"
        f"for path, c in [({str(first)!r}, 1), ({str(first)!r}, 4), ({str(second)!r}, 1)]:\n"
        "    time.sleep(0.1)\n"
        "    open(path, 'a').write(json.dumps({'max_concurrency': c}) + '\\n')\n"
    )
    seen = []
    exit_code = bench.run_bench_driver(
        [sys.executable, "-c", script],
        [(first, lambda line: seen.append(("warm-up", line["max_concurrency"]))),
         (second, lambda line: seen.append(("measured", line["max_concurrency"])))],
        tmp_path / "driver.log", 60.0, server_alive=lambda: True)
    assert exit_code == 0
    assert seen == [("warm-up", 1), ("warm-up", 4), ("measured", 1)]


def test_run_bench_driver_stops_when_the_server_dies_or_time_runs_out(tmp_path):
    command, output = fake_driver(tmp_path, [{"max_concurrency": 1}], sleep_s=30)
    log = tmp_path / "driver.log"
    started = time.monotonic()
    assert bench.run_bench_driver(command, [(output, print)], log, 60.0,
                                  server_alive=lambda: False) == bench.SERVER_DIED_EXIT_CODE
    assert bench.run_bench_driver(command, [(output, print)], log, 0.5,
                                  server_alive=lambda: True) == bench.TIMEOUT_EXIT_CODE
    assert time.monotonic() - started < 20


def test_driver_runs_every_group_with_its_own_flags(monkeypatch):
    from sglang.benchmark import serving

    calls = []
    monkeypatch.setattr(serving, "flush_server_cache", serving.flush_server_cache)
    monkeypatch.setattr(serving, "cli_main", lambda: calls.append(sys.argv[1:]))
    monkeypatch.setattr(sys, "argv", ["pytest"])
    argv = ["1:1", "--", "--warm", bench_driver.GROUP_SEPARATOR, "1:4", "4:8", "--", "--measured"]
    assert bench_driver.main(argv) == 0
    assert calls == [
        ["--warm", "--max-concurrency", "1", "--num-prompts", "1"],
        ["--measured", "--max-concurrency", "1", "--num-prompts", "4"],
        ["--measured", "--max-concurrency", "4", "--num-prompts", "8"],
    ]
    assert serving.flush_server_cache is bench_driver.flush_when_idle


def test_driver_goes_on_after_bench_serving_exits(monkeypatch):
    from sglang.benchmark import serving

    calls = []

    def cli_main():
        calls.append(sys.argv[1:])
        if "--warm" in sys.argv:
            sys.exit(1)  # what bench_serving does when the server is not ready

    monkeypatch.setattr(serving, "flush_server_cache", serving.flush_server_cache)
    monkeypatch.setattr(serving, "cli_main", cli_main)
    monkeypatch.setattr(sys, "argv", ["pytest"])
    argv = ["1:1", "--", "--warm", bench_driver.GROUP_SEPARATOR, "1:4", "--", "--measured"]
    assert bench_driver.main(argv) == 1
    assert [call[0] for call in calls] == ["--warm", "--measured"]


class FakeRequests:
    """The parts of `requests` that flush_when_idle uses, answering like an sglang server."""

    RequestException = OSError

    def __init__(self, server_info: dict | None) -> None:
        self.server_info = server_info
        self.calls: list[str] = []

    def post(self, url, params=None, timeout=None):
        self.calls.append(f"POST {url}")
        return types.SimpleNamespace(raise_for_status=lambda: None)

    def get(self, url, timeout=None):
        self.calls.append(f"GET {url}")
        if self.server_info is None:
            raise OSError("connection refused")
        return types.SimpleNamespace(json=lambda: self.server_info)


def test_each_runs_state_after_bench_servings_warm_up_is_recorded(monkeypatch, tmp_path):
    """The flush after bench_serving's warm-up request is followed by a /server_info snapshot,
    appended to the run's after-warm-up file with the run's concurrency."""
    from sglang.benchmark import serving

    output = tmp_path / "bench.jsonl"
    fake = FakeRequests({"internal_states": [{"dynamic_eagle": {"speculative_steps": 7}}]})
    monkeypatch.setitem(sys.modules, "requests", fake)
    monkeypatch.setattr(serving, "cli_main",
                        lambda: serving.flush_server_cache("http://h:1", "sglang"))
    monkeypatch.setattr(sys, "argv", ["pytest"])
    assert bench_driver.main(["1:4", "8:16", "--", "--output-file", str(output)]) == 0
    lines = [json.loads(line) for line in
             Path(bench_driver.after_warmup_file(str(output))).read_text().splitlines()]
    assert [line["max_concurrency"] for line in lines] == [1, 8]
    assert lines[0]["server_info"]["internal_states"][0]["dynamic_eagle"] == {"speculative_steps": 7}
    assert fake.calls[:2] == ["POST http://h:1/flush_cache", "GET http://h:1/server_info"]


def test_a_failed_snapshot_leaves_the_run_without_one(monkeypatch, tmp_path):
    from sglang.benchmark import serving

    output = tmp_path / "bench.jsonl"
    monkeypatch.setitem(sys.modules, "requests", FakeRequests(None))
    monkeypatch.setattr(serving, "cli_main",
                        lambda: serving.flush_server_cache("http://h:1", "sglang"))
    monkeypatch.setattr(sys, "argv", ["pytest"])
    assert bench_driver.main(["1:4", "--", "--output-file", str(output)]) == 0
    assert not Path(bench_driver.after_warmup_file(str(output))).exists()
