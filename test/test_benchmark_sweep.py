"""The sweep's plan and its per-configuration flow (benchmark/sweep.py)."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

import sweep  # noqa: E402
from sweeplib import bench, bench_driver, configs, mode_counters, results  # noqa: E402
from benchmark_helpers import bench_result_line, counters, flag_values  # noqa: E402


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
    assert (tmp_path / configs.ADAPTIVE_CONFIG_FILE).exists()


def test_configuration_skipped_without_a_server_once_the_time_budget_is_spent(tmp_path, monkeypatch):
    args = sweep.build_parser().parse_args(["run", "--model-path", "m", "--draft-model-path", "d",
                                            "--out", str(tmp_path)])
    plan = sweep.build_plan(args, tmp_path)
    document = results.new_results_document(["sweep"], sweep.plan_settings(plan))

    def no_server(*args, **kwargs):
        raise AssertionError("a server was started")

    monkeypatch.setattr(sweep.server, "start_server", no_server)
    tails: dict = {}
    sweep.sweep_config(plan, "dynamic", document, tmp_path, tmp_path, time.monotonic(), tails)
    assert tails == {}
    assert document["configs"]["dynamic"]["status"] == "skipped"
    assert document["configs"]["dynamic"]["error"] == "time budget spent"
    sweep.sweep_config(plan, "plain", document, tmp_path, tmp_path, time.monotonic() + 100, tails)
    assert document["configs"]["plain"]["status"] == "skipped"
    assert "below --min-config-window-s" in document["configs"]["plain"]["error"]


def test_a_stopped_sweep_still_writes_results_and_report(tmp_path, monkeypatch):
    """An outer `timeout` sends SIGTERM; what finished before it is written all the same."""
    def sweep_config(plan, config, document, out_dir, scratch, deadline, tails):
        if config == "eagle3":
            sweep.stop_on_sigterm(signal.SIGTERM, None)
        document["configs"][config] = {"status": results.RUN_OK, "error": None}
        document["runs"].append({**bench_run(config), "concurrency": 1})
        tails[config] = f"{config} log"

    monkeypatch.setattr(sweep, "sweep_config", sweep_config)
    with pytest.raises(SystemExit) as stopped:
        sweep.main(["run", "--model-path", "m", "--draft-model-path", "d", "--out", str(tmp_path),
                    "--configs", "plain,eagle3", "--concurrencies", "1"])
    assert stopped.value.code == 128 + signal.SIGTERM
    document = results.load_results(tmp_path / sweep.RESULTS_FILE)
    assert [run["config"] for run in document["runs"]] == ["plain"]
    assert document["configs"]["eagle3"]["error"] == sweep.INTERRUPTED  # never reached
    assert "plain log" in (tmp_path / sweep.SERVER_LOGS_FILE).read_text()
    assert "| 1 | 1000 |" in (tmp_path / "report.md").read_text()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def bench_run(config: str) -> dict:
    line = {**bench_result_line(1000.0, [0.03] * 4, [[0.01]] * 4), "max_concurrency": 1}
    return sweep.record_from_result_line(config, 4, line, None, wall_s=1.0)


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


def dynamic_info(spec: int, plain: int) -> dict:
    return {"internal_states": [{"dynamic_eagle": counters(spec, plain)}]}


def test_a_runs_counters_start_after_bench_servings_warm_up_request(tmp_path, monkeypatch):
    """The counter change of a run is taken from the snapshot the driver records after
    bench_serving's own warm-up request, not from the state after the previous run."""
    args = sweep.build_parser().parse_args(["run", "--model-path", "m", "--draft-model-path", "d",
                                            "--out", str(tmp_path), "--concurrencies", "2",
                                            "--waves", "2", "--min-prompts", "4"])
    plan = sweep.build_plan(args, tmp_path)
    line = {**bench_result_line(1000.0, [0.03] * 4, [[0.005]] * 4), "max_concurrency": 2,
            "server_info": dynamic_info(spec=180, plain=400)}

    def fake_driver(command, watched, driver_log, timeout_s, server_alive):
        (_, on_warm_up), (_, on_after_warmup), (_, on_result) = watched
        on_warm_up({"max_concurrency": 2, "server_info": dynamic_info(spec=10, plain=0)})
        on_after_warmup({"max_concurrency": 2, "server_info": dynamic_info(spec=170, plain=0)})
        on_result(line)
        return 0

    monkeypatch.setattr(sweep.bench, "run_bench_driver", fake_driver)
    monkeypatch.setattr(sweep.server, "fetch_server_info", lambda url: dynamic_info(0, 0))
    running = sweep.server.RunningServer("dynamic", None, tmp_path / "server.log", "http://h:1")
    document = {"runs": []}
    sweep.bench_all_concurrencies(plan, running, document, tmp_path, tmp_path, float("inf"))
    (run,) = document["runs"]
    delta = run["mode_counters"]["delta"]
    assert (delta["speculative_steps"], delta["plain_steps"]) == (10, 400)
    assert run["mode_counters"]["before_source"] == mode_counters.BEFORE_AFTER_WARMUP


def test_an_interrupted_configuration_records_its_missing_runs_and_stops_its_server(
        tmp_path, monkeypatch):
    args = sweep.build_parser().parse_args(["run", "--model-path", "m", "--draft-model-path", "d",
                                            "--out", str(tmp_path), "--concurrencies", "1,4,16"])
    plan = sweep.build_plan(args, tmp_path)
    document = results.new_results_document(["sweep"], sweep.plan_settings(plan))
    stopped = []
    monkeypatch.setattr(sweep.server, "port_accepts_connections", lambda host, port: False)
    running = SimpleNamespace(base_url="url")
    monkeypatch.setattr(sweep.server, "start_server", lambda *a, **k: running)
    monkeypatch.setattr(sweep.server, "wait_until_healthy", lambda *a, **k: 1.0)
    monkeypatch.setattr(sweep.server, "fetch_server_info", lambda url: None)
    monkeypatch.setattr(sweep.server, "base_url_of", lambda host, port: "url")
    monkeypatch.setattr(sweep.server, "stop_server", stopped.append)
    monkeypatch.setattr(sweep.server, "log_tail", lambda path, lines: "the tail")

    def bench_until_sigterm(plan, running, document, out_dir, scratch, deadline):
        document["runs"].append({**bench_run("dynamic"), "concurrency": 1})
        sweep.stop_on_sigterm(signal.SIGTERM, None)

    monkeypatch.setattr(sweep, "bench_all_concurrencies", bench_until_sigterm)
    tails: dict = {}
    with pytest.raises(SystemExit):
        sweep.sweep_config(plan, "dynamic", document, tmp_path, tmp_path, float("inf"), tails)
    assert stopped == [running] and tails == {"dynamic": "the tail"}
    assert document["configs"]["dynamic"]["status"] == "failed"
    assert document["configs"]["dynamic"]["error"] == sweep.INTERRUPTED
    missing = [(run["concurrency"], run["status"]) for run in document["runs"][1:]]
    assert missing == [(4, "failed"), (16, "failed")]


def test_a_budget_that_ends_during_start_up_skips_the_configuration(tmp_path, monkeypatch):
    """A server still starting when the budget ends is not a failed configuration."""
    args = sweep.build_parser().parse_args(["run", "--model-path", "m", "--draft-model-path", "d",
                                            "--out", str(tmp_path), "--concurrencies", "1,4"])
    plan = sweep.build_plan(args, tmp_path)
    document = results.new_results_document(["sweep"], sweep.plan_settings(plan))
    stopped = []
    alive = {"running": True}
    running = SimpleNamespace(base_url="url")

    def not_healthy(server_, timeout_s, tail_lines):
        raise sweep.server.ServerError(f"server not healthy after {timeout_s:.0f} s")

    monkeypatch.setattr(sweep.server, "port_accepts_connections", lambda host, port: False)
    monkeypatch.setattr(sweep.server, "start_server", lambda *a, **k: running)
    monkeypatch.setattr(sweep.server, "wait_until_healthy", not_healthy)
    monkeypatch.setattr(sweep.server, "server_is_running", lambda server_: alive["running"])
    monkeypatch.setattr(sweep.server, "base_url_of", lambda host, port: "url")
    monkeypatch.setattr(sweep.server, "stop_server", stopped.append)
    monkeypatch.setattr(sweep.server, "log_tail", lambda path, lines: "the tail")
    sweep.sweep_config(plan, "dynamic", document, tmp_path, tmp_path,
                       time.monotonic() + plan.min_config_window_s + 10, {})
    record = document["configs"]["dynamic"]
    assert stopped == [running]
    assert record["status"] == "skipped" and "while the server was starting" in record["error"]
    assert [(run["concurrency"], run["status"]) for run in document["runs"]] == [
        (1, "skipped"), (4, "skipped")]

    alive["running"] = False  # the server died: a failure, budget or not
    sweep.sweep_config(plan, "plain", document, tmp_path, tmp_path,
                       time.monotonic() + plan.min_config_window_s + 10, {})
    assert document["configs"]["plain"]["status"] == "failed_to_start"
    alive["running"] = True
    sweep.sweep_config(plan, "eagle3", document, tmp_path, tmp_path, float("inf"), {})
    assert document["configs"]["eagle3"]["status"] == "failed_to_start"  # the server's own timeout


@pytest.mark.parametrize("budget_s, status, reason", [
    (30.0, "skipped", "time budget spent during the runs"),
    (float("inf"), "failed", "--bench-timeout-s reached"),
])
def test_runs_the_time_budget_ends_are_skipped_and_runs_the_bench_timeout_ends_failed(
        tmp_path, monkeypatch, budget_s, status, reason):
    args = sweep.build_parser().parse_args(["run", "--model-path", "m", "--draft-model-path", "d",
                                            "--out", str(tmp_path), "--concurrencies", "1,4"])
    plan = sweep.build_plan(args, tmp_path)
    line = {**bench_result_line(1000.0, [0.03] * 4, [[0.005]] * 4), "max_concurrency": 1,
            "server_info": dynamic_info(spec=4, plain=0)}

    def driver_cut_after_one_run(command, watched, driver_log, timeout_s, server_alive):
        watched[2][1](line)
        return sweep.bench.TIMEOUT_EXIT_CODE

    monkeypatch.setattr(sweep.bench, "run_bench_driver", driver_cut_after_one_run)
    monkeypatch.setattr(sweep.server, "fetch_server_info", lambda url: dynamic_info(0, 0))
    monkeypatch.setattr(sweep.server, "log_tail", lambda path, lines: "the tail")
    running = sweep.server.RunningServer("dynamic", None, tmp_path / "server.log", "http://h:1")
    document = {"runs": []}
    sweep.bench_all_concurrencies(plan, running, document, tmp_path, tmp_path,
                                  time.monotonic() + budget_s)
    first, cut = document["runs"]
    assert first["status"] == results.RUN_OK
    assert (cut["concurrency"], cut["status"]) == (4, status) and cut["error"].startswith(reason)
