"""The server helpers and the TTFT probe (benchmark/sweeplib/server.py, ttft_probe.py)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib import server, ttft_probe  # noqa: E402


def sse(data: dict) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n"


def test_probe_separates_token_and_text_ttft():
    stream = [
        (0.020, sse({"text": "", "output_ids": [50000], "meta_info": {"completion_tokens": 1}})),
        (0.021, b"\n"),
        (0.030, sse({"text": "", "output_ids": [50000, 100, 100, 100], "meta_info": {"completion_tokens": 4}})),
        (0.690, sse({"text": "\ufffd" * 5, "output_ids": [50000] + [100] * 4, "meta_info": {"completion_tokens": 5}})),
        (0.691, b"data: [DONE]\n"),
    ]
    chunks = [c for c in (ttft_probe.parse_sse_line(line, t) for t, line in stream) if c is not None]
    timing = ttft_probe.summarize_chunks(chunks, e2e_s=0.692)
    assert timing.token_ttft_ms == pytest.approx(20.0)
    assert timing.text_ttft_ms == pytest.approx(690.0)
    assert timing.first_output_id == 50000
    assert timing.completion_tokens == 5 and timing.chunks == 3


def test_probe_summary_splits_cold_and_warm():
    timings = [ttft_probe.ProbeTiming(token_ttft_ms=t, text_ttft_ms=x, e2e_ms=e, completion_tokens=256,
                                      chunks=86, first_output_id=1)
               for t, x, e in ((900.0, 1500.0, 1600.0), (20.0, 690.0, 700.0), (24.0, 680.0, 705.0))]
    summary = ttft_probe.summarize_probe(timings)
    assert summary["cold_token_ttft_ms"] == 900.0
    assert summary["warm_median_token_ttft_ms"] == statistics.median([20.0, 24.0])
    assert summary["warm_median_text_ttft_ms"] == statistics.median([690.0, 680.0])
    assert len(summary["requests"]) == 3


def test_probe_prompts_differ_between_requests():
    first, second = (ttft_probe.probe_prompt_ids(512, 1, i) for i in (0, 1))
    assert len(first) == 512 and first != second
    assert min(first + second) >= ttft_probe.PROMPT_ID_LOW and max(first + second) < ttft_probe.PROMPT_ID_HIGH


def test_effective_max_running_requests_prefers_the_scheduler_value():
    info = {"max_running_requests": None, "internal_states": [{"effective_max_running_requests_per_dp": 48}]}
    assert server.effective_max_running_requests(info) == 48
    assert server.effective_max_running_requests({"max_running_requests": 128, "internal_states": []}) == 128
    assert server.effective_max_running_requests(None) is None


def test_log_tail_keeps_last_lines_and_cuts_long_ones(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i}\n" for i in range(300)) + "x" * 5000 + "\n")
    tail = server.log_tail(log, 10).splitlines()
    assert len(tail) == 10 and tail[0] == "line 291"
    assert len(tail[-1]) < 1000


# A stand-in server that ignores SIGTERM and starts a worker of its own, as sglang's launcher
# starts its scheduler and detokenizer.
STUBBORN_SERVER = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "worker = subprocess.Popen([sys.executable, '-c', "
    "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
    "print(worker.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def process_is_gone(pid: int) -> bool:
    """No such process, or a zombie left for init to reap."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_stop_server_ends_the_whole_group_without_waiting_on_sigterm(tmp_path):
    log_path = tmp_path / "server.log"
    running = server.start_server("stub", [sys.executable, "-c", STUBBORN_SERVER], {}, log_path,
                                  server.base_url_of("127.0.0.1", 1))
    deadline = time.monotonic() + 30
    while not log_path.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    worker_pid = int(log_path.read_text().split()[0])
    started = time.monotonic()
    server.stop_server(running)
    elapsed = time.monotonic() - started
    assert running.process.poll() is not None
    assert process_is_gone(worker_pid)
    # A SIGTERM-first stop would wait out its grace period on this server.
    assert elapsed < server.STOP_WAIT_S / 2
