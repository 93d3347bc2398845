"""The interleaved two-server benchmark (benchmark/interleaved.py): run order, commands, summary."""

from __future__ import annotations

import sys
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
    assert [config for config, _, _ in measured] == ["dynamic", "plain", "plain", "dynamic"] * 2
    assert len({str(path) for _, _, path in measured}) == 8


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


def test_a_server_that_does_not_start_stops_both_and_is_recorded(tmp_path, monkeypatch):
    def commands(args, pair):
        healthy_forever = [sys.executable, "-c", "import time; time.sleep(60)"]
        dies = [sys.executable, "-c", "import sys; print('no GPU'); sys.exit(3)"]
        return [(pair[0], 31000, healthy_forever), (pair[1], 31001, dies)]

    monkeypatch.setattr(interleaved, "server_commands", commands)
    monkeypatch.setattr(interleaved.server, "wait_until_healthy",
                        lambda running, timeout_s, tail: _wait_for_exit(running, timeout_s, tail))
    exit_code = interleaved.main(["--model-path", "m", "--draft-model-path", "d", "--out", str(tmp_path)])
    assert exit_code == 1
    document = results.load_results(tmp_path / interleaved.RESULTS_FILE)
    assert document["configs"]["dynamic"]["status"] == "ok"  # it was the healthy one
    assert document["configs"]["plain"]["status"] == "failed_to_start"
    assert "no GPU" in document["configs"]["plain"]["error"]
    assert document["runs"] == []


def _wait_for_exit(running, timeout_s, tail_lines):
    """The first server counts as healthy at once; the second is waited for until it exits."""
    if running.config == "dynamic":
        return 0.0
    return _REAL_WAIT(running, 30.0, tail_lines)


_REAL_WAIT = interleaved.server.wait_until_healthy
