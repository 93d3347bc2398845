#!/usr/bin/env python3
"""Two configurations served at once on one GPU and benchmarked in turn, A B B A A B ...

    python benchmark/interleaved.py --model-path M --draft-model-path D --configs dynamic,plain \\
        --concurrencies 128,64 --rounds 3 --out DIR [options]

A sweep (``sweep.py run``) serves one configuration after another, so a ratio of two of its
runs also holds the difference between two server starts and the GPU's drift over minutes:
plain decoding alone ran at 7,216 to 7,851 tok/s at 128 requests (input 512, output 256)
across the sweeps in ``benchmark/results/``, more than the 2% that decide a 0.98 bar. Here
both servers are up together (started one after the other, each healthy before the next
starts), each given the same memory (``--mem-fraction-static`` and a ``--max-total-tokens``
cap, appended to the common flags so that both fit), and at each
concurrency the runs alternate in ABBA order, ``--rounds`` runs per configuration; the
report gives every run and the ratio of the two configurations' mean throughputs. Each run is
the sweep's (random token ids, every request ``--output-len`` tokens, ``--waves`` x the
concurrency prompts, bench_serving's cache flush before it), and every server gets one
unrecorded warm-up wave of ``--warmup-output-len`` tokens at each concurrency first.
EAGLE3_DYNAMIC's mode counters are recorded per run, so a run that paid a speculative probe
shows it.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sweep
from sweeplib import bench, bench_driver, configs, mode_counters, results, server

logger = logging.getLogger("interleaved")

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
DRIVER_LOG_FILE = "bench_driver_tail.txt"
ERROR_TAIL_LINES = 30
LOG_TAIL_LINES = 200
# Both servers of an 8B-shaped pair fit on one H200 with this cap: 200,000 tokens of KV each
# hold 128 requests of 512 + 256 tokens twice over.
DEFAULT_MAX_TOTAL_TOKENS = 200_000
SHARED_MEMORY_FRACTION = "0.9"


def run_order(pair: tuple[str, str], rounds: int) -> list[str]:
    """A B B A A B ...: each configuration runs ``rounds`` times, and a drift that is linear
    in time favours neither over each two rounds."""
    first, second = pair
    order: list[str] = []
    for index in range(rounds):
        order += [first, second] if index % 2 == 0 else [second, first]
    return order


def ratio_of_means(numerators: list[float], denominators: list[float]) -> float | None:
    if not numerators or not denominators or statistics.mean(denominators) == 0:
        return None
    return statistics.mean(numerators) / statistics.mean(denominators)


def summary_rows(runs: list[dict], pair: tuple[str, str]) -> list[dict]:
    """Per concurrency: each configuration's throughputs in run order, and the first
    configuration's mean throughput and TTFT over the second's."""
    first, second = pair
    rows = []
    for concurrency in sorted({run["concurrency"] for run in runs}, reverse=True):
        ok = [run for run in runs if run["concurrency"] == concurrency and run["status"] == results.RUN_OK]
        of = {config: [run["metrics"] for run in ok if run["config"] == config] for config in pair}
        values = {config: {key: [m[key] for m in of[config]] for key in
                           ("output_throughput", "median_ttft_ms", "mean_ttft_ms")} for config in pair}
        rows.append({
            "concurrency": concurrency,
            "throughputs": {config: values[config]["output_throughput"] for config in pair},
            **{f"{key}_ratio": ratio_of_means(values[first][key], values[second][key])
               for key in ("output_throughput", "median_ttft_ms", "mean_ttft_ms")},
        })
    return rows


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def report_markdown(document: dict, pair: tuple[str, str]) -> str:
    first, second = pair
    lines = [f"# {first} against {second}, both servers up at once, runs in ABBA order", "",
             f"`{document['sources'][0]['command_line']}`, {document['sources'][0]['created']}, "
             f"{document['sources'][0]['gpu']}.", "",
             f"| requests | {first} tok/s | {second} tok/s | tok/s ratio of means | "
             "median TTFT ratio of means | mean TTFT ratio of means |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in summary_rows(document["runs"], pair):
        cells = [", ".join(f"{v:.0f}" for v in row["throughputs"][config]) for config in pair]
        lines.append(f"| {row['concurrency']} | {cells[0]} | {cells[1]} | "
                     f"{_cell(row['output_throughput_ratio'])} | {_cell(row['median_ttft_ms_ratio'])} | "
                     f"{_cell(row['mean_ttft_ms_ratio'])} |")
    lines += ["", "Every run, in the order it ran:", "",
              "| config | requests | status | tok/s | median TTFT (ms) | speculative steps | plain steps |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for run in document["runs"]:
        metrics, delta = run["metrics"], (run.get("mode_counters") or {}).get("delta") or {}
        throughput = f"{metrics['output_throughput']:.0f}" if metrics else ""
        ttft = f"{metrics['median_ttft_ms']:.1f}" if metrics else ""
        lines.append(f"| {run['config']} | {run['concurrency']} | {run['status']} | {throughput} | {ttft} | "
                     f"{delta.get('speculative_steps', '')} | {delta.get('plain_steps', '')} |")
    return "\n".join(lines) + "\n"


@dataclasses.dataclass
class ServedConfig:
    config: str
    running: server.RunningServer
    port: int


def server_commands(args: argparse.Namespace, pair: tuple[str, str]) -> list[tuple[str, int, list[str]]]:
    """(config, port, command) of both servers: the sweep's commands on consecutive ports, with
    the same memory flags appended (later flags win) so that both fit on the GPU."""
    setup = configs.server_setup(args)
    memory = ("--mem-fraction-static", SHARED_MEMORY_FRACTION, "--max-total-tokens", str(args.max_total_tokens))
    return [(config, args.port + offset, configs.server_command(config, dataclasses.replace(
        setup, port=args.port + offset, common_args=setup.common_args + memory)))
        for offset, config in enumerate(pair)]


def start_servers(args: argparse.Namespace, pair: tuple[str, str], scratch: Path, document: dict,
                  served: list[ServedConfig]) -> None:
    """Start the servers one after the other, each healthy before the next starts (so that
    EAGLE3_DYNAMIC's start-up calibration does not time its graphs beside the other server's
    loading and capture), appending each to ``served`` as it is launched so that the caller
    stops it whatever happens; a server that does not start is recorded and raises."""
    for config, port, command in server_commands(args, pair):
        record = document["configs"][config] = sweep.config_record(args, command)
        logger.info("[%s] starting: %s", config, shlex.join(command))
        entry = ServedConfig(config, server.start_server(
            config, command, args.server_env, scratch / f"server_{config}.log",
            server.base_url_of(args.host, port)), port)
        served.append(entry)
        try:
            record["startup_s"] = server.wait_until_healthy(entry.running, args.server_timeout_s, ERROR_TAIL_LINES)
        except server.ServerError as error:
            record.update(status="failed_to_start", error=str(error))
            raise
        record["status"] = results.RUN_OK
        logger.info("[%s] healthy after %.0f s", config, record["startup_s"])


@dataclasses.dataclass(frozen=True)
class MeasuredRun:
    config: str
    concurrency: int
    prompts: int
    output_file: Path


def bench_groups(args: argparse.Namespace, settings: bench.BenchSettings, served: list[ServedConfig],
                 pair: tuple[str, str], scratch: Path) -> tuple[list[str], list[MeasuredRun]]:
    """The driver's command line (warm-up groups, then the measured runs in ABBA order per
    concurrency) and the measured runs."""
    port_of = {entry.config: entry.port for entry in served}
    warm_up = dataclasses.replace(settings, output_len=args.warmup_output_len)
    groups = [(bench.RunGroup(warm_up, tuple((c, c) for c in args.concurrencies),
                              str(scratch / f"warmup_{config}.jsonl")), port_of[config]) for config in pair]
    measured = []
    for concurrency in args.concurrencies:
        prompts = bench.prompts_for_concurrency(concurrency, args.waves, args.min_prompts)
        for index, config in enumerate(run_order(pair, args.rounds)):
            output_file = scratch / f"c{concurrency}_{index}_{config}.jsonl"
            groups.append((bench.RunGroup(settings, ((concurrency, prompts),), str(output_file)), port_of[config]))
            measured.append(MeasuredRun(config, concurrency, prompts, output_file))
    return bench.bench_driver_command_per_port(groups, args.host), measured


def run_benchmarks(args: argparse.Namespace, served: list[ServedConfig], pair: tuple[str, str],
                   scratch: Path, document: dict, out_dir: Path) -> int:
    """Run the driver, recording each run as its result line appears; a run without one is
    recorded as failed with the driver's output tail. Returns the driver's exit code."""
    settings = bench.BenchSettings(args.tokenizer or args.model_path, args.input_len, args.output_len,
                                   args.seed, args.visible_special_tokens, tuple(shlex.split(args.bench_args)))
    command, measured = bench_groups(args, settings, served, pair, scratch)
    snapshots: dict[Path, dict | None] = {}
    recorded: set[Path] = set()
    started = {"at": time.monotonic()}
    watched = []
    for run in measured:
        def on_snapshot(line: dict, run: MeasuredRun = run) -> None:
            snapshots[run.output_file] = mode_counters.find_mode_counters(line.get("server_info"))
            started["at"] = time.monotonic()

        def on_result(line: dict, run: MeasuredRun = run) -> None:
            record = sweep.record_from_result_line(run.config, run.prompts, line, snapshots.get(run.output_file),
                                                   time.monotonic() - started["at"])
            record["metrics"]["mean_ttft_ms"] = line.get("mean_ttft_ms")
            recorded.add(run.output_file)
            document["runs"].append(record)
            results.save_results(document, out_dir / RESULTS_FILE)
            logger.info("%s", sweep.progress_line(record))

        watched += [(Path(bench_driver.after_warmup_file(str(run.output_file))), on_snapshot),
                    (run.output_file, on_result)]
    driver_log = scratch / "bench_driver.log"
    exit_code = bench.run_bench_driver(
        command, watched, driver_log, args.bench_timeout_s * (len(measured) + len(pair)),
        server_alive=lambda: all(server.server_is_running(e.running) for e in served))
    tail = server.log_tail(driver_log, ERROR_TAIL_LINES)
    (out_dir / DRIVER_LOG_FILE).write_text(server.log_tail(driver_log, LOG_TAIL_LINES))
    reason = {bench.TIMEOUT_EXIT_CODE: "--bench-timeout-s reached", bench.SERVER_DIED_EXIT_CODE: "a server died"}.get(
        exit_code, f"no result line (bench driver exit code {exit_code})")
    for run in measured:
        if run.output_file not in recorded:
            document["runs"].append(sweep.run_record(run.config, run.concurrency, run.prompts, "failed",
                                                     f"{reason}; bench_serving output tail:\n{tail}"))
    return exit_code


def concurrency_list(text: str) -> list[int]:
    """The given concurrencies in the given order (the sweep's check of each value)."""
    sweep.parse_int_list(text)
    return list(dict.fromkeys(int(part) for part in text.split(",") if part.strip()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    configs.add_server_arguments(parser)
    parser.set_defaults(configs="dynamic,plain")
    add = parser.add_argument
    add("--tokenizer", help="tokenizer for bench_serving (default: --model-path)")
    add("--out", required=True, help="output folder")
    add("--concurrencies", type=concurrency_list, default=[128, 64],
        help="comma-separated, run in the given order (default 128,64)")
    add("--rounds", type=int, default=3, help="runs per configuration and concurrency (default %(default)s)")
    add("--input-len", type=int, default=512)
    add("--output-len", type=int, default=256)
    add("--waves", type=int, default=3, help="prompts per run = max(min-prompts, waves x concurrency)")
    add("--min-prompts", type=int, default=8)
    add("--warmup-output-len", type=int, default=16, help="output tokens of the warm-up waves")
    add("--max-total-tokens", type=int, default=DEFAULT_MAX_TOTAL_TOKENS,
        help="KV cap of each server, so that both fit (default %(default)s)")
    add("--visible-special-tokens", action="store_true", help="bench requests with skip_special_tokens=False")
    add("--bench-args", default="", help="extra sglang.bench_serving flags for every run")
    add("--seed", type=int, default=1)
    add("--log-tail-lines", type=int, default=LOG_TAIL_LINES,
        help=f"server log lines kept per configuration in {sweep.SERVER_LOGS_FILE} (default %(default)s)")
    add("--bench-timeout-s", type=float, default=300.0,
        help="per run: the bench process is killed after this times the number of runs and warm-ups "
             "(default %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args = build_parser().parse_args(argv)
    args.server_env = configs.parse_env_assignments(args.server_env)
    names = configs.parse_config_list(args.configs)
    if len(names) != 2:
        raise SystemExit(f"--configs names two configurations, got {args.configs!r}")
    pair = (names[0], names[1])
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    given = sys.argv[1:] if argv is None else argv
    document = results.new_results_document([sys.executable, sys.argv[0], *given], {
        key: getattr(args, key) for key in ("configs", "concurrencies", "rounds", "input_len", "output_len",
                                            "waves", "min_prompts", "warmup_output_len", "max_total_tokens",
                                            "server_env")})
    served: list[ServedConfig] = []
    exit_code = 1
    signal.signal(signal.SIGTERM, sweep.stop_on_sigterm)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        try:
            start_servers(args, pair, scratch, document, served)
            exit_code = run_benchmarks(args, served, pair, scratch, document, out_dir)
        except server.ServerError as error:
            logger.error("%s", error)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            for entry in served:
                server.stop_server(entry.running)
            sweep.write_server_logs(out_dir, {entry.config: server.log_tail(entry.running.log_path, args.log_tail_lines)
                                              for entry in served})
            results.save_results(document, out_dir / RESULTS_FILE)
            (out_dir / REPORT_FILE).write_text(report_markdown(document, pair))
            logger.info("wrote %s", out_dir / REPORT_FILE)
    expected = len(args.concurrencies) * args.rounds * 2
    ok = sum(run["status"] == results.RUN_OK for run in document["runs"])
    return 0 if exit_code == 0 and ok == expected else 1


if __name__ == "__main__":
    sys.exit(main())
