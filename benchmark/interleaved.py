#!/usr/bin/env python3
"""Two to four configurations served at once on one GPU and benchmarked in turn, A B B A ...

    python benchmark/interleaved.py --model-path M --draft-model-path D --configs dynamic,plain \\
        --concurrencies 128,64 --rounds 3 --out DIR [options]

A sweep (``sweep.py run``) serves one configuration after another, so a ratio of two of its
runs also holds the difference between two server starts and the GPU's drift over minutes:
plain decoding alone ran at 7,216 to 7,851 tok/s at 128 requests (input 512, output 256)
across the sweeps in ``benchmark/results/``, more than the 2% that decide a 0.98 bar. Here
every server is up together (started one after the other, each healthy before the next
starts), each given the same memory (``--mem-fraction-static`` and a ``--max-total-tokens``
cap, appended to the common flags so that all fit), and at each concurrency the runs go
round by round, the configurations in the given order and then reversed (A B B A A B with
two, A B C C B A with three), ``--rounds`` runs per configuration; the report gives every run,
and the ratio of the first configuration's mean throughput and TTFT to each other one's, with
the ratio of each round's pair of runs. Each run is the sweep's (random token ids, every
request ``--output-len`` tokens, ``--waves`` x the concurrency prompts, bench_serving's cache
flush before it), and every server gets one unrecorded warm-up wave of
``--warmup-output-len`` tokens at each concurrency first. EAGLE3_DYNAMIC's mode counters are
recorded per run, so a run that paid a speculative probe shows it.

``--workload INxOUT:C1,C2[:prompts=N][:waves=W]`` (repeatable) benchmarks several prompt and
output lengths on the same servers, one after the other (e.g. ``512x256:128,64`` and
``1024x2:128,64,16:prompts=256``); without it the one workload is ``--input-len``,
``--output-len``, ``--concurrencies``, ``--waves`` and ``--min-prompts``. The KV cap
defaults to what the largest workload keeps in flight (its concurrency times input plus
output tokens) with a quarter more, so that no configuration's requests queue for KV.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import shlex
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sweep
from sweeplib import bench, bench_driver, configs, cpu_sets, mode_counters, results, server

logger = logging.getLogger("interleaved")

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
DRIVER_LOG_FILE = "bench_driver_tail.txt"
ERROR_TAIL_LINES = 30
LOG_TAIL_LINES = 200
MIN_CONFIGS, MAX_CONFIGS = 2, 4
# Tokens each server's KV pool holds beyond what the largest workload keeps in flight
# (speculative steps allocate their draft tokens' slots too).
KV_HEADROOM = 1.25
SHARED_MEMORY_FRACTION = "0.9"
RATIO_KEYS = ("output_throughput", "median_ttft_ms", "mean_ttft_ms")


@dataclasses.dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int
    concurrencies: tuple[int, ...]
    waves: int
    min_prompts: int

    @property
    def label(self) -> str:
        return f"{self.input_len}x{self.output_len}"

    def tokens_in_flight(self) -> int:
        return max(self.concurrencies) * (self.input_len + self.output_len)


def parse_workload(text: str, waves: int, min_prompts: int) -> Workload:
    """``INxOUT:C1,C2[:prompts=N][:waves=W]``; prompts and waves default to the given ones."""
    parts = text.split(":")
    lengths, concurrencies, options = parts[0], parts[1] if len(parts) > 1 else "", parts[2:]
    try:
        input_len, output_len = (int(part) for part in lengths.split("x"))
        values = {"prompts": min_prompts, "waves": waves}
        for option in options:
            key, _, value = option.partition("=")
            if key not in values:
                raise ValueError(f"unknown option {key!r}")
            values[key] = int(value)
        workload = Workload(input_len, output_len, tuple(concurrency_list(concurrencies)),
                            values["waves"], values["prompts"])
    except ValueError as error:
        raise ValueError(f"--workload {text!r}: expected INxOUT:C1,C2[:prompts=N][:waves=W] ({error})") from None
    if min(input_len, output_len, workload.waves, workload.min_prompts) < 1:
        raise ValueError(f"--workload {text!r}: expected INxOUT:C1,C2[:prompts=N][:waves=W] with lengths, "
                         "prompts and waves of at least 1")
    return workload


def workloads_of(args: argparse.Namespace) -> list[Workload]:
    """The workloads to run; two with the same lengths may not share a concurrency (their
    runs would share a label and result files)."""
    if not args.workload:
        return [Workload(args.input_len, args.output_len, tuple(args.concurrencies), args.waves, args.min_prompts)]
    workloads = [parse_workload(text, args.waves, args.min_prompts) for text in args.workload]
    seen: set[tuple[str, int]] = set()
    for workload in workloads:
        for concurrency in workload.concurrencies:
            if (workload.label, concurrency) in seen:
                raise ValueError(f"--workload: {workload.label} at concurrency {concurrency} is given twice; "
                                 "list each concurrency of a prompt and output length once")
            seen.add((workload.label, concurrency))
    return workloads


def max_total_tokens(args: argparse.Namespace, workloads: list[Workload]) -> int:
    if args.max_total_tokens is not None:
        return args.max_total_tokens
    return math.ceil(KV_HEADROOM * max(workload.tokens_in_flight() for workload in workloads))


def run_order(names: tuple[str, ...], rounds: int) -> list[str]:
    """The configurations in order, then reversed, round by round (A B B A A B ... with two):
    each runs ``rounds`` times, and a drift that is linear in time favours none over each two
    rounds."""
    order: list[str] = []
    for index in range(rounds):
        order += list(names) if index % 2 == 0 else list(reversed(names))
    return order


def ratio_of_means(numerators: list[float], denominators: list[float]) -> float | None:
    if not numerators or not denominators or statistics.mean(denominators) == 0:
        return None
    return statistics.mean(numerators) / statistics.mean(denominators)


def round_ratios(runs: list[dict], first: str, other: str) -> list[float]:
    """The first configuration's throughput over the other's, round by round (both runs ok)."""
    by_round: dict[int, dict[str, float]] = {}
    for run in runs:
        by_round.setdefault(run["round"], {})[run["config"]] = run["metrics"]["output_throughput"]
    return [pair[first] / pair[other] for _, pair in sorted(by_round.items())
            if first in pair and other in pair and pair[other]]


def summary_rows(runs: list[dict], names: tuple[str, ...]) -> list[dict]:
    """Per workload (in the order run) and concurrency (largest first): each configuration's
    throughputs in run order, and the first configuration's mean throughput and TTFTs over each
    other one's, with the throughput ratios round by round."""
    first = names[0]
    rows = []
    for workload in dict.fromkeys(run["workload"] for run in runs):
        of_workload = [run for run in runs if run["workload"] == workload]
        for concurrency in sorted({run["concurrency"] for run in of_workload}, reverse=True):
            ok = [run for run in of_workload if run["concurrency"] == concurrency and run["status"] == results.RUN_OK]
            values = {name: {key: [run["metrics"][key] for run in ok if run["config"] == name] for key in RATIO_KEYS}
                      for name in names}
            rows.append({
                "workload": workload,
                "concurrency": concurrency,
                "throughputs": {name: values[name]["output_throughput"] for name in names},
                "ratios": {other: {**{key: ratio_of_means(values[first][key], values[other][key]) for key in RATIO_KEYS},
                                   "round_throughput_ratios": round_ratios(ok, first, other)}
                           for other in names[1:]},
            })
    return rows


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _ratio_table(rows: list[dict], first: str, other: str) -> list[str]:
    lines = [f"| workload | requests | {first} / {other} tok/s, ratio of means | per round | "
             "median TTFT, ratio of means | mean TTFT, ratio of means |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        ratios = row["ratios"][other]
        per_round = ", ".join(f"{value:.3f}" for value in ratios["round_throughput_ratios"]) or "n/a"
        lines.append(f"| {row['workload']} | {row['concurrency']} | {_cell(ratios['output_throughput'])} | "
                     f"{per_round} | {_cell(ratios['median_ttft_ms'])} | {_cell(ratios['mean_ttft_ms'])} |")
    return lines


def report_markdown(document: dict, names: tuple[str, ...]) -> str:
    source = document["sources"][0]
    rows = summary_rows(document["runs"], names)
    lines = [f"# {', '.join(names)}: all servers up at once, runs interleaved round by round", "",
             f"`{source['command_line']}`, {source['created']}, {source['gpu']}.", "",
             "| workload | requests | " + " | ".join(f"{name} tok/s" for name in names) + " |",
             "| --- | --- | " + " | ".join("---" for _ in names) + " |"]
    for row in rows:
        cells = [", ".join(f"{value:.0f}" for value in row["throughputs"][name]) for name in names]
        lines.append(f"| {row['workload']} | {row['concurrency']} | " + " | ".join(cells) + " |")
    for other in names[1:]:
        lines += [""] + _ratio_table(rows, names[0], other)
    lines += ["", "Every run, in the order it ran:", "",
              "| workload | config | requests | round | status | tok/s | median TTFT (ms) | first request's TTFT (ms) "
              "| speculative steps | plain steps |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in document["runs"]:
        metrics, delta = run["metrics"], (run.get("mode_counters") or {}).get("delta") or {}
        throughput = f"{metrics['output_throughput']:.0f}" if metrics else ""
        ttft = f"{metrics['median_ttft_ms']:.1f}" if metrics else ""
        first = (run.get("ttft_diagnostics") or {}).get("first_request_ttft_ms")
        first_ttft = f"{first:.0f}" if first is not None else ""
        lines.append(f"| {run['workload']} | {run['config']} | {run['concurrency']} | {run['round']} | {run['status']} | "
                     f"{throughput} | {ttft} | {first_ttft} | {delta.get('speculative_steps', '')} | "
                     f"{delta.get('plain_steps', '')} |")
    return "\n".join(lines) + "\n"


@dataclasses.dataclass
class ServedConfig:
    config: str
    running: server.RunningServer
    port: int


def server_commands(args: argparse.Namespace, names: tuple[str, ...],
                    workloads: list[Workload]) -> list[tuple[str, int, list[str]]]:
    """(config, port, command) of every server: the sweep's commands on consecutive ports, with
    the same memory flags appended (later flags win) so that all fit on the GPU."""
    setup = configs.server_setup(args, args.adaptive_config_path)
    memory = ("--mem-fraction-static", SHARED_MEMORY_FRACTION,
              "--max-total-tokens", str(max_total_tokens(args, workloads)))
    return [(name, args.port + offset, configs.server_command(name, dataclasses.replace(
        setup, port=args.port + offset, common_args=setup.common_args + memory)))
        for offset, name in enumerate(names)]


def start_servers(args: argparse.Namespace, names: tuple[str, ...], workloads: list[Workload], scratch: Path,
                  document: dict, served: list[ServedConfig]) -> None:
    """Start the servers one after the other, each healthy before the next starts (so that
    EAGLE3_DYNAMIC's start-up calibration does not time its graphs beside another server's
    loading and capture), appending each to ``served`` as it is launched so that the caller
    stops it whatever happens; a server that does not start is recorded and raises."""
    server_cpus: list[set[int] | None] = [None] * len(names)
    if args.pin_cpus:
        server_cpus, client_cpus = cpu_sets.cpu_sets(len(names))
        os.sched_setaffinity(0, client_cpus)  # bench_serving inherits it
        logger.info("CPUs: %s for the client", sorted(client_cpus))
    for (name, port, command), cpus in zip(server_commands(args, names, workloads), server_cpus):
        record = document["configs"][name] = sweep.config_record(args, command)
        if cpus:
            record["cpus"] = sorted(cpus)
        logger.info("[%s] starting%s: %s", name, f" on CPUs {sorted(cpus)}" if cpus else "",
                    shlex.join(command))
        entry = ServedConfig(name, server.start_server(
            name, command, args.server_env, scratch / f"server_{name}.log",
            server.base_url_of(args.host, port), cpus), port)
        served.append(entry)
        try:
            record["startup_s"] = server.wait_until_healthy(entry.running, args.server_timeout_s, ERROR_TAIL_LINES)
        except server.ServerError as error:
            record.update(status="failed_to_start", error=str(error))
            raise
        record["status"] = results.RUN_OK
        logger.info("[%s] healthy after %.0f s", name, record["startup_s"])


@dataclasses.dataclass(frozen=True)
class MeasuredRun:
    config: str
    workload: str
    concurrency: int
    round: int
    prompts: int
    output_file: Path


def bench_settings(args: argparse.Namespace, workload: Workload) -> bench.BenchSettings:
    return bench.BenchSettings(args.tokenizer or args.model_path, workload.input_len, workload.output_len,
                               args.seed, args.visible_special_tokens, tuple(shlex.split(args.bench_args)))


def bench_groups(args: argparse.Namespace, workloads: list[Workload], served: list[ServedConfig],
                 names: tuple[str, ...], scratch: Path) -> tuple[list[str], list[MeasuredRun]]:
    """The driver's command line (every workload's warm-up groups, then each workload's measured
    runs, round by round per concurrency) and the measured runs."""
    port_of = {entry.config: entry.port for entry in served}
    groups = []
    for workload in workloads:
        warm_up = dataclasses.replace(bench_settings(args, workload), output_len=args.warmup_output_len)
        groups += [(bench.RunGroup(warm_up, tuple((c, c) for c in workload.concurrencies),
                                   str(scratch / f"warmup_{workload.label}_{name}.jsonl")), port_of[name])
                   for name in names]
    measured = []
    for workload in workloads:
        settings = bench_settings(args, workload)
        for concurrency in workload.concurrencies:
            prompts = bench.prompts_for_concurrency(concurrency, workload.waves, workload.min_prompts)
            for index, name in enumerate(run_order(names, args.rounds)):
                output_file = scratch / f"{workload.label}_c{concurrency}_{index}_{name}.jsonl"
                groups.append((bench.RunGroup(settings, ((concurrency, prompts),), str(output_file)), port_of[name]))
                measured.append(MeasuredRun(name, workload.label, concurrency, index // len(names), prompts,
                                            output_file))
    return bench.bench_driver_command_per_port(groups, args.host), measured


def labelled(record: dict, run: MeasuredRun) -> dict:
    record.update(workload=run.workload, round=run.round)
    return record


def run_benchmarks(args: argparse.Namespace, workloads: list[Workload], served: list[ServedConfig],
                   names: tuple[str, ...], scratch: Path, document: dict, out_dir: Path) -> int:
    """Run the driver, recording each run as its result line appears; a run without one is
    recorded as failed with the driver's output tail. Returns the driver's exit code."""
    command, measured = bench_groups(args, workloads, served, names, scratch)
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
            document["runs"].append(labelled(record, run))
            results.save_results(document, out_dir / RESULTS_FILE)
            logger.info("%s %s", run.workload, sweep.progress_line(record))

        watched += [(Path(bench_driver.after_warmup_file(str(run.output_file))), on_snapshot),
                    (run.output_file, on_result)]
    driver_log = scratch / "bench_driver.log"
    warm_ups = len(names) * len(workloads)
    exit_code = bench.run_bench_driver(
        command, watched, driver_log, args.bench_timeout_s * (len(measured) + warm_ups),
        server_alive=lambda: all(server.server_is_running(e.running) for e in served))
    tail = server.log_tail(driver_log, ERROR_TAIL_LINES)
    (out_dir / DRIVER_LOG_FILE).write_text(server.log_tail(driver_log, LOG_TAIL_LINES))
    reason = {bench.TIMEOUT_EXIT_CODE: "--bench-timeout-s reached", bench.SERVER_DIED_EXIT_CODE: "a server died"}.get(
        exit_code, f"no result line (bench driver exit code {exit_code})")
    for run in measured:
        if run.output_file not in recorded:
            document["runs"].append(labelled(sweep.run_record(
                run.config, run.concurrency, run.prompts, "failed",
                f"{reason}; bench_serving output tail:\n{tail}"), run))
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
    add("--workload", action="append", default=[], metavar="INxOUT:C1,C2[:prompts=N][:waves=W]",
        help="a workload to run on the same servers, repeatable, in the given order (default: the one of "
             "--input-len, --output-len, --concurrencies, --waves, --min-prompts)")
    add("--warmup-output-len", type=int, default=16, help="output tokens of the warm-up waves")
    add("--max-total-tokens", type=int,
        help=f"KV cap of each server, so that all fit (default: {KV_HEADROOM} x the largest workload's "
             "concurrency x (input + output))")
    add("--visible-special-tokens", action="store_true", help="bench requests with skip_special_tokens=False")
    add("--bench-args", default="", help="extra sglang.bench_serving flags for every run")
    add("--seed", type=int, default=1)
    add("--bench-timeout-s", type=float, default=300.0,
        help="per run: the bench process is killed after this times the number of runs and warm-ups "
             "(default %(default)s)")
    add("--pin-cpus", action="store_true",
        help="run each server on physical CPU cores of its own and the benchmark client on the rest "
             "(an idle sglang scheduler keeps a CPU busy; see sweeplib/cpu_sets.py)")
    add("--log-tail-lines", type=int, default=LOG_TAIL_LINES,
        help=f"server log lines kept per configuration in {sweep.SERVER_LOGS_FILE} (default %(default)s)")
    return parser


def config_names(text: str) -> tuple[str, ...]:
    names = configs.parse_config_list(text)
    if not MIN_CONFIGS <= len(names) <= MAX_CONFIGS:
        raise SystemExit(f"--configs names {MIN_CONFIGS} to {MAX_CONFIGS} configurations, got {text!r}")
    return tuple(names)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args = build_parser().parse_args(argv)
    args.server_env = configs.parse_env_assignments(args.server_env)
    names = config_names(args.configs)
    try:
        workloads = workloads_of(args)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    args.adaptive_config_path = configs.adaptive_config_path(args, list(names), out_dir)
    given = sys.argv[1:] if argv is None else argv
    document = results.new_results_document([sys.executable, sys.argv[0], *given], {
        "workloads": [dataclasses.asdict(workload) for workload in workloads],
        "max_total_tokens": max_total_tokens(args, workloads),
        **{key: getattr(args, key) for key in ("configs", "rounds", "warmup_output_len", "server_env")}})
    served: list[ServedConfig] = []
    exit_code = 1
    signal.signal(signal.SIGTERM, sweep.stop_on_sigterm)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        try:
            start_servers(args, names, workloads, scratch, document, served)
            exit_code = run_benchmarks(args, workloads, served, names, scratch, document, out_dir)
        except server.ServerError as error:
            logger.error("%s", error)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            for entry in served:
                server.stop_server(entry.running)
            sweep.write_server_logs(out_dir, {entry.config: server.log_tail(entry.running.log_path, args.log_tail_lines)
                                              for entry in served})
            results.save_results(document, out_dir / RESULTS_FILE)
            (out_dir / REPORT_FILE).write_text(report_markdown(document, names))
            logger.info("wrote %s", out_dir / REPORT_FILE)
    expected = sum(len(workload.concurrencies) for workload in workloads) * args.rounds * len(names)
    ok = sum(run["status"] == results.RUN_OK for run in document["runs"])
    return 0 if exit_code == 0 and ok == expected else 1


if __name__ == "__main__":
    sys.exit(main())
