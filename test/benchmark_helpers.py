"""Inputs for the benchmark tests, built the way sglang and bench_serving would."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib import bench, configs, results  # noqa: E402

SPECULATIVE_PREFIX = "--speculative-"
FAKES = Path(__file__).resolve().parent / "fakes"


def free_port(following: int = 3) -> int:
    """A free port whose next ``following`` ports are free too: the benchmark serves its
    configurations on consecutive ports from ``--port`` (a taken neighbour failed a test once)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base + following <= 65535 and all(_bindable(base + i) for i in range(1, following + 1)):
            return base


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def bench_line(ttfts_s: list[float], itls_s: list[list[float]], errors: list[str] | None = None,
               duration: float = 10.0, accept_length: float | None = None) -> dict:
    """A bench_serving result line as --output-details writes it (per-request lists included)."""
    errors = errors or [""] * len(ttfts_s)
    return {"backend": "sglang", "request_rate": float("inf"), "max_concurrency": 4, "duration": duration,
            "completed": errors.count(""), "accept_length": accept_length, "output_throughput": 1.0,
            "server_info": {"version": "0.5.17"}, "input_lens": [512] * len(ttfts_s),
            "output_lens": [0 if error else len(itls) + 1 for error, itls in zip(errors, itls_s)],
            "ttfts": ttfts_s, "itls": itls_s, "generated_texts": [""] * len(ttfts_s), "errors": errors}


def counters(spec: int, plain: int, to_plain: int = 0, to_spec: int = 0, catchup: int = 0,
             mean_accept: float = 2.5) -> dict:
    return {"speculative_steps": spec, "plain_steps": plain, "switches_to_plain": to_plain,
            "switches_to_speculative": to_spec, "catchup_tokens": catchup,
            "mean_accept_length": mean_accept}


def ok_run(config: str, concurrency: int, throughput: float, tpot: float = 5.0,
           delta: dict | None = None) -> dict:
    """A run record of the former sweep.py's result files (schema 1)."""
    return {
        "config": config, "concurrency": concurrency, "num_prompts": max(8, 3 * concurrency),
        "status": results.RUN_OK, "error": None, "wall_s": 1.0,
        "metrics": {"output_throughput": throughput, "request_throughput": throughput / 256,
                    "median_ttft_ms": 30.0, "p99_ttft_ms": 40.0, "median_tpot_ms": tpot,
                    "p99_tpot_ms": tpot * 1.5, "median_itl_ms": tpot, "p99_itl_ms": tpot * 2,
                    "median_e2e_latency_ms": 1000.0, "accept_length": None, "completed": 8},
        "mode_counters": {"before": None, "after": None, "delta": delta},
    }


def document_with(runs: list[dict], config_names: list[str], created: str = "2026-11-29T00:00:00+00:00") -> dict:
    """A result document of the former sweep.py (schema 1)."""
    settings = {"input_len": 512, "output_len": 256, "waves": 3, "min_prompts": 8}
    return {
        "schema_version": 1,
        "sources": [{"created": created, "command_line": "python benchmark/sweep.py run",
                     "gpu": "NVIDIA H200", "sglang_version": "0.5.17", "settings": settings}],
        "configs": {name: {"status": results.RUN_OK, "error": None, "server_command": ["python", name],
                           "server_env": {}, "startup_s": 60.0, "max_running_requests": 48,
                           "server_version": "0.5.17", "ttft_probe": None}
                    for name in config_names},
        "runs": runs,
    }


def traffic_run(config: str, workload: str, ttft_s: float, tpots_s: list[float], duration: float = 10.0,
                round_index: int = 0) -> dict:
    """A run record of benchmark/run.py: one segment whose requests have these TPOTs (17 tokens each)."""
    line = bench_line([ttft_s] * len(tpots_s), [[tpot] * 16 for tpot in tpots_s], duration=duration)
    segment = {"bench": bench.raw_row(line), "requests": bench.request_stats(line)}
    return {"config": config, "workload": workload, "round": round_index, "status": results.RUN_OK, "error": None,
            "started_at": 1.0, "ended_at": 2.0, "wall_s": 1.0, "metrics": bench.workload_metrics([segment], 50.0),
            "segments": [segment], "mode_counters": None}


def traffic_document(runs: list[dict], goodput_tpot_ms: float = 50.0) -> dict:
    settings = {"configs": "plain,eagle3,dynamic", "schedule": "interleaved", "rounds": 1,
                "goodput_tpot_ms": goodput_tpot_ms,
                "workloads": [{"name": "poisson-4", "segments": [
                    {"input_len": 1024, "output_len": 512, "prompts": 80, "rate": 4.0, "concurrency": None,
                     "range_ratio": 0.25, "idle_s": 0.0}]}]}
    return {"schema_version": results.SCHEMA_VERSION,
            "sources": [{"created": "2026-12-05T00:00:00+00:00", "command_line": "python benchmark/run.py run",
                         "gpu": "NVIDIA H200", "sglang_version": "0.5.17", "git_commit": "abc123",
                         "settings": settings}],
            "configs": {name: {"status": results.RUN_OK, "error": None, "server_command": ["python", name],
                               "server_env": {}, "startup_s": 60.0, "kv_tokens": 120000}
                        for name in ("plain", "eagle3", "dynamic")},
            "runs": runs}


def setup_for_tests(**overrides) -> configs.ServerSetup:
    values = dict(
        model_path="models/llama8b", draft_model_path="models/eagle3", load_format="dummy",
        host="127.0.0.1", port=30000,
        common_args=tuple(configs.DEFAULT_COMMON_ARGS.split()) + ("--max-running-requests", "128"),
        dynamic_args=("--speculative-disable-batch-threshold", "24"),
        adaptive_config_path="/tmp/adaptive.json", python="python3",
    )
    values.update(overrides)
    return configs.ServerSetup(**values)


def flag_values(command: list[str]) -> dict[str, tuple[str, ...]]:
    """Map each --flag of a command line to the values that follow it (empty for switches)."""
    flags: dict[str, list[str]] = {}
    current = None
    for token in command:
        if token.startswith("--"):
            assert token not in flags, f"{token} given twice"
            current = token
            flags[current] = []
        elif current is not None:
            flags[current].append(token)
    return {flag: tuple(values) for flag, values in flags.items()}


SPEC_COUNTS_BEFORE = {**counters(10, 0), "speculative_verified_requests": 40,
                      "speculative_accepted_tokens": 100}


SPEC_COUNTS_AFTER = {**counters(30, 5), "speculative_verified_requests": 100,
                     "speculative_accepted_tokens": 280}
