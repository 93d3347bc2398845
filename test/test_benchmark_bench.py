"""bench_serving's result lines as metrics, and the bench driver process (benchmark/sweeplib/bench.py)."""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib import bench  # noqa: E402
from sweeplib.workloads import Segment  # noqa: E402
from benchmark_helpers import bench_line, flag_values  # noqa: E402


def test_segment_flags_carry_the_runs_shape():
    poisson = flag_values(["bench_serving", *bench.segment_flags(Segment(1024, 512, 80, rate=4.0, range_ratio=0.25),
                                                                  "tok", "127.0.0.1", 30001, 7, "out.jsonl")])
    assert poisson["--request-rate"] == ("4.0",) and poisson["--num-prompts"] == ("80",)
    assert poisson["--random-range-ratio"] == ("0.25",) and "--max-concurrency" not in poisson
    assert (poisson["--port"], poisson["--seed"], poisson["--dataset-name"]) == (("30001",), ("7",), ("random-ids",))
    closed = flag_values(["x", *bench.segment_flags(Segment(512, 256, 8, concurrency=4), "tok", "h", 1, 1, "o",
                                                    ("--tokenize-prompt",))])
    assert closed["--max-concurrency"] == ("4",) and closed["--request-rate"] == ("inf",)
    assert "--tokenize-prompt" in closed and "--flush-cache" in closed and "--output-details" in closed


def test_a_shared_prefix_segment_asks_bench_serving_for_its_groups_instead_of_random_ids():
    shared = flag_values(["x", *bench.segment_flags(Segment(256, 512, 32, 6.0, range_ratio=0.25, groups=8,
                                                            prefix_len=2048), "tok", "h", 1, 1, "o")])
    assert shared["--dataset-name"] == ("generated-shared-prefix",) and not any("--random" in f for f in shared)
    assert (shared["--gsp-num-groups"], shared["--gsp-prompts-per-group"]) == (("8",), ("4",))
    assert (shared["--gsp-system-prompt-len"], shared["--gsp-question-len"], shared["--gsp-output-len"]) == (
        ("2048",), ("256",), ("512",))
    assert shared["--gsp-range-ratio"] == ("0.25",) and shared["--request-rate"] == ("6.0",)


def test_request_stats_rebuild_each_requests_ttft_tpot_and_latency():
    line = bench_line([0.02, 0.5, 0.0], [[0.01] * 9, [], []], errors=["", "", "refused"])
    stats = bench.request_stats(line)
    assert stats["ok"] == [True, True, False]
    assert stats["output_len"] == [10, 1, 0]
    assert stats["tpot_s"][0] == pytest.approx(0.01) and stats["tpot_s"][1] is None
    assert stats["e2e_s"][:2] == pytest.approx([0.02 + 0.09, 0.5])
    assert "ttfts" not in bench.raw_row(line) and bench.raw_row(line)["duration"] == 10.0


def test_a_request_answered_without_a_streamed_token_is_not_ok():
    """A prompt over the model's context length: bench_serving counts it completed, with TTFT 0
    and no inter-token latencies (seen on the GPU machine, 2026-12-04)."""
    line = {"errors": ["", ""], "output_lens": [256, 256], "ttfts": [0.0, 0.05], "itls": [[], [0.01] * 255]}
    assert bench.request_stats(line)["ok"] == [False, True]


@pytest.mark.parametrize("seed", range(5))
def test_percentiles_are_numpys_as_bench_serving_computes_them(seed):
    rng = random.Random(seed)
    values = [rng.random() for _ in range(rng.randrange(1, 50))]
    for q in (50, 90, 99):
        assert bench.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert bench.percentile([], 50) is None


def test_workload_metrics_pool_every_run_and_count_goodput_against_the_tpot_target():
    fast = bench_line([0.1] * 3, [[0.02] * 10] * 3, duration=4.0)
    slow = bench_line([0.3, 0.3], [[0.08] * 10, [0.04] * 10], duration=6.0)
    failed = bench_line([0.0], [[]], errors=["timeout"], duration=0.0)
    segments = [{"bench": bench.raw_row(line), "requests": bench.request_stats(line)} for line in (fast, slow, failed)]
    metrics = bench.workload_metrics(segments, goodput_tpot_ms=50.0)
    assert (metrics["requests"], metrics["completed"], metrics["duration"]) == (6, 5, 10.0)
    assert metrics["request_throughput"] == pytest.approx(0.5)
    assert metrics["output_throughput"] == pytest.approx(5 * 11 / 10.0)
    assert metrics["goodput"] == pytest.approx(4 / 10.0)  # the 80 ms request misses 50 ms; the failed one counts not
    assert bench.workload_metrics(segments, goodput_tpot_ms=100.0)["goodput"] == pytest.approx(0.5)
    assert metrics["median_ttft_ms"] == pytest.approx(100.0)
    assert metrics["p99_tpot_ms"] == pytest.approx(float(np.percentile([20, 20, 20, 80, 40], 99)))
    assert metrics["median_e2e_latency_ms"] == pytest.approx(100 + 200)


def test_a_request_whose_whole_output_came_in_one_chunk_has_no_first_token_time():
    """sglang's detokenizer holds back text that ends mid-character, and bench_serving stamps the first token
    at the first chunk with text: a dummy model's answer held to its end reads TTFT = E2E (1.7 s here, among
    40 ms neighbours). Its TTFT and TPOT are left out, its throughput and E2E kept; a one-token answer and
    one with a single later chunk still count."""
    line = bench_line([0.04, 0.04, 1.7, 0.05, 0.04], [[0.005] * 9, [0.005] * 9, [], [], [0.3]])
    line["output_lens"] = [10, 10, 363, 1, 2]
    segment = {"bench": bench.raw_row(line), "requests": bench.request_stats(line)}
    assert bench.first_tokens_s(segment["requests"]) == [0.04, 0.04, None, 0.05, 0.04]
    metrics = bench.workload_metrics([segment], goodput_tpot_ms=50.0)
    assert metrics["completed"] == 5 and metrics["total_output_tokens"] == 386
    assert metrics["p99_ttft_ms"] == pytest.approx(float(np.percentile([40, 40, 50, 40], 99)))
    assert metrics["p99_tpot_ms"] == pytest.approx(float(np.percentile([5, 5, 300], 99)))
    assert metrics["p99_e2e_latency_ms"] == pytest.approx(float(np.percentile([85, 85, 1700, 50, 340], 99)))
    failed = {"ok": [False, True], "ttft_s": [0.0, 0.1], "output_len": [0, 5], "tpot_s": [None, 0.01]}
    assert bench.first_tokens_s(failed) == [None, 0.1]
    assert bench.first_tokens_s({"ok": [True], "ttft_s": [0.1]}) == [0.1]  # older records: TTFT alone


def client(tmp_path: Path, script: str) -> bench.BenchClient:
    path = tmp_path / "driver.py"
    path.write_text(script)
    return bench.BenchClient(tmp_path / "driver.log", command=[sys.executable, str(path)])


ECHO = "import json, sys\nfor line in sys.stdin:\n    print(json.dumps({'ok': True, 'error': None, " \
       "'after_warmup': json.loads(line)}), flush=True)\n"


def test_the_driver_process_answers_each_run_in_turn_and_is_reused(tmp_path):
    driver = client(tmp_path, ECHO)
    first = driver.run(["--num-prompts", "1"], True, timeout_s=30)
    process = driver.process
    second = driver.run(["--num-prompts", "2"], False, timeout_s=30)
    assert first["after_warmup"] == {"flags": ["--num-prompts", "1"], "visible_special_tokens": True}
    assert second["after_warmup"]["flags"] == ["--num-prompts", "2"] and driver.process is process
    driver.close()


def test_a_run_is_stopped_at_its_timeout_or_when_the_server_dies(tmp_path):
    driver = client(tmp_path, "import sys, time\nfor line in sys.stdin:\n    time.sleep(60)\n")
    started = time.monotonic()
    assert driver.run([], False, timeout_s=0.5)["error"] == "timeout"
    assert time.monotonic() - started < 10 and driver.process is None
    assert driver.run([], False, timeout_s=30, alive=lambda: False)["error"] == "server died"
    crashing = client(tmp_path, "import sys\nsys.stdin.readline()\nsys.exit(3)\n")
    assert crashing.run([], False, timeout_s=30)["error"] == "bench driver exited with 3"

