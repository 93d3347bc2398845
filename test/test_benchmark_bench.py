"""Running the bench driver and reading its result lines (benchmark/sweeplib/bench.py)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib import bench  # noqa: E402
from benchmark_helpers import bench_result_line  # noqa: E402


def test_result_line_metrics_and_ttft_details():
    ttfts = [0.020, 0.690, 0.700, 0.030]
    itls = [[0.005] * 255, [], [], [0.005] * 255]
    line = bench_result_line(1234.5, ttfts, itls, e2e_ms=700.0, accept_length=3.0)
    line = json.loads(json.dumps(line))
    metrics = bench.recorded_metrics(line)
    for key in bench.RECORDED_METRICS:
        assert metrics[key] == line[key]
    diag = bench.ttft_diagnostics(line)
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
    diag = bench.ttft_diagnostics(line)
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
