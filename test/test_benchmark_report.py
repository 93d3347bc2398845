"""CPU tests of benchmark/sweep.py's parts that need no GPU, server or network."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

import sweep  # noqa: E402
from sweeplib import bench, bench_driver, configs, mode_counters, report, results, server, ttft_probe  # noqa: E402

SPECULATIVE_PREFIX = "--speculative-"


# ----- helpers that build inputs the way sglang would -----

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


# ----- command-line construction -----

def test_server_flags_identical_apart_from_speculative_ones():
    setup = setup_for_tests()
    commands = {name: configs.server_command(name, setup) for name in configs.CONFIG_NAMES}
    prefixes = {name: command[:command.index("--model-path")] for name, command in commands.items()}
    assert len(set(map(tuple, prefixes.values()))) == 1
    non_speculative = {
        name: {k: v for k, v in flag_values(command).items() if not k.startswith(SPECULATIVE_PREFIX)}
        for name, command in commands.items()
    }
    reference = non_speculative[configs.PLAIN]
    for name, flags in non_speculative.items():
        assert flags == reference, name
    assert not any(k.startswith(SPECULATIVE_PREFIX) for k in flag_values(commands[configs.PLAIN]))
    for common in setup.common_args:
        if common.startswith("--"):
            assert common in reference


def test_speculative_flags_per_configuration():
    setup = setup_for_tests()
    flags = {name: flag_values(configs.server_command(name, setup)) for name in configs.CONFIG_NAMES}
    draft_shape = {
        "--speculative-draft-model-path": (setup.draft_model_path,),
        "--speculative-draft-load-format": ("dummy",),
        "--speculative-num-steps": ("3",),
        "--speculative-eagle-topk": ("1",),
        "--speculative-num-draft-tokens": ("4",),
    }
    for name in (configs.EAGLE3, configs.ADAPTIVE, configs.DYNAMIC):
        for flag, value in draft_shape.items():
            assert flags[name][flag] == value, (name, flag)
    assert flags[configs.EAGLE3]["--speculative-algorithm"] == ("EAGLE3",)
    assert flags[configs.ADAPTIVE]["--speculative-algorithm"] == ("EAGLE3",)
    assert flags[configs.ADAPTIVE]["--speculative-adaptive"] == ()
    assert flags[configs.ADAPTIVE]["--speculative-adaptive-config"] == (setup.adaptive_config_path,)
    assert flags[configs.DYNAMIC]["--speculative-algorithm"] == ("EAGLE3_DYNAMIC",)
    assert flags[configs.DYNAMIC]["--speculative-disable-batch-threshold"] == ("24",)
    assert "--speculative-adaptive" not in flags[configs.EAGLE3]
    assert "--speculative-disable-batch-threshold" not in flags[configs.EAGLE3]
    fixed = flags[configs.DYNAMIC_FIXED]
    assert fixed["--speculative-algorithm"] == ("EAGLE3_DYNAMIC",)
    assert (fixed["--speculative-disable-batch-threshold"], fixed["--speculative-enable-batch-threshold"],
            fixed["--speculative-switch-patience"]) == (("24",), ("16",), ("4",))
    for flag, value in draft_shape.items():
        assert fixed[flag] == value, flag


def test_draft_load_format_only_with_a_load_format():
    command = configs.server_command(configs.EAGLE3, setup_for_tests(load_format=None))
    assert "--speculative-draft-load-format" not in command
    assert "--load-format" not in command


def test_speculative_configuration_without_draft_is_refused():
    with pytest.raises(ValueError):
        configs.server_command(configs.DYNAMIC, setup_for_tests(draft_model_path=None))


def test_config_list_parsing():
    assert configs.parse_config_list("adaptive, dynamic") == ["adaptive", "dynamic"]
    for bad in ("plain,unknown", "", "plain,plain"):
        with pytest.raises(ValueError):
            configs.parse_config_list(bad)


def test_adaptive_config_file_is_valid_and_stops_at_3_steps(tmp_path):
    path = tmp_path / "adaptive.json"
    configs.write_adaptive_config(path)
    loaded = json.loads(path.read_text())
    all_steps = set()
    for key, entry in loaded.items():
        assert key.isdigit()
        steps = entry["candidate_steps"]
        assert steps and all(isinstance(s, int) and s >= 0 for s in steps)
        all_steps.update(steps)
    assert max(all_steps) == 3 and 0 in all_steps


def test_bench_driver_command_carries_run_parameters():
    settings = bench.BenchSettings(tokenizer="tok", input_len=512, output_len=256, seed=7,
                                   visible_special_tokens=True, extra_args=("--tokenize-prompt",),
                                   python="python3")
    runs = ((1, 8), (16, 48))
    command = bench.bench_driver_command([bench.RunGroup(settings, runs, "/tmp/x.jsonl")], "127.0.0.1", 30001)
    assert command[1] == str(bench.DRIVER_PATH) and bench.DRIVER_PATH.exists()
    [(parsed_runs, bench_flags)] = bench_driver.parse_groups(command[2:])
    assert parsed_runs == list(runs)
    flags = flag_values(bench_flags)
    assert "--max-concurrency" not in flags and "--num-prompts" not in flags
    assert flags["--port"] == ("30001",)
    assert flags["--random-output-len"] == ("256",)
    assert flags["--random-range-ratio"] == ("1.0",)
    assert flags["--output-file"] == ("/tmp/x.jsonl",)
    assert "--output-details" in flags and "--flush-cache" in flags and "--tokenize-prompt" in flags
    body = json.loads(flags["--extra-request-body"][0])
    assert body["sampling_params"]["max_new_tokens"] == 256
    assert body["sampling_params"]["skip_special_tokens"] is False
    plain_settings = bench.BenchSettings("tok", 512, 256, 7, False, (), "python3")
    assert "--extra-request-body" not in bench.bench_serving_flags(plain_settings, "h", 1, "f")


def test_warm_up_and_measured_runs_share_one_driver_process(tmp_path):
    parser = sweep.build_parser()
    args = parser.parse_args(["run", "--model-path", "m", "--draft-model-path", "d", "--out", str(tmp_path),
                              "--concurrencies", "1,64", "--waves", "2", "--min-prompts", "4"])
    plan = sweep.build_plan(args, tmp_path)
    warm_up = sweep.warm_up_group(plan, tmp_path, "dynamic")
    measured = bench.RunGroup(plan.bench_settings, ((1, 4), (64, 128)), str(tmp_path / "bench.jsonl"))
    command = bench.bench_driver_command([warm_up, measured], "127.0.0.1", 30001)
    assert command.count(bench_driver.GROUP_SEPARATOR) == 1
    (warm_runs, warm_flags), (runs, flags) = bench_driver.parse_groups(command[2:])
    assert warm_runs == [(1, 1), (64, 64)] and runs == [(1, 4), (64, 128)]
    warm_flags, flags = flag_values(warm_flags), flag_values(flags)
    assert warm_flags["--random-output-len"] == flags["--random-output-len"] == ("256",)
    assert warm_flags["--output-file"] != flags["--output-file"]
    assert {k: v for k, v in warm_flags.items() if k != "--output-file"} == \
        {k: v for k, v in flags.items() if k != "--output-file"}


@pytest.mark.parametrize("value", ["0", "-3"])
def test_warm_up_output_length_below_one_is_refused(tmp_path, value):
    args = sweep.build_parser().parse_args(["run", "--model-path", "m", "--out", str(tmp_path),
                                            "--warmup-output-len", value])
    with pytest.raises(ValueError, match="--warmup-output-len"):
        sweep.build_plan(args, tmp_path)


def test_warm_up_output_length_is_a_flag(tmp_path):
    args = sweep.build_parser().parse_args(["run", "--model-path", "m", "--out", str(tmp_path),
                                            "--warmup-output-len", "16"])
    warm_up = sweep.warm_up_group(sweep.build_plan(args, tmp_path), tmp_path, "plain")
    assert warm_up.settings.output_len == 16


@given(concurrency=st.integers(1, 512), waves=st.integers(1, 5), min_prompts=st.integers(1, 64))
def test_prompts_per_concurrency(concurrency, waves, min_prompts):
    prompts = bench.prompts_for_concurrency(concurrency, waves, min_prompts)
    assert prompts >= min_prompts and prompts >= waves * concurrency
    assert prompts in (min_prompts, waves * concurrency)


def test_quick_defaults_and_explicit_flags(tmp_path):
    parser = sweep.build_parser()
    base = ["run", "--model-path", "m", "--draft-model-path", "d", "--out", str(tmp_path)]
    quick = sweep.build_plan(parser.parse_args(base + ["--quick"]), tmp_path)
    assert quick.concurrencies == sweep.parse_int_list(sweep.QUICK_DEFAULTS["concurrencies"])
    assert quick.bench_settings.output_len == sweep.QUICK_DEFAULTS["output_len"]
    explicit = sweep.build_plan(parser.parse_args(base + ["--quick", "--concurrencies", "2,8"]), tmp_path)
    assert explicit.concurrencies == [2, 8]
    full = sweep.build_plan(parser.parse_args(base), tmp_path)
    assert full.concurrencies == sweep.parse_int_list(sweep.FULL_DEFAULTS["concurrencies"])
    assert (tmp_path / sweep.ADAPTIVE_CONFIG_FILE).exists()


def test_config_window_is_the_previous_configuration_time_or_the_minimum():
    assert sweep.config_window_s(90.0, None) == 90.0
    assert sweep.config_window_s(90.0, 60.0) == 90.0
    assert sweep.config_window_s(90.0, 194.0) == 194.0


def test_configuration_skipped_without_a_server_when_its_window_is_not_left(tmp_path, monkeypatch):
    parser = sweep.build_parser()
    args = parser.parse_args(["run", "--model-path", "m", "--draft-model-path", "d", "--out", str(tmp_path)])
    plan = sweep.build_plan(args, tmp_path)
    document = results.new_results_document(["sweep"], sweep.plan_settings(plan))

    def no_server(*args, **kwargs):
        raise AssertionError("a server was started")

    monkeypatch.setattr(sweep.server, "start_server", no_server)
    deadline = sweep.Deadline(budget_s=120.0)
    tail = sweep.sweep_config(plan, "dynamic", document, tmp_path, tmp_path, deadline, window_s=194.0)
    assert tail == ""
    assert document["configs"]["dynamic"]["status"] == "skipped"
    assert document["configs"]["dynamic"]["error"] == "time budget spent"


# ----- bench_serving result lines -----

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


def test_run_record_takes_counters_after_from_the_result_line():
    line = bench_result_line(5000.0, [0.03] * 4, [[0.01]] * 4)
    line["max_concurrency"] = 64
    line["server_info"] = {"internal_states": [{"dynamic_eagle": counters(110, 300, 1, 0, 0)}]}
    record = sweep.record_from_result_line("dynamic", 4, line, counters(100, 20), wall_s=3.0)
    assert record["concurrency"] == 64 and record["status"] == results.RUN_OK
    assert record["mode_counters"]["delta"]["speculative_steps"] == 10
    assert record["mode_counters"]["delta"]["plain_steps"] == 280
    short = sweep.record_from_result_line("dynamic", 5, line, None, wall_s=3.0)
    assert short["status"] == "incomplete" and short["mode_counters"]["delta"] is None


# ----- TTFT probe stream parsing -----

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


# ----- server info -----

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


# ----- mode counters -----

def test_mode_counters_found_at_top_level_or_in_internal_states():
    top = {"dynamic_eagle": counters(10, 5)}
    nested = {"internal_states": [{"other": 1}, {"dynamic_eagle": counters(3, 4)}]}
    assert mode_counters.find_mode_counters(top)["speculative_steps"] == 10
    assert mode_counters.find_mode_counters(nested)["plain_steps"] == 4
    found = mode_counters.find_mode_counters(nested)
    found["plain_steps"] = 99
    assert nested["internal_states"][1]["dynamic_eagle"]["plain_steps"] == 4
    assert mode_counters.find_mode_counters({"internal_states": [{}]}) is None
    assert mode_counters.find_mode_counters(None) is None
    assert mode_counters.find_mode_counters({"dynamic_eagle": {"speculative_steps": 1}}) is None


@given(
    before=st.tuples(*[st.integers(0, 10**6)] * 5),
    increments=st.tuples(*[st.integers(0, 10**6)] * 5),
)
def test_counter_delta_is_the_increase(before, increments):
    b = counters(*before)
    a = counters(*(x + d for x, d in zip(before, increments)))
    delta = mode_counters.counter_delta(b, a)
    for field, increment in zip(mode_counters.COUNTER_FIELDS, increments):
        assert delta[field] == increment
    steps = increments[0] + increments[1]
    if steps:
        assert delta["speculative_step_fraction"] == pytest.approx(increments[0] / steps)
    else:
        assert delta["speculative_step_fraction"] is None
    assert delta["counters_reset_during_run"] is False


def test_counter_delta_after_a_reset_uses_the_new_values():
    delta = mode_counters.counter_delta(counters(100, 50, 2, 1), counters(7, 3, 1, 0))
    assert delta["speculative_steps"] == 7 and delta["plain_steps"] == 3
    assert delta["counters_reset_during_run"] is True


def test_optional_counters_and_policy_from_the_plugin_report():
    before = {**counters(10, 0), "catchup_forwards": 1, "catchup_gpu_ms": 1.5,
              "disable_batch_threshold": 24, "enable_batch_threshold": 16, "switch_patience": 4}
    after = {**counters(12, 40, 1, 0, 0), "catchup_forwards": 3, "catchup_gpu_ms": 4.0,
             "disable_batch_threshold": 24, "enable_batch_threshold": 16, "switch_patience": 4}
    delta = mode_counters.counter_delta(before, after)
    assert delta["catchup_forwards"] == 2 and delta["catchup_gpu_ms"] == pytest.approx(2.5)
    assert "plain_graph_steps" not in delta
    assert mode_counters.policy_settings(after) == {
        "disable_batch_threshold": 24, "enable_batch_threshold": 16, "switch_patience": 4}
    assert mode_counters.policy_settings(None) == {}


def test_counter_delta_needs_both_snapshots():
    assert mode_counters.counter_delta(None, counters(1, 1)) is None
    assert mode_counters.counter_delta(counters(1, 1), None) is None


# ----- tables and ratios -----

@given(st.dictionaries(st.sampled_from(configs.CONFIG_NAMES), st.floats(1.0, 1e5), min_size=2))
def test_ratio_to_best_other(values):
    for config, value in values.items():
        best_other = max(v for name, v in values.items() if name != config)
        assert report.ratio_to_best_other(values, config) == pytest.approx(value / best_other)
    best = max(values, key=values.get)
    assert report.ratio_to_best_other(values, best) >= 1.0


def test_ratio_needs_another_configuration():
    assert report.ratio_to_best_other({"plain": 5.0}, "plain") is None


def test_throughput_table_shows_ratio_to_best_other():
    values = {(1, "plain"): 200.0, (1, "eagle3"): 370.0, (1, "dynamic"): 360.0,
              (64, "plain"): 6100.0, (64, "eagle3"): 4000.0, (64, "dynamic"): 6000.0}
    document = document_with([ok_run(c, n, v) for (n, c), v in values.items()], ["plain", "eagle3", "dynamic"])
    table = report.throughput_table(document)
    assert table[0] == "| concurrency | plain | eagle3 | dynamic |"
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]] for line in table[2:]}
    for concurrency in (1, 64):
        row_values = {c: v for (n, c), v in values.items() if n == concurrency}
        best = max(row_values, key=row_values.get)
        for cell, config in zip(rows[str(concurrency)], ["plain", "eagle3", "dynamic"]):
            ratio = row_values[config] / max(v for c, v in row_values.items() if c != config)
            assert f"({ratio:.2f}x)" in cell
            assert cell.startswith("**") == (config == best)


def test_baseline_ratio_table_divides_by_the_better_of_plain_and_eagle3():
    values = {(1, "plain"): 200.0, (1, "eagle3"): 400.0, (1, "dynamic"): 380.0, (1, "dynamic-fixed"): 400.0,
              (64, "plain"): 6000.0, (64, "eagle3"): 4000.0, (64, "dynamic"): 6000.0,
              (64, "dynamic-fixed"): 5400.0}
    document = document_with([ok_run(c, n, v) for (n, c), v in values.items()],
                             ["plain", "eagle3", "dynamic", "dynamic-fixed"])
    table = report.baseline_ratio_table(document)
    assert table[0] == "| config | 1 | 64 | geometric mean |"
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]] for line in table[2:]}
    assert rows["dynamic"] == ["0.950", "1.000", f"{(0.95 * 1.0) ** 0.5:.3f}"]
    assert rows["dynamic-fixed"] == ["1.000", "0.900", f"{(1.0 * 0.9) ** 0.5:.3f}"]


def test_baseline_ratio_table_needs_both_baselines():
    document = document_with([ok_run("plain", 1, 200.0), ok_run("dynamic", 1, 210.0)], ["plain", "dynamic"])
    assert report.baseline_ratio_table(document) == [
        "No EAGLE3_DYNAMIC run with both plain and EAGLE3 runs beside it."]


def test_latency_table_and_failed_runs_are_left_out():
    failed = ok_run("eagle3", 4, 999.0)
    failed["status"] = "failed"
    document = document_with([ok_run("plain", 4, 700.0, tpot=5.0), ok_run("eagle3", 1, 370.0, tpot=2.5), failed],
                             ["plain", "eagle3"])
    table = report.latency_table(document, "median_tpot_ms", "p99_tpot_ms")
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]] for line in table[2:]}
    assert rows["4"] == ["5.0 / 7.5", "-"]
    assert rows["1"] == ["-", "2.5 / 3.8"]
    assert "run `eagle3` c=4: failed" in "\n".join(report.problem_lines(document))


def test_mode_counter_table_lists_dynamic_runs():
    delta = mode_counters.counter_delta(counters(10, 0), counters(40, 90, 1, 0, 0))
    document = document_with([ok_run("dynamic", 64, 5000.0, delta=delta), ok_run("plain", 64, 6000.0)],
                             ["plain", "dynamic"])
    table = report.mode_counter_table(document)
    assert len(table) == 3
    assert f"{100 * 30 / 120:.1f}%" in table[2]


def test_prefill_table_shows_the_drafts_share_of_prefill_gpu_time():
    before = {**counters(10, 0), "prefill_batches": 2, "prefill_tokens": 1000,
              "prefill_target_gpu_ms": 50.0, "prefill_draft_gpu_ms": 2.0}
    after = {**counters(40, 90), "prefill_batches": 12, "prefill_tokens": 9000,
             "prefill_target_gpu_ms": 450.0, "prefill_draft_gpu_ms": 12.0}
    delta = mode_counters.counter_delta(before, after)
    document = document_with([ok_run("dynamic", 64, 5000.0, delta=delta), ok_run("plain", 64, 6000.0)],
                             ["plain", "dynamic"])
    table = report.prefill_table(document)
    assert len(table) == 3
    cells = [cell.strip() for cell in table[2].split("|")[1:-1]]
    assert cells == ["dynamic", "64", "10", "8000", "400.0", "10.0", "2.5%"]
    without = document_with([ok_run("plain", 64, 6000.0)], ["plain"])
    assert report.prefill_table(without)[0].startswith("No run reported prefill timings")


def test_plain_ratio_table_compares_throughputs_and_ttft_with_plain():
    dynamic = ok_run("dynamic", 64, 5000.0)
    dynamic["metrics"]["median_ttft_ms"] = 33.0
    document = document_with([dynamic, ok_run("plain", 64, 6250.0), ok_run("plain", 128, 7000.0)],
                             ["plain", "dynamic"])
    table = report.plain_ratio_table(document)
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line for line in table[2:]}
    assert set(rows) == {("dynamic", "output throughput"), ("dynamic", "request throughput"),
                         ("dynamic", "median TTFT")}
    assert "| 0.800 |" in rows[("dynamic", "output throughput")]
    assert "| 0.800 |" in rows[("dynamic", "request throughput")]
    assert "| 1.100 |" in rows[("dynamic", "median TTFT")]
    assert table[0] == "| config | ratio of | 64 |"  # 128 has no dynamic run to compare
    assert report.plain_ratio_table(document_with([ok_run("plain", 1, 200.0)], ["plain"]))[0] \
        .startswith("No EAGLE3_DYNAMIC run")


def test_markdown_report_has_every_section():
    document = document_with([ok_run("plain", 1, 200.0), ok_run("eagle3", 1, 370.0)], ["plain", "eagle3"])
    text = report.render_markdown(document)
    for heading in ("Output throughput", "TTFT (ms)", "TPOT (ms)", "ITL (ms)", "mode counters",
                    "prefill GPU time", "TTFT p10 / p50 / p90", "EAGLE3_DYNAMIC / plain decoding",
                    "TTFT probe", "Servers", "Problems"):
        assert heading in text
    assert "(1.85x)" in text and "(0.54x)" in text


# ----- merging and plots -----

def test_merging_two_partial_result_files(tmp_path):
    first = document_with([ok_run("plain", 1, 200.0), ok_run("eagle3", 1, 370.0)], ["plain", "eagle3"],
                          created="2026-11-29T01:00:00+00:00")
    second = document_with([ok_run("adaptive", 1, 360.0), ok_run("dynamic", 1, 365.0), ok_run("eagle3", 1, 380.0)],
                           ["adaptive", "dynamic"], created="2026-11-29T02:00:00+00:00")
    paths = []
    for index, document in enumerate((first, second)):
        path = tmp_path / f"part{index}.json"
        results.save_results(document, path)
        paths.append(path)
    merged = results.merge_results([results.load_results(p) for p in paths])
    assert set(merged["configs"]) == {"plain", "eagle3", "adaptive", "dynamic"}
    assert [s["created"] for s in merged["sources"]] == [first["sources"][0]["created"], second["sources"][0]["created"]]
    keys = [results.run_key(r) for r in merged["runs"]]
    assert len(keys) == len(set(keys)) == 4
    eagle3 = next(r for r in merged["runs"] if r["config"] == "eagle3")
    assert eagle3["metrics"]["output_throughput"] == 380.0


def test_merging_keeps_a_success_over_a_later_failure():
    first = document_with([ok_run("eagle3", 1, 370.0)], ["eagle3"], created="2026-11-29T01:00:00+00:00")
    failed = ok_run("eagle3", 1, 0.0)
    failed["status"] = "failed"
    second = document_with([failed, ok_run("plain", 1, 200.0)], ["eagle3", "plain"],
                           created="2026-11-29T02:00:00+00:00")
    first["configs"]["eagle3"]["startup_s"] = 11.0
    second["configs"]["eagle3"]["startup_s"] = 22.0
    merged = results.merge_results([first, second])
    eagle3 = [r for r in merged["runs"] if r["config"] == "eagle3"]
    assert [r["status"] for r in eagle3] == ["ok"]
    assert eagle3[0]["metrics"]["output_throughput"] == 370.0
    assert merged["configs"]["eagle3"]["startup_s"] == 11.0
    assert set(merged["configs"]) == {"eagle3", "plain"}


def test_report_command_writes_report_and_plots_from_recorded_json(tmp_path):
    runs = [ok_run(c, n, 100.0 * n + i) for i, c in enumerate(configs.CONFIG_NAMES) for n in (1, 4, 16, 64, 128)]
    part = tmp_path / "part.json"
    results.save_results(document_with(runs, list(configs.CONFIG_NAMES)), part)
    out = tmp_path / "merged"
    assert sweep.main(["report", "--inputs", str(part), "--out", str(out)]) == 0
    for name in (sweep.RESULTS_FILE, report.REPORT_FILE, report.THROUGHPUT_PLOT_FILE, report.TPOT_PLOT_FILE):
        assert (out / name).stat().st_size > 0, name
    assert (out / report.THROUGHPUT_PLOT_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(results.load_results(out / sweep.RESULTS_FILE)["runs"]) == len(runs)


def test_load_results_rejects_other_schema(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"schema_version": 0}))
    with pytest.raises(ValueError):
        results.load_results(path)


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


SPEC_COUNTS_BEFORE = {**counters(10, 0), "speculative_verified_requests": 40,
                      "speculative_accepted_tokens": 100}
SPEC_COUNTS_AFTER = {**counters(30, 5), "speculative_verified_requests": 100,
                     "speculative_accepted_tokens": 280}


def test_speculative_acceptance_of_a_run_comes_from_its_own_counts():
    delta = mode_counters.counter_delta(SPEC_COUNTS_BEFORE, SPEC_COUNTS_AFTER)
    assert delta["speculative_accept_length"] == pytest.approx(180 / 60)
    only_plain = mode_counters.counter_delta(SPEC_COUNTS_AFTER, {**SPEC_COUNTS_AFTER, "plain_steps": 50})
    assert only_plain["speculative_accept_length"] is None
    assert mode_counters.counter_delta(counters(1, 0), counters(2, 0))["speculative_accept_length"] is None


def test_report_recomputes_a_runs_counter_change_from_its_snapshots():
    stale = mode_counters.counter_delta(counters(10, 0), counters(30, 5))
    record = {"before": SPEC_COUNTS_BEFORE, "after": SPEC_COUNTS_AFTER, "delta": stale}
    assert mode_counters.run_delta(record)["speculative_accept_length"] == pytest.approx(3.0)
    assert mode_counters.run_delta({"before": None, "after": None, "delta": stale}) == stale
    assert mode_counters.run_delta(None) is None
