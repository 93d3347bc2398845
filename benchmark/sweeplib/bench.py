"""Run `python -m sglang.bench_serving` at one concurrency and read its JSONL result line."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass

# Keys of the result line that bench_serving (sglang/benchmark/serving.py) appends to
# --output-file. TTFT, TPOT, ITL and E2E are in milliseconds; accept_length is the server's
# avg_spec_accept_length since its last cache flush (None without speculation).
RECORDED_METRICS: tuple[str, ...] = (
    "completed",
    "duration",
    "total_output_tokens",
    "output_throughput",
    "request_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_e2e_latency_ms",
    "accept_length",
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
class BenchResult:
    metrics: dict
    ttft_diagnostics: dict


def prompts_for_concurrency(concurrency: int, waves: int, min_prompts: int) -> int:
    """`waves` full batches of requests, at least `min_prompts`."""
    return max(min_prompts, waves * concurrency)


def visible_special_tokens_body(output_len: int) -> dict:
    """A request body that keeps bench_serving's sampling parameters and adds
    skip_special_tokens=False, so a first token that decodes to a special token still
    produces visible text (see benchmark/README.md, "TTFT under simulated acceptance").

    --extra-request-body replaces the whole "sampling_params" object of the sglang backend, so
    the harness repeats what bench_serving would send: greedy, ignore_eos, max_new_tokens.
    This is exact because every request has the same output length (range ratio 1.0).
    """
    return {
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": output_len,
            "ignore_eos": True,
            "skip_special_tokens": False,
        }
    }


def bench_command(
    settings: BenchSettings,
    host: str,
    port: int,
    concurrency: int,
    num_prompts: int,
    output_file: str,
) -> list[str]:
    command = [
        settings.python, "-m", "sglang.bench_serving",
        "--backend", "sglang",
        "--host", host,
        "--port", str(port),
        "--dataset-name", "random-ids",
        "--tokenizer", settings.tokenizer,
        "--random-input-len", str(settings.input_len),
        "--random-output-len", str(settings.output_len),
        "--random-range-ratio", "1.0",
        "--num-prompts", str(num_prompts),
        "--max-concurrency", str(concurrency),
        "--seed", str(settings.seed),
        "--output-file", output_file,
        "--output-details",
        "--flush-cache",
        "--disable-tqdm",
    ]
    if settings.visible_special_tokens:
        command += [
            "--extra-request-body",
            json.dumps(visible_special_tokens_body(settings.output_len)),
        ]
    return command + list(settings.extra_args)


def run_bench_command(command: list[str], timeout_s: float) -> tuple[int, str]:
    """Run bench_serving; return its exit code (124 on timeout) and its combined output."""
    try:
        completed = subprocess.run(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as timeout:
        output = timeout.output or ""
        if isinstance(output, bytes):
            output = output.decode(errors="replace")
        return 124, output
    return completed.returncode, completed.stdout


def last_json_line(text: str) -> dict | None:
    lines = [line for line in text.splitlines() if line.strip()]
    return json.loads(lines[-1]) if lines else None


def ttft_diagnostics(result_line: dict) -> dict:
    """Per-request TTFT facts from a line written with --output-details.

    bench_serving's sglang backend stamps TTFT at the first streamed chunk whose cumulative
    "text" is non-empty, and adds ITL entries only for later chunks. A request whose text first
    appears in its last chunk therefore has no ITL entries and a TTFT close to its latency; a
    request whose text stays empty keeps TTFT 0.
    """
    ttfts_s = result_line.get("ttfts") or []
    itls_s = result_line.get("itls") or []
    output_lens = result_line.get("output_lens") or []
    errors = result_line.get("errors") or [""] * len(ttfts_s)
    succeeded = [i for i in range(len(ttfts_s)) if not errors[i]]
    visible = [i for i in succeeded if ttfts_s[i] > 0]
    later_ttfts_ms = [ttfts_s[i] * 1000 for i in visible if i != 0]
    median_ttft = result_line.get("median_ttft_ms")
    median_e2e = result_line.get("median_e2e_latency_ms")
    return {
        "first_request_ttft_ms": ttfts_s[0] * 1000 if 0 in visible else None,
        "median_ttft_excluding_first_ms": statistics.median(later_ttfts_ms) if later_ttfts_ms else None,
        "requests_without_visible_text": len(succeeded) - len(visible),
        "requests_with_text_only_in_last_chunk": sum(
            1 for i in visible if not itls_s[i] and output_lens[i] > 1
        ),
        "median_ttft_to_median_e2e": (
            median_ttft / median_e2e if median_ttft is not None and median_e2e else None
        ),
    }


def parse_bench_result(result_line: dict) -> BenchResult:
    return BenchResult(
        metrics={key: result_line.get(key) for key in RECORDED_METRICS},
        ttft_diagnostics=ttft_diagnostics(result_line),
    )
