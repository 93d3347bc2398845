"""Server start, health, queries and stop (benchmark/sweeplib/server.py)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib import server  # noqa: E402


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


def log_writer(lines: list[str], delay_s: float) -> str:
    """A stand-in server that writes each line after ``delay_s`` and then idles."""
    return ("import sys, time\n"
            f"for line in {lines!r}:\n"
            f"    time.sleep({delay_s}); print(line, flush=True)\n"
            "time.sleep(600)\n")


def test_the_next_server_waits_for_every_kv_pool_of_the_one_before(tmp_path):
    """A speculative server allocates two pools (target and draft), a plain one one; the wait ends
    at the last, or fails with the log tail if the server exits first."""
    lines = ["Load weight end.", f"{server.KV_ALLOCATED}. #tokens: 120000", f"{server.KV_ALLOCATED}. #tokens: 120000"]
    running = server.start_server("spec", [sys.executable, "-c", log_writer(lines, 0.3)], {}, tmp_path / "a.log",
                                  server.base_url_of("127.0.0.1", 1))
    try:
        waited = server.wait_until_kv_allocated(running, pools=2, timeout_s=30, tail_lines=5)
        assert waited >= 0.8 and (tmp_path / "a.log").read_text().count(server.KV_ALLOCATED) == 2
    finally:
        server.stop_server(running)
    dying = server.start_server("dying", [sys.executable, "-c", "print('out of memory')"], {}, tmp_path / "b.log",
                                server.base_url_of("127.0.0.1", 1))
    with pytest.raises(server.ServerError, match="out of memory"):
        server.wait_until_kv_allocated(dying, pools=1, timeout_s=30, tail_lines=5)


def test_an_answer_that_is_not_http_reads_as_nothing_answered():
    """Polling a port nobody listens on can connect the socket to itself (an ephemeral port), so
    the request comes back as the 'status line': that is no server, not a crash of the poll (a CI
    run of the out-of-memory test died on it)."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def echo_once():
        connection, _ = listener.accept()
        with connection:
            connection.sendall(connection.recv(1024))  # what a self-connected socket reads back

    thread = threading.Thread(target=echo_once, daemon=True)
    thread.start()
    try:
        assert server.http_get(f"http://127.0.0.1:{listener.getsockname()[1]}/health", 5.0) == (0, b"")
    finally:
        thread.join(5)
        listener.close()
