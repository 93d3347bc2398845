"""The interleaved two-server benchmark (benchmark/interleaved.py): run order, commands, summary."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

import interleaved  # noqa: E402
from sweeplib import bench, bench_driver, results  # noqa: E402
from benchmark_helpers import flag_values  # noqa: E402


def parse(tmp_path: Path, *extra: str):
    args = interleaved.build_parser().parse_args(
        ["--model-path", "m", "--draft-model-path", "d", "--out", str(tmp_path), *extra])
    args.server_env = {}
    return args


def test_runs_alternate_abba_so_each_configuration_runs_every_round():
    assert interleaved.run_order(("dynamic", "plain"), 3) == [
        "dynamic", "plain", "plain", "dynamic", "dynamic", "plain"]
    assert interleaved.run_order(("a", "b"), 1) == ["a", "b"]


def test_both_servers_get_the_same_memory_flags_on_their_own_ports(tmp_path):
    args = parse(tmp_path, "--port", "31000", "--max-total-tokens", "150000")
    (first, first_port, first_command), (second, second_port, second_command) = \
        interleaved.server_commands(args, ("dynamic", "plain"))
    assert (first, first_port, second, second_port) == ("dynamic", 31000, "plain", 31001)
    for command, port in ((first_command, first_port), (second_command, second_port)):
        # The sweep's common flags come first; the appended pair wins in sglang's argparse.
        memory_at = len(command) - 1 - command[::-1].index("--mem-fraction-static")
        assert command[memory_at:memory_at + 4] == [
            "--mem-fraction-static", interleaved.SHARED_MEMORY_FRACTION, "--max-total-tokens", "150000"]
        assert command.count("--mem-fraction-static") == 2
        assert command[command.index("--port") + 1] == str(port)
    assert first_command[first_command.index("--speculative-algorithm") + 1] == "EAGLE3_DYNAMIC"
    assert "--speculative-algorithm" not in second_command
    assert [part if part != "31000" else "31001" for part in first_command[:len(second_command)]] == second_command


def test_driver_runs_warm_ups_then_abba_runs_each_against_its_own_server(tmp_path):
    args = parse(tmp_path, "--concurrencies", "128,64", "--rounds", "2")
    served = [interleaved.ServedConfig("dynamic", None, 30000), interleaved.ServedConfig("plain", None, 30001)]
    settings = bench.BenchSettings("tok", 512, 256, 1, False, ())
    command, measured = interleaved.bench_groups(args, settings, served, ("dynamic", "plain"), tmp_path)
    groups = bench_driver.parse_groups(command[2:])
    ports = [flag_values(flags)["--port"][0] for _, flags in groups]
    output_lens = [flag_values(flags)["--random-output-len"][0] for _, flags in groups]
    assert ports == ["30000", "30001"] + ["30000", "30001", "30001", "30000"] * 2
    assert output_lens == ["16", "16"] + ["256"] * 8
    assert groups[0][0] == [(128, 128), (64, 64)]
    assert [runs for runs, _ in groups[2:]] == [[(128, 384)]] * 4 + [[(64, 192)]] * 4
    assert [run.config for run in measured] == ["dynamic", "plain", "plain", "dynamic"] * 2
    assert [run.concurrency for run in measured] == [128] * 4 + [64] * 4
    assert len({run.output_file for run in measured}) == 8


def run(config: str, concurrency: int, throughput: float, ttft: float, status: str = results.RUN_OK) -> dict:
    return {"config": config, "concurrency": concurrency, "status": status,
            "metrics": {"output_throughput": throughput, "median_ttft_ms": ttft, "mean_ttft_ms": ttft}}


def test_summary_is_the_ratio_of_means_over_the_runs_that_completed():
    runs = [run("dynamic", 128, 7200, 1100), run("plain", 128, 7500, 1000),
            run("plain", 128, 7300, 1000), run("dynamic", 128, 7600, 1000),
            run("dynamic", 128, 1, 1, status="failed")]
    [row] = interleaved.summary_rows(runs, ("dynamic", "plain"))
    assert row["throughputs"] == {"dynamic": [7200, 7600], "plain": [7500, 7300]}
    assert row["output_throughput_ratio"] == 1.0
    assert abs(row["median_ttft_ms_ratio"] - 1.05) < 1e-12


def test_summary_of_a_concurrency_without_runs_of_one_configuration_has_no_ratio():
    [row] = interleaved.summary_rows([run("dynamic", 64, 5000, 500)], ("dynamic", "plain"))
    assert row["output_throughput_ratio"] is None


def test_report_lists_the_ratios_and_every_run_with_its_speculative_steps():
    document = results.new_results_document(["interleaved.py"], {})
    document["runs"] = [run("dynamic", 64, 5500, 560), run("plain", 64, 5700, 550)]
    document["runs"][0]["mode_counters"] = {"delta": {"speculative_steps": 16, "plain_steps": 752}}
    text = interleaved.report_markdown(document, ("dynamic", "plain"))
    assert "| 64 | 5500 | 5700 | 0.965 | 1.018 | 1.018 |" in text
    assert "| dynamic | 64 | ok | 5500 | 560.0 | 16 | 752 |" in text


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
                        lambda args, pair: [(pair[0], 31000, first), (pair[1], 31001, second)])
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
    assert "| dynamic | 128 | failed |" in (tmp_path / interleaved.REPORT_FILE).read_text()
