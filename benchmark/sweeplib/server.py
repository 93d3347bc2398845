"""Start, health-check, query and stop one sglang server (the benchmark's, the kernel profiler's
and the GPU tests' lifecycle)."""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

HEALTH_POLL_S = 1.0
STOP_WAIT_S = 30.0
MAX_LOG_LINE_CHARS = 500  # sglang logs all server args on one line of several KB
KV_ALLOCATED = "KV Cache is allocated"


class ServerError(RuntimeError):
    """The server died or did not become healthy in time; the message carries its log tail."""


@dataclass
class RunningServer:
    config: str
    process: subprocess.Popen
    log_path: Path
    base_url: str


def base_url_of(host: str, port: int) -> str:
    return f"http://{host}:{port}"


def log_tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a log, each cut to MAX_LOG_LINE_CHARS characters."""
    if not path.exists():
        return ""
    with path.open(errors="replace") as log:
        last = deque(log, maxlen=lines)
    return "".join(line if len(line) <= MAX_LOG_LINE_CHARS else line[:MAX_LOG_LINE_CHARS] + " [...]\n" for line in last)


def start_server(config: str, command: list[str], env: dict[str, str], log_path: Path, base_url: str) -> RunningServer:
    """Launch the server in its own process group, so that stopping it also ends its workers."""
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, **env}, start_new_session=True)
    return RunningServer(config, process, log_path, base_url)


def http_get(url: str, timeout_s: float) -> tuple[int, bytes]:
    """(status, body); status 0 where nothing (or no HTTP server: a self-connected socket) answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, b""
    except (OSError, http.client.HTTPException):  # URLError, connection errors, timeouts, non-HTTP
        return 0, b""


def _wait(server: RunningServer, ready, goal: str, timeout_s: float, tail_lines: int) -> float:
    """Seconds until ``ready()``; ServerError with the log tail if the server exits or time runs out."""
    started = time.monotonic()
    while True:
        waited = time.monotonic() - started
        exit_code = server.process.poll()
        if exit_code is None and ready():
            return waited
        if exit_code is not None or waited > timeout_s:
            problem = f"exited with code {exit_code}" if exit_code is not None else f"not {goal}"
            raise ServerError(f"[{server.config}] server {problem} after {waited:.0f} s; last log lines:\n"
                              f"{log_tail(server.log_path, tail_lines)}")
        time.sleep(HEALTH_POLL_S)


def wait_until_healthy(server: RunningServer, timeout_s: float, tail_lines: int) -> float:
    """Until /health answers 200 (sglang answers 503 until its own warm-up request is done)."""
    return _wait(server, lambda: http_get(server.base_url + "/health", 5.0)[0] == 200, "healthy", timeout_s, tail_lines)


def wait_until_kv_allocated(server: RunningServer, pools: int, timeout_s: float, tail_lines: int) -> float:
    """Until the log says ``pools`` times that a KV cache is allocated (sglang 0.5.17 loads the
    target's and the draft's weights, then allocates both pools within a second), or the server is
    healthy: a next server on the GPU then sizes its pool from what is left."""
    def ready() -> bool:
        log = server.log_path.read_text(errors="replace") if server.log_path.exists() else ""
        return log.count(KV_ALLOCATED) >= pools or http_get(server.base_url + "/health", 5.0)[0] == 200

    return _wait(server, ready, "done allocating its KV cache", timeout_s, tail_lines)


def stop_server(server: RunningServer) -> None:
    """SIGKILL the server's process group and wait until it is gone (its GPU memory free). No
    SIGTERM first: sglang 0.5.17 answers one with a crash path that costs about 7 s per server.
    A process group, not sglang's kill_process_tree: it also reaches workers whose parent died."""
    pgid = server.process.pid  # start_new_session made the server its group leader
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        server.process.poll()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        time.sleep(0.2)
    logger.warning("[%s] server process group %d still alive %.0f s after SIGKILL", server.config, pgid, STOP_WAIT_S)


def server_is_running(server: RunningServer) -> bool:
    return server.process.poll() is None


def fetch_server_info(base_url: str, timeout_s: float = 30.0) -> dict | None:
    """GET /server_info (the handler behind the deprecated /get_server_info); None on failure."""
    status, body = http_get(base_url + "/server_info", timeout_s=timeout_s)
    try:
        info = json.loads(body) if status == 200 else None
    except json.JSONDecodeError:
        return None
    return info if isinstance(info, dict) else None


def effective_max_running_requests(server_info: dict | None) -> int | None:
    """The scheduler's request cap (EAGLE-family servers lower it to 48 unless
    --max-running-requests is given), else the resolved server argument."""
    for state in (server_info or {}).get("internal_states") or []:
        if isinstance(state, dict) and state.get("effective_max_running_requests_per_dp") is not None:
            return int(state["effective_max_running_requests_per_dp"])
    value = (server_info or {}).get("max_running_requests")
    return int(value) if value is not None else None
