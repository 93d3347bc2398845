"""Inputs for the benchmark tests, built the way sglang and bench_serving would."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib import configs, results  # noqa: E402


SPECULATIVE_PREFIX = "--speculative-"


def bench_result_line(output_throughput: float, ttfts_s: list[float], itls_s: list[list[float]],
                      e2e_ms: float = 700.0, accept_length: float | None = None) -> dict:
    """A JSONL result line with the keys bench_serving writes with --output-details."""
    return {
        "backend": "sglang", "dataset_name": "random-ids", "max_concurrency": 1,
        "completed": len(ttfts_s), "duration": 10.0, "total_output_tokens": 256 * len(ttfts_s),
        "output_throughput": output_throughput, "request_throughput": output_throughput / 256,
        "median_ttft_ms": statistics.median(ttfts_s) * 1000, "p99_ttft_ms": max(ttfts_s) * 1000,
        "median_tpot_ms": 5.0, "p99_tpot_ms": 6.0, "median_itl_ms": 4.0, "p99_itl_ms": 9.0,
        "median_e2e_latency_ms": e2e_ms, "accept_length": accept_length,
        "server_info": {"version": "0.5.17"},
        "input_lens": [512] * len(ttfts_s), "output_lens": [256] * len(ttfts_s),
        "ttfts": ttfts_s, "itls": itls_s, "generated_texts": [""] * len(ttfts_s),
        "errors": [""] * len(ttfts_s),
    }


def counters(spec: int, plain: int, to_plain: int = 0, to_spec: int = 0, catchup: int = 0,
             mean_accept: float = 2.5) -> dict:
    return {"speculative_steps": spec, "plain_steps": plain, "switches_to_plain": to_plain,
            "switches_to_speculative": to_spec, "catchup_tokens": catchup,
            "mean_accept_length": mean_accept}


def ok_run(config: str, concurrency: int, throughput: float, tpot: float = 5.0,
           delta: dict | None = None) -> dict:
    return {
        "config": config, "concurrency": concurrency, "num_prompts": max(8, 3 * concurrency),
        "status": results.RUN_OK, "error": None, "wall_s": 1.0,
        "metrics": {"output_throughput": throughput, "request_throughput": throughput / 256,
                    "median_ttft_ms": 30.0, "p99_ttft_ms": 40.0, "median_tpot_ms": tpot,
                    "p99_tpot_ms": tpot * 1.5, "median_itl_ms": tpot, "p99_itl_ms": tpot * 2,
                    "median_e2e_latency_ms": 1000.0, "accept_length": None, "completed": 8},
        "ttft_diagnostics": {"median_ttft_to_median_e2e": 0.03, "first_request_ttft_ms": 31.0,
                             "median_ttft_excluding_first_ms": 30.0,
                             "requests_without_visible_text": 0,
                             "requests_with_text_only_in_last_chunk": 0},
        "mode_counters": {"before": None, "after": None, "delta": delta},
    }


def document_with(runs: list[dict], config_names: list[str], created: str = "2026-11-29T00:00:00+00:00") -> dict:
    settings = {"input_len": 512, "output_len": 256, "waves": 3, "min_prompts": 8}
    return {
        "schema_version": results.SCHEMA_VERSION,
        "sources": [{"created": created, "command_line": "python benchmark/sweep.py run",
                     "gpu": "NVIDIA H200", "sglang_version": "0.5.17", "settings": settings}],
        "configs": {name: {"status": results.RUN_OK, "error": None, "server_command": ["python", name],
                           "server_env": {}, "startup_s": 60.0, "max_running_requests": 48,
                           "server_version": "0.5.17", "ttft_probe": None}
                    for name in config_names},
        "runs": runs,
    }


def setup_for_tests(**overrides) -> configs.ServerSetup:
    values = dict(
        model_path="models/llama8b", draft_model_path="models/eagle3", load_format="dummy",
        host="127.0.0.1", port=30000,
        common_args=tuple(configs.DEFAULT_COMMON_ARGS.split()) + ("--max-running-requests", "128"),
        dynamic_args=("--speculative-disable-batch-threshold", "24"),
        adaptive_config_path="/tmp/adaptive.json", spec_shape=configs.SpeculativeShape(),
        python="python3",
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
