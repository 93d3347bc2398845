"""The interleaved benchmark (benchmark/interleaved.py): run order, workloads, commands, summary."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

import interleaved  # noqa: E402
from sweeplib import bench, bench_driver, results  # noqa: E402
from benchmark_helpers import bench_result_line, flag_values  # noqa: E402


def parse(tmp_path: Path, *extra: str):
    args = interleaved.build_parser().parse_args(
        ["--model-path", "m", "--draft-model-path", "d", "--out", str(tmp_path), *extra])
    args.server_env = {}
    return args


def test_runs_alternate_abba_so_each_configuration_runs_every_round():
    assert interleaved.run_order(("dynamic", "plain"), 3) == [
        "dynamic", "plain", "plain", "dynamic", "dynamic", "plain"]
    assert interleaved.run_order(("a", "b"), 1) == ["a", "b"]
    assert interleaved.run_order(("a", "b", "c"), 2) == ["a", "b", "c", "c", "b", "a"]


def test_workloads_parse_lengths_concurrencies_and_options(tmp_path):
    args = parse(tmp_path, "--workload", "512x256:128,64", "--workload", "1024x2:128,64,16:prompts=256:waves=2")
    assert interleaved.workloads_of(args) == [
        interleaved.Workload(512, 256, (128, 64), 3, 8), interleaved.Workload(1024, 2, (128, 64, 16), 2, 256)]
    # Without --workload: the single-workload flags.
    assert interleaved.workloads_of(parse(tmp_path, "--concurrencies", "4,1", "--input-len", "100")) == [
        interleaved.Workload(100, 256, (4, 1), 3, 8)]


@pytest.mark.parametrize("text", ["512:128", "512x256", "512x256:", "512x256:64:rounds=2", "0x256:64",
                                  "512x256:64:prompts=x"])
def test_a_malformed_workload_is_refused_with_the_expected_form(tmp_path, text):
    with pytest.raises(ValueError, match="INxOUT:C1,C2"):
        interleaved.workloads_of(parse(tmp_path, "--workload", text))


def test_a_length_and_concurrency_given_twice_is_refused(tmp_path):
    args = parse(tmp_path, "--workload", "1024x2:128:prompts=256", "--workload", "1024x2:128,16")
    with pytest.raises(ValueError, match="1024x2 at concurrency 128 is given twice"):
        interleaved.workloads_of(args)
    # The same concurrency with other lengths is another workload.
    args = parse(tmp_path, "--workload", "512x256:128", "--workload", "1024x2:128")
    assert len(interleaved.workloads_of(args)) == 2


def test_the_kv_cap_holds_the_largest_workload_in_flight_with_headroom(tmp_path):
    args = parse(tmp_path, "--workload", "512x256:128,64", "--workload", "1024x2:64")
    assert interleaved.max_total_tokens(args, interleaved.workloads_of(args)) == 122880  # 1.25 x 128 x 768
    args = parse(tmp_path, "--max-total-tokens", "150000")
    assert interleaved.max_total_tokens(args, interleaved.workloads_of(args)) == 150000


def test_every_server_gets_the_same_memory_flags_on_its_own_port(tmp_path):
    args = parse(tmp_path, "--port", "31000", "--max-total-tokens", "150000")
    args.adaptive_config_path = None
    commands = interleaved.server_commands(args, ("dynamic", "plain", "eagle3"), interleaved.workloads_of(args))
    assert [(name, port) for name, port, _ in commands] == [("dynamic", 31000), ("plain", 31001), ("eagle3", 31002)]
    for _, port, command in commands:
        # The sweep's common flags come first; the appended pair wins in sglang's argparse.
        memory_at = len(command) - 1 - command[::-1].index("--mem-fraction-static")
        assert command[memory_at:memory_at + 4] == [
            "--mem-fraction-static", interleaved.SHARED_MEMORY_FRACTION, "--max-total-tokens", "150000"]
        assert command.count("--mem-fraction-static") == 2
        assert command[command.index("--port") + 1] == str(port)
    (_, _, first_command), (_, _, second_command), (_, _, third_command) = commands
    assert first_command[first_command.index("--speculative-algorithm") + 1] == "EAGLE3_DYNAMIC"
    assert third_command[third_command.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert "--speculative-algorithm" not in second_command
    assert [part if part != "31000" else "31001" for part in first_command[:len(second_command)]] == second_command


def test_tree_shape_flags_reach_every_speculative_server(tmp_path):
    args = parse(tmp_path, "--spec-steps", "5", "--spec-topk", "4", "--spec-draft-tokens", "8")
    args.adaptive_config_path = None
    for name, _, command in interleaved.server_commands(args, ("dynamic", "eagle3"), interleaved.workloads_of(args)):
        shape = [command[command.index(flag) + 1] for flag in
                 ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")]
        assert shape == ["5", "4", "8"], name


def test_the_adaptive_configuration_gets_the_default_config_file(tmp_path):
    args = parse(tmp_path, "--configs", "dynamic,adaptive")
    args.adaptive_config_path = interleaved.configs.adaptive_config_path(args, ["dynamic", "adaptive"], tmp_path)
    assert Path(args.adaptive_config_path).exists()
    [_, (_, _, command)] = interleaved.server_commands(args, ("dynamic", "adaptive"), interleaved.workloads_of(args))
    assert command[command.index("--speculative-adaptive-config") + 1] == args.adaptive_config_path


def driver_groups(args, tmp_path: Path) -> tuple[list, list]:
    """The driver's groups (runs, bench_serving flags) and the measured runs of a dynamic and a
    plain server on ports 30000 and 30001."""
    served = [interleaved.ServedConfig("dynamic", None, 30000), interleaved.ServedConfig("plain", None, 30001)]
    command, measured = interleaved.bench_groups(args, interleaved.workloads_of(args), served,
                                                 ("dynamic", "plain"), tmp_path)
    return bench_driver.parse_groups(command[2:]), measured


def flag_of(groups: list, flag: str) -> list[str]:
    return [flag_values(flags)[flag][0] for _, flags in groups]


def test_driver_runs_warm_ups_then_abba_runs_each_against_its_own_server(tmp_path):
    args = parse(tmp_path, "--concurrencies", "128,64", "--rounds", "2")
    groups, measured = driver_groups(args, tmp_path)
    assert flag_of(groups, "--port") == ["30000", "30001"] + ["30000", "30001", "30001", "30000"] * 2
    assert flag_of(groups, "--random-output-len") == ["16", "16"] + ["256"] * 8
    assert groups[0][0] == [(128, 128), (64, 64)]
    assert [runs for runs, _ in groups[2:]] == [[(128, 384)]] * 4 + [[(64, 192)]] * 4
    assert [run.config for run in measured] == ["dynamic", "plain", "plain", "dynamic"] * 2
    assert [run.concurrency for run in measured] == [128] * 4 + [64] * 4
    assert [run.round for run in measured] == [0, 0, 1, 1] * 2
    assert len({run.output_file for run in measured}) == 8


def test_every_workload_warms_up_first_then_runs_with_its_own_lengths_and_prompts(tmp_path):
    args = parse(tmp_path, "--rounds", "1", "--workload", "512x256:64", "--workload", "1024x2:16:prompts=256")
    groups, measured = driver_groups(args, tmp_path)
    assert flag_of(groups, "--random-input-len") == ["512", "512", "1024", "1024", "512", "512", "1024", "1024"]
    assert flag_of(groups, "--random-output-len") == ["16"] * 4 + ["256", "256", "2", "2"]
    assert [runs for runs, _ in groups[4:]] == [[(64, 192)]] * 2 + [[(16, 256)]] * 2
    assert [run.workload for run in measured] == ["512x256", "512x256", "1024x2", "1024x2"]


def run(config: str, concurrency: int, throughput: float, ttft: float, status: str = results.RUN_OK,
        round_index: int = 0, workload: str = "512x256") -> dict:
    return {"config": config, "concurrency": concurrency, "status": status, "round": round_index,
            "workload": workload,
            "metrics": {"output_throughput": throughput, "median_ttft_ms": ttft, "mean_ttft_ms": ttft}}


def test_summary_is_the_ratio_of_means_over_the_runs_that_completed():
    runs = [run("dynamic", 128, 7200, 1100), run("plain", 128, 7500, 1000),
            run("plain", 128, 7300, 1000, round_index=1), run("dynamic", 128, 7600, 1000, round_index=1),
            run("dynamic", 128, 1, 1, status="failed", round_index=2)]
    [row] = interleaved.summary_rows(runs, ("dynamic", "plain"))
    assert row["throughputs"] == {"dynamic": [7200, 7600], "plain": [7500, 7300]}
    ratios = row["ratios"]["plain"]
    assert ratios["output_throughput"] == 1.0
    assert abs(ratios["median_ttft_ms"] - 1.05) < 1e-12
    assert ratios["round_throughput_ratios"] == [7200 / 7500, 7600 / 7300]


def test_summary_compares_the_first_configuration_with_each_other_per_workload():
    runs = [run("dynamic", 16, 3000, 100), run("plain", 16, 2400, 100), run("eagle3", 16, 3100, 90),
            run("dynamic", 16, 30, 50, workload="1024x2"), run("plain", 16, 30, 50, workload="1024x2"),
            run("eagle3", 16, 25, 60, workload="1024x2")]
    rows = interleaved.summary_rows(runs, ("dynamic", "plain", "eagle3"))
    assert [(row["workload"], row["concurrency"]) for row in rows] == [("512x256", 16), ("1024x2", 16)]
    assert rows[0]["ratios"]["plain"]["output_throughput"] == 1.25
    assert abs(rows[0]["ratios"]["eagle3"]["output_throughput"] - 3000 / 3100) < 1e-12
    assert rows[1]["ratios"]["eagle3"]["output_throughput"] == 1.2


def test_summary_of_a_concurrency_without_runs_of_one_configuration_has_no_ratio():
    [row] = interleaved.summary_rows([run("dynamic", 64, 5000, 500)], ("dynamic", "plain"))
    assert row["ratios"]["plain"]["output_throughput"] is None
    assert row["ratios"]["plain"]["round_throughput_ratios"] == []


def test_report_lists_the_ratios_and_every_run_with_its_speculative_steps():
    document = results.new_results_document(["interleaved.py"], {})
    document["runs"] = [run("dynamic", 64, 5500, 560), run("plain", 64, 5700, 550)]
    document["runs"][0]["mode_counters"] = {"delta": {"speculative_steps": 16, "plain_steps": 752}}
    document["runs"][0]["ttft_diagnostics"] = {"first_request_ttft_ms": 512.1}
    text = interleaved.report_markdown(document, ("dynamic", "plain"))
    assert "| 512x256 | 64 | 5500 | 5700 |" in text
    assert "| 512x256 | 64 | 0.965 | 0.965 | 1.018 | 1.018 |" in text
    assert "| 512x256 | dynamic | 64 | 0 | ok | 5500 | 560.0 | 512 | 16 | 752 |" in text
    assert "| 512x256 | plain | 64 | 0 | ok | 5700 | 550.0 |  |  |  |" in text


def test_more_than_four_or_fewer_than_two_configurations_are_refused():
    with pytest.raises(SystemExit, match="2 to 4"):
        interleaved.config_names("dynamic")
    with pytest.raises(SystemExit, match="2 to 4"):
        interleaved.config_names("plain,eagle3,adaptive,dynamic,dynamic-fixed")


HEALTHY_FOREVER = [sys.executable, "-c", "import time; time.sleep(60)"]
DIES = [sys.executable, "-c", "import sys; print('no GPU'); sys.exit(3)"]


def fake_servers(monkeypatch, first: list[str], second: list[str]) -> list:
    """Replace both servers' commands; a server counts as healthy while it runs (the real wait
    would poll its /health), and the launched processes are returned for inspection."""
    launched = []
    real_start = interleaved.server.start_server

    def start(*args, **kwargs):
        launched.append(real_start(*args, **kwargs))
        return launched[-1]

    def healthy_while_running(running, timeout_s, tail_lines):
        time.sleep(0.5)
        if running.process.poll() is not None:
            raise interleaved.server.ServerError(
                f"[{running.config}] exited; last log lines:\n{interleaved.server.log_tail(running.log_path, 5)}")
        return 0.5

    monkeypatch.setattr(interleaved, "server_commands",
                        lambda args, names, workloads: [(names[0], 31000, first), (names[1], 31001, second)])
    monkeypatch.setattr(interleaved.server, "start_server", start)
    monkeypatch.setattr(interleaved.server, "wait_until_healthy", healthy_while_running)
    return launched


def run_main(tmp_path: Path) -> tuple[int, dict]:
    exit_code = interleaved.main(["--model-path", "m", "--draft-model-path", "d", "--out", str(tmp_path)])
    return exit_code, results.load_results(tmp_path / interleaved.RESULTS_FILE)


def test_the_second_server_failing_stops_the_first_and_is_recorded(tmp_path, monkeypatch):
    launched = fake_servers(monkeypatch, HEALTHY_FOREVER, DIES)
    exit_code, document = run_main(tmp_path)
    assert exit_code == 1
    assert document["configs"]["dynamic"]["status"] == "ok"
    assert document["configs"]["plain"]["status"] == "failed_to_start"
    assert "no GPU" in document["configs"]["plain"]["error"]
    assert document["runs"] == []
    assert [process.process.poll() is not None for process in launched] == [True, True]
    assert (tmp_path / interleaved.REPORT_FILE).exists()


def test_the_first_server_failing_starts_no_second(tmp_path, monkeypatch):
    launched = fake_servers(monkeypatch, DIES, HEALTHY_FOREVER)
    exit_code, document = run_main(tmp_path)
    assert exit_code == 1 and len(launched) == 1
    assert document["configs"]["dynamic"]["status"] == "failed_to_start"
    assert "plain" not in document["configs"]


def test_runs_without_a_result_line_are_recorded_as_failed(tmp_path, monkeypatch):
    fake_servers(monkeypatch, HEALTHY_FOREVER, HEALTHY_FOREVER)

    def driver_killed_at_its_timeout(command, watched, driver_log, timeout_s, server_alive):
        driver_log.write_text("Traceback: bench_serving stalled\n")
        return bench.TIMEOUT_EXIT_CODE

    monkeypatch.setattr(interleaved.bench, "run_bench_driver", driver_killed_at_its_timeout)
    exit_code, document = run_main(tmp_path)
    assert exit_code == 1
    assert [run["status"] for run in document["runs"]] == ["failed"] * 12  # 2 concurrencies x 3 rounds x 2
    assert all("--bench-timeout-s reached" in run["error"] and "stalled" in run["error"]
               for run in document["runs"])
    assert "stalled" in (tmp_path / interleaved.DRIVER_LOG_FILE).read_text()
    assert "| 512x256 | dynamic | 128 | 0 | failed |" in (tmp_path / interleaved.REPORT_FILE).read_text()


def test_three_servers_and_two_workloads_end_to_end_with_a_driver_that_answers(tmp_path, monkeypatch):
    """Every measured run's result line is recorded with its workload and round, and the report
    compares the first configuration with the two others."""
    fake_servers(monkeypatch, HEALTHY_FOREVER, HEALTHY_FOREVER)
    monkeypatch.setattr(interleaved, "server_commands", lambda args, names, workloads: [
        (name, 31000 + index, HEALTHY_FOREVER) for index, name in enumerate(names)])
    throughput = {"dynamic": 1000.0, "plain": 800.0, "eagle3": 1250.0}

    def driver_that_answers(command, watched, driver_log, timeout_s, server_alive):
        for path, on_line in watched:
            if path.name.startswith("after_warmup") or "after_warmup" in path.name:
                on_line({"server_info": {}})
                continue
            name = path.stem.rsplit("_", 1)[1]
            concurrency = int(path.stem.split("_c")[1].split("_")[0])
            prompts = max(8, 3 * concurrency)  # both workloads: 3 waves, at least 8 prompts
            line = bench_result_line(throughput[name], [0.1] * prompts, [[0.01]] * prompts)
            on_line({**line, "max_concurrency": concurrency, "mean_ttft_ms": 100.0})
        driver_log.write_text("done\n")
        return 0

    monkeypatch.setattr(interleaved.bench, "run_bench_driver", driver_that_answers)
    exit_code = interleaved.main(["--model-path", "m", "--draft-model-path", "d", "--out", str(tmp_path),
                                  "--configs", "dynamic,plain,eagle3", "--rounds", "2",
                                  "--workload", "512x256:4,1", "--workload", "1024x2:4"])
    document = results.load_results(tmp_path / interleaved.RESULTS_FILE)
    assert exit_code == 0
    assert len(document["runs"]) == 3 * 2 * 3  # (2 + 1 concurrencies) x 2 rounds x 3 configurations
    assert {(run["workload"], run["round"]) for run in document["runs"]} == {
        (workload, round_index) for workload in ("512x256", "1024x2") for round_index in (0, 1)}
    assert document["sources"][0]["settings"]["max_total_tokens"] == 5130  # 1.25 x 4 x 1026
    report = (tmp_path / interleaved.REPORT_FILE).read_text()
    assert "| 1024x2 | 4 | 1.250 | 1.250, 1.250 |" in report
    assert "| 512x256 | 1 | 0.800 | 0.800, 0.800 |" in report
