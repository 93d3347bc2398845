"""Drive sglang.bench_serving (through bench_driver.py) and read its JSONL result lines."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sweeplib import bench_driver

DRIVER_PATH = Path(__file__).resolve().with_name("bench_driver.py")
TIMEOUT_EXIT_CODE = 124
SERVER_DIED_EXIT_CODE = -1
POLL_S = 0.5

# Keys of bench_serving's result line (sglang/benchmark/serving.py); times in ms, accept_length
# is the server's avg_spec_accept_length since its last cache flush (None without speculation).
RECORDED_METRICS = (
    "completed", "duration", "total_output_tokens", "output_throughput", "request_throughput",
    "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
    "p99_itl_ms", "median_e2e_latency_ms", "accept_length",
)


@dataclass(frozen=True)
class BenchSettings:
    """bench_serving arguments shared by every run of a sweep."""

    tokenizer: str
    input_len: int
    output_len: int
    seed: int
    visible_special_tokens: bool
    extra_args: tuple[str, ...]
    python: str = sys.executable


@dataclass(frozen=True)
class RunGroup:
    """Runs of bench_serving that share its flags and result file."""

    settings: BenchSettings
    runs: tuple[tuple[int, int], ...]  # (concurrency, prompts), in order
    output_file: str


def prompts_for_concurrency(concurrency: int, waves: int, min_prompts: int) -> int:
    return max(min_prompts, waves * concurrency)


def visible_special_tokens_body(output_len: int) -> dict:
    """bench_serving's sampling parameters plus skip_special_tokens=False (benchmark/README.md,
    "TTFT"): --extra-request-body replaces the sglang backend's whole "sampling_params", so
    this repeats greedy, ignore_eos and max_new_tokens (exact: every request has this length)."""
    return {"sampling_params": {"temperature": 0.0, "max_new_tokens": output_len,
                                "ignore_eos": True, "skip_special_tokens": False}}


def bench_serving_flags(settings: BenchSettings, host: str, port: int, output_file: str) -> list[str]:
    """bench_serving flags of every run of one server (concurrency and prompts excluded)."""
    flags = [
        "--backend", "sglang", "--host", host, "--port", str(port),
        "--dataset-name", "random-ids", "--tokenizer", settings.tokenizer,
        "--random-input-len", str(settings.input_len), "--random-output-len", str(settings.output_len),
        "--random-range-ratio", "1.0", "--seed", str(settings.seed), "--output-file", output_file,
        "--output-details", "--flush-cache", "--disable-tqdm",
    ]
    if settings.visible_special_tokens:
        flags += ["--extra-request-body", json.dumps(visible_special_tokens_body(settings.output_len))]
    return flags + list(settings.extra_args)


def bench_driver_command(groups: Sequence[RunGroup], host: str, port: int) -> list[str]:
    """One driver process for every run of every group, group after group, against one server."""
    return bench_driver_command_per_port([(group, port) for group in groups], host)


def bench_driver_command_per_port(groups: Sequence[tuple[RunGroup, int]], host: str) -> list[str]:
    """One driver process for every run of every group, each group against the server on its port."""
    command = [groups[0][0].settings.python, str(DRIVER_PATH)]
    for index, (group, port) in enumerate(groups):
        command += [bench_driver.GROUP_SEPARATOR] if index else []
        command += [f"{concurrency}:{prompts}" for concurrency, prompts in group.runs]
        command += ["--", *bench_serving_flags(group.settings, host, port, group.output_file)]
    return command


def read_new_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """Complete lines appended to `path` after byte `offset`, and the offset after them."""
    if not path.exists():
        return [], offset
    with path.open("rb") as file:
        file.seek(offset)
        data = file.read()
    complete = data[: data.rfind(b"\n") + 1]
    return [line.decode() for line in complete.splitlines() if line.strip()], offset + len(complete)


def run_bench_driver(command: list[str], watched: Sequence[tuple[Path, Callable[[dict], None]]],
                     driver_log: Path, timeout_s: float, server_alive: Callable[[], bool]) -> int:
    """Run the driver, calling each (result file, callback) of `watched` with every line of that
    file as soon as it is written. Returns the driver's exit code, TIMEOUT_EXIT_CODE if it was
    killed at the timeout, or SERVER_DIED_EXIT_CODE if it was killed because the server died
    (bench_serving would wait a minute for the dead server at every remaining concurrency)."""
    deadline = time.monotonic() + timeout_s
    offsets = [0] * len(watched)
    with driver_log.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        exit_code = None
        while exit_code is None:
            exit_code = process.poll()
            if exit_code is None and time.monotonic() > deadline:
                exit_code = TIMEOUT_EXIT_CODE
            elif exit_code is None and not server_alive():
                exit_code = SERVER_DIED_EXIT_CODE
            if exit_code is not None:  # stopped before the last read: nothing is written after it
                process.kill()
                process.wait()
            for index, (output_file, on_result) in enumerate(watched):
                lines, offsets[index] = read_new_lines(output_file, offsets[index])
                for line in lines:
                    on_result(json.loads(line))
            if exit_code is None:
                time.sleep(POLL_S)
        return exit_code
    finally:  # also when the sweep itself is stopped (a no-op after the driver's exit)
        process.kill()
        process.wait()


def ttft_diagnostics(result_line: dict) -> dict:
    """Per-request TTFT facts from a line written with --output-details. bench_serving stamps
    TTFT at the first chunk with non-empty text and adds ITL entries only for later chunks, so
    a request whose text came in its last chunk has no ITL entries, one that never showed text
    TTFT 0."""
    ttfts_s = result_line.get("ttfts") or []
    itls_s = result_line.get("itls") or []
    output_lens = result_line.get("output_lens") or []
    errors = result_line.get("errors") or [""] * len(ttfts_s)
    succeeded = [i for i in range(len(ttfts_s)) if not errors[i]]
    visible = [i for i in succeeded if ttfts_s[i] > 0]
    later_ttfts_ms = [ttfts_s[i] * 1000 for i in visible if i != 0]
    visible_ttfts_ms = sorted(ttfts_s[i] * 1000 for i in visible)
    median_ttft, median_e2e = result_line.get("median_ttft_ms"), result_line.get("median_e2e_latency_ms")
    return {
        "first_request_ttft_ms": ttfts_s[0] * 1000 if 0 in visible else None,
        "median_ttft_excluding_first_ms": statistics.median(later_ttfts_ms) if later_ttfts_ms else None,
        "requests_without_visible_text": len(succeeded) - len(visible),
        "requests_with_text_only_in_last_chunk": sum(1 for i in visible if not itls_s[i] and output_lens[i] > 1),
        "median_ttft_to_median_e2e": median_ttft / median_e2e if median_ttft is not None and median_e2e else None,
        # Bursts of arrivals queue behind each other's prefills: a median alone can sit on the
        # edge between two bursts.
        "ttft_deciles_ms": (
            [round(q, 1) for q in statistics.quantiles(visible_ttfts_ms, n=10, method="inclusive")]
            if len(visible_ttfts_ms) >= 2 else None),
    }


def recorded_metrics(result_line: dict) -> dict:
    return {key: result_line.get(key) for key in RECORDED_METRICS}
