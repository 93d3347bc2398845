#!/usr/bin/env python3
"""One-command serving benchmark of plain decoding, EAGLE3, adaptive EAGLE3 and EAGLE3_DYNAMIC.

    python benchmark/sweep.py run --model-path M --draft-model-path D --out DIR [options]
    python benchmark/sweep.py report --inputs A/results.json B/results.json --out DIR

`run` starts each selected configuration's server in turn, drives it with sglang.bench_serving
at every concurrency, stops it, and writes results.json, report.md and plots into --out.
`report` merges result files of several `run`s into one results.json, report.md and plots.
See benchmark/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import signal
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sweeplib import bench, bench_driver, configs, mode_counters, results, server, ttft_probe
from sweeplib.report import write_report

logger = logging.getLogger("sweep")

RESULTS_FILE = "results.json"
INTERRUPTED = "interrupted (SIGTERM: an outer timeout)"
SERVER_LOGS_FILE = "server_logs_tail.txt"
ERROR_TAIL_LINES = 30

FULL_DEFAULTS = {"concurrencies": "1,4,16,32,64,128", "output_len": 256, "waves": 2, "min_prompts": 4,
                 "probe_requests": 0}
QUICK_DEFAULTS = {"concurrencies": "1,64", "output_len": 64, "waves": 1, "min_prompts": 4, "probe_requests": 2}


def parse_int_list(text: str) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or any(v < 1 for v in values):
        raise ValueError(f"expected a comma-separated list of positive integers, got {text!r}")
    return sorted(set(values))


def warmup_output_len(given: int | None, output_len: int) -> int:
    if given is None:
        return output_len
    if given < 1:
        raise ValueError(f"--warmup-output-len must be at least 1, got {given}")
    return given


def run_record(config: str, concurrency: int, num_prompts: int, status: str, error: str | None = None) -> dict:
    return {"config": config, "concurrency": concurrency, "num_prompts": num_prompts, "status": status,
            "error": error, "wall_s": None, "metrics": {}, "ttft_diagnostics": {}, "mode_counters": None}


def record_from_result_line(config: str, num_prompts: int, line: dict, counters_before: dict | None,
                            wall_s: float, before_source: str = mode_counters.BEFORE_AFTER_WARMUP) -> dict:
    """A run record from one bench_serving result line. The line's server_info was fetched right
    after the run, so it holds the mode counters after it; ``before_source`` says where the
    counters before it come from."""
    metrics = bench.recorded_metrics(line)
    completed = metrics.get("completed") or 0
    record = run_record(
        config, int(line["max_concurrency"]), num_prompts,
        results.RUN_OK if completed == num_prompts else "incomplete",
        None if completed == num_prompts else f"{completed} of {num_prompts} requests completed",
    )
    counters_after = mode_counters.find_mode_counters(line.get("server_info"))
    record.update(wall_s=wall_s, metrics=metrics, ttft_diagnostics=bench.ttft_diagnostics(line),
                  mode_counters={"before": counters_before, "before_source": before_source,
                                 "after": counters_after,
                                 "delta": mode_counters.counter_delta(counters_before, counters_after)})
    return record


def warm_up_group(plan: argparse.Namespace, scratch: Path, config: str) -> bench.RunGroup:
    """One unrecorded wave at every concurrency, so that every configuration is measured
    after its lazily compiled kernels (Triton, sglang's JIT ops) exist, whatever ran before it
    on the machine. Its output length is ``plan.warmup_output_len`` tokens."""
    return bench.RunGroup(dataclasses.replace(plan.bench_settings, output_len=plan.warmup_output_len),
                          tuple((c, c) for c in plan.concurrencies), str(scratch / f"warmup_{config}.jsonl"))


def bench_all_concurrencies(plan: argparse.Namespace, running: server.RunningServer, document: dict,
                            out_dir: Path, scratch: Path, deadline: float) -> None:
    """Warm up, then run bench_serving at every concurrency against the running server, in one
    bench process, recording each run as its result line appears. Concurrencies without a
    result line are recorded as failed, or as skipped where the time budget ended them."""
    config = running.config
    prompts = {c: bench.prompts_for_concurrency(c, plan.waves, plan.min_prompts) for c in plan.concurrencies}
    # The warm-up counts as one more run per concurrency.
    own_timeout_s = plan.bench_timeout_s * 2 * len(prompts)
    timeout_s = min(own_timeout_s, deadline - time.monotonic())
    if timeout_s <= 0:
        document["runs"] += [run_record(config, c, n, "skipped", "time budget spent") for c, n in prompts.items()]
        return
    warm_up = warm_up_group(plan, scratch, config)
    measured = bench.RunGroup(plan.bench_settings, tuple(prompts.items()), str(scratch / f"bench_{config}.jsonl"))
    driver_log = scratch / f"bench_{config}.log"
    command = bench.bench_driver_command([warm_up, measured], plan.setup.host, plan.setup.port)
    state = {"counters": mode_counters.find_mode_counters(server.fetch_server_info(running.base_url)),
             "since": time.monotonic()}
    # Counters after bench_serving's own warm-up request of each measured run, by concurrency.
    after_warmup: dict[int, dict | None] = {}
    done: set[int] = set()
    warmed: set[int] = set()

    def on_warm_up_result(line: dict) -> None:
        warmed.add(int(line["max_concurrency"]))
        state.update(counters=mode_counters.find_mode_counters(line.get("server_info")), since=time.monotonic())
        if warmed == set(plan.concurrencies):
            logger.info("[%s] warmed up at concurrencies %s", config, plan.concurrencies)

    def on_after_warmup(line: dict) -> None:
        after_warmup[int(line["max_concurrency"])] = mode_counters.find_mode_counters(
            line.get("server_info"))

    def on_result(line: dict) -> None:
        concurrency = int(line["max_concurrency"])
        snapshot = after_warmup.pop(concurrency, None)
        run = record_from_result_line(
            config, prompts[concurrency], line, snapshot or state["counters"],
            time.monotonic() - state["since"],
            mode_counters.BEFORE_AFTER_WARMUP if snapshot else mode_counters.BEFORE_PREVIOUS_RUN)
        state.update(counters=run["mode_counters"]["after"], since=time.monotonic())
        done.add(concurrency)
        document["runs"].append(run)
        results.save_results(document, out_dir / RESULTS_FILE)
        logger.info("%s", progress_line(run))

    exit_code = bench.run_bench_driver(
        command, [(Path(warm_up.output_file), on_warm_up_result),
                  (Path(bench_driver.after_warmup_file(measured.output_file)), on_after_warmup),
                  (Path(measured.output_file), on_result)],
        driver_log, timeout_s, server_alive=lambda: server.server_is_running(running))
    budget_ended = exit_code == bench.TIMEOUT_EXIT_CODE and timeout_s < own_timeout_s
    status = "skipped" if budget_ended else "failed"
    reason = {bench.TIMEOUT_EXIT_CODE: "time budget spent during the runs" if budget_ended
              else "--bench-timeout-s reached",
              bench.SERVER_DIED_EXIT_CODE: "server died"}.get(
        exit_code, f"no result line (bench driver exit code {exit_code})")
    output_tail = server.log_tail(driver_log, ERROR_TAIL_LINES)
    for concurrency in sorted(set(prompts) - done):
        run = run_record(config, concurrency, prompts[concurrency], status,
                         f"{reason}; bench_serving output tail:\n{output_tail}")
        document["runs"].append(run)
        logger.info("%s", progress_line(run))


def progress_line(record: dict) -> str:
    if record["status"] != results.RUN_OK:
        return f"[{record['config']}] c={record['concurrency']}: {record['status']}: {(record['error'] or '').splitlines()[0]}"
    m = record["metrics"]
    line = (
        f"[{record['config']}] c={record['concurrency']} n={record['num_prompts']}: "
        f"{m['output_throughput']:.0f} tok/s, {m['request_throughput']:.2f} req/s, "
        f"TTFT {m['median_ttft_ms']:.1f}/{m['p99_ttft_ms']:.1f} ms, "
        f"TPOT {m['median_tpot_ms']:.2f}/{m['p99_tpot_ms']:.2f} ms (median/p99), "
        f"accept {m['accept_length'] if m['accept_length'] is None else round(m['accept_length'], 2)}, "
        f"{record['wall_s']:.1f} s"
    )
    delta = (record.get("mode_counters") or {}).get("delta")
    if delta and delta["speculative_step_fraction"] is not None:
        line += (f", speculative steps {100 * delta['speculative_step_fraction']:.0f}%, "
                 f"switches to plain {delta['switches_to_plain']} / to spec {delta['switches_to_speculative']}")
    return line


def config_record(plan: argparse.Namespace, command: list[str]) -> dict:
    return {"status": "skipped", "error": None, "server_command": [results.shown_paths(part) for part in command],
            "server_env": plan.server_env, "startup_s": None, "max_running_requests": None,
            "server_version": None, "dynamic_policy": {}, "ttft_probe": None}


def sweep_config(plan: argparse.Namespace, config: str, document: dict, out_dir: Path,
                 scratch: Path, deadline: float, tails: dict[str, str]) -> None:
    """Serve and benchmark one configuration unless the time budget has less than
    ``--min-config-window-s`` left; record everything into `document`, and the trimmed server
    log into `tails`. Interrupted (SIGTERM), it records the configuration and its missing runs
    as failed and stops its server before unwinding."""
    command = configs.server_command(config, plan.setup)
    record = config_record(plan, command)
    document["configs"][config] = record
    left_s = deadline - time.monotonic()
    if left_s <= 0 or left_s < plan.min_config_window_s:
        record["error"] = ("time budget spent" if left_s <= 0 else
                           f"time budget: {left_s:.0f} s left, below --min-config-window-s")
        logger.warning("[%s] skipped: %s", config, record["error"])
        return
    if server.port_accepts_connections(plan.setup.host, plan.setup.port):
        record.update(status="failed_to_start", error=f"port {plan.setup.port} is already in use")
        logger.error("[%s] port %d is already in use; is another server running?", config, plan.setup.port)
        return
    log_path = scratch / f"server_{config}.log"
    logger.info("[%s] starting: %s", config, shlex.join(command))
    running = server.start_server(config, command, plan.server_env, log_path,
                                  server.base_url_of(plan.setup.host, plan.setup.port))
    try:
        wait_s = min(plan.server_timeout_s, deadline - time.monotonic())
        try:
            record["startup_s"] = server.wait_until_healthy(running, wait_s, ERROR_TAIL_LINES)
        except server.ServerError:
            if wait_s >= plan.server_timeout_s or not server.server_is_running(running):
                raise
            # The budget, not the server, ended the wait: not a failure of the configuration.
            record["error"] = f"time budget spent while the server was starting ({wait_s:.0f} s)"
            logger.warning("[%s] skipped: %s", config, record["error"])
            record_missing_runs(plan, config, document, "skipped", record["error"])
            return
        info = server.fetch_server_info(running.base_url)
        record.update(status=results.RUN_OK,
                      max_running_requests=server.effective_max_running_requests(info),
                      server_version=(info or {}).get("version"),
                      dynamic_policy=mode_counters.policy_settings(mode_counters.find_mode_counters(info)))
        logger.info("[%s] healthy after %.0f s, effective max running requests %s",
                    config, record["startup_s"], record["max_running_requests"])
        if plan.probe_requests > 0:
            record["ttft_probe"] = ttft_probe.run_probe(
                plan.setup.host, plan.setup.port, plan.bench_settings.input_len,
                plan.bench_settings.output_len, plan.probe_requests,
                plan.bench_settings.seed, plan.bench_timeout_s)
            probe = record["ttft_probe"]
            logger.info("[%s] TTFT probe (ms): cold token %s; warm median token %s, text %s, E2E %s",
                        config, *(None if v is None else round(v, 1) for v in (
                            probe["cold_token_ttft_ms"], probe["warm_median_token_ttft_ms"],
                            probe["warm_median_text_ttft_ms"], probe["warm_median_e2e_ms"])))
        bench_all_concurrencies(plan, running, document, out_dir, scratch, deadline)
        if not server.server_is_running(running):
            raise server.ServerError(
                f"[{config}] server died while being benchmarked; last log lines:\n"
                f"{server.log_tail(log_path, ERROR_TAIL_LINES)}")
    except server.ServerError as error:
        record.update(status="failed" if record["status"] == results.RUN_OK else "failed_to_start",
                      error=str(error))
        logger.error("%s", error)
    except (OSError, RuntimeError, ValueError) as error:
        record.update(status="failed", error=f"{type(error).__name__}: {error}")
        logger.error("[%s] %s: %s", config, type(error).__name__, error)
    except SystemExit:
        record.update(status="failed", error=INTERRUPTED)
        record_missing_runs(plan, config, document, "failed", INTERRUPTED)
        raise
    finally:
        server.stop_server(running)
        logger.info("[%s] server stopped", config)
        tails[config] = server.log_tail(log_path, plan.log_tail_lines)


def record_missing_runs(plan: argparse.Namespace, config: str, document: dict, status: str,
                        error: str) -> None:
    done = {run["concurrency"] for run in document["runs"] if run["config"] == config}
    document["runs"] += [
        run_record(config, c, bench.prompts_for_concurrency(c, plan.waves, plan.min_prompts),
                   status, error)
        for c in plan.concurrencies if c not in done]


def build_plan(args: argparse.Namespace, out_dir: Path) -> argparse.Namespace:
    """`args` with the defaults of a full or a --quick sweep filled in, plus the server setup and
    the bench_serving settings; writes the adaptive config where `adaptive` runs without one."""
    plan = argparse.Namespace(**vars(args))
    for key, value in (QUICK_DEFAULTS if args.quick else FULL_DEFAULTS).items():
        setattr(plan, key, value if getattr(args, key) is None else getattr(args, key))
    plan.config_names = configs.parse_config_list(args.configs)
    plan.concurrencies = parse_int_list(plan.concurrencies)
    plan.warmup_output_len = warmup_output_len(args.warmup_output_len, plan.output_len)
    plan.server_env = configs.parse_env_assignments(args.server_env)
    plan.adaptive_config = configs.adaptive_config_path(args, plan.config_names, out_dir)
    plan.setup = configs.server_setup(args, plan.adaptive_config)
    plan.bench_settings = bench.BenchSettings(
        args.tokenizer or args.model_path, args.input_len, plan.output_len, args.seed,
        args.visible_special_tokens, tuple(shlex.split(args.bench_args)))
    return plan


def plan_settings(plan: argparse.Namespace) -> dict:
    settings = plan.bench_settings
    return {
        "configs": plan.config_names, "concurrencies": plan.concurrencies,
        "input_len": settings.input_len, "output_len": settings.output_len, "waves": plan.waves,
        "min_prompts": plan.min_prompts, "probe_requests": plan.probe_requests,
        "warmup_output_len": plan.warmup_output_len, "visible_special_tokens": settings.visible_special_tokens,
        "bench_extra_args": list(settings.extra_args), "server_env": plan.server_env,
    }


def write_server_logs(out_dir: Path, tails: dict[str, str]) -> None:
    text = "".join(f"===== {config}: last lines of the server log =====\n{tail}\n" for config, tail in tails.items())
    (out_dir / SERVER_LOGS_FILE).write_text(text)


def stop_on_sigterm(signum, frame) -> None:
    """An outer `timeout` sends SIGTERM: unwind, so that the server is stopped and the results,
    server logs and report of what finished are written."""
    raise SystemExit(128 + signum)


def command_run(args: argparse.Namespace) -> int:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + (args.time_budget_s if args.time_budget_s is not None else float("inf"))
    plan = build_plan(args, out_dir)
    document = results.new_results_document([sys.executable] + sys.argv, plan_settings(plan))
    logger.info("sweep: configs %s, concurrencies %s, output %d tokens, results in %s",
                ",".join(plan.config_names), plan.concurrencies, plan.bench_settings.output_len, out_dir)
    scratch = Path(tempfile.mkdtemp(prefix="sweep-"))
    tails: dict[str, str] = {}
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        for config in plan.config_names:
            sweep_config(plan, config, document, out_dir, scratch, deadline, tails)
            results.save_results(document, out_dir / RESULTS_FILE)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for config in plan.config_names:
            if config not in document["configs"]:
                document["configs"][config] = {**config_record(
                    plan, configs.server_command(config, plan.setup)), "error": INTERRUPTED}
        results.save_results(document, out_dir / RESULTS_FILE)
        write_server_logs(out_dir, tails)
        shutil.rmtree(scratch, ignore_errors=True)
        for path in write_report(document, out_dir):
            logger.info("wrote %s", path)
    all_ok = all(c["status"] == results.RUN_OK for c in document["configs"].values()) and all(
        r["status"] == results.RUN_OK for r in document["runs"])
    return 0 if all_ok else 1


def command_report(args: argparse.Namespace) -> int:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    document = results.merge_results([results.load_results(Path(p)) for p in args.inputs])
    results.save_results(document, out_dir / RESULTS_FILE)
    for path in [out_dir / RESULTS_FILE, *write_report(document, out_dir)]:
        logger.info("wrote %s", path)
    return 0


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `run` (benchmark/README.md explains each)."""
    def add(flag: str, help: str, **kwargs) -> None:
        parser.add_argument(flag, help=help, **kwargs)

    def quick_default(key: str) -> str:
        return f"(default {FULL_DEFAULTS[key]}, --quick {QUICK_DEFAULTS[key]})"

    configs.add_server_arguments(parser)
    add("--tokenizer", "tokenizer for bench_serving (default: --model-path)")
    add("--out", "output folder", required=True)
    add("--concurrencies", "comma-separated " + quick_default("concurrencies"))
    add("--input-len", "prompt tokens (default %(default)s)", type=int, default=512)
    add("--output-len", "output tokens " + quick_default("output_len"), type=int)
    add("--waves", "prompts per run = max(min-prompts, waves x concurrency) " + quick_default("waves"), type=int)
    add("--min-prompts", quick_default("min_prompts"), type=int)
    add("--warmup-output-len", "output tokens of the unrecorded warm-up wave (default: --output-len)", type=int)
    add("--probe-requests", "sequential TTFT probe requests per server, 0 = none " + quick_default("probe_requests"),
        type=int)
    add("--quick", "short smoke sweep; explicit flags still win", action="store_true")
    add("--visible-special-tokens", "bench requests with skip_special_tokens=False", action="store_true")
    add("--bench-args", "extra sglang.bench_serving flags for every run", default="")
    add("--seed", "bench_serving and probe seed (default %(default)s)", type=int, default=1)
    add("--bench-timeout-s", "per concurrency and run; a configuration's bench process is killed after "
        "twice this times the number of concurrencies (default %(default)s)", type=float, default=300.0)
    add("--time-budget-s", "no server is started and a bench process is killed after this many seconds; "
        "the report is written from what finished (default: no limit)", type=float)
    add("--min-config-window-s", "a configuration is skipped when less of the time budget is left: "
        "its start-up and warm-up come before its first measured run (default %(default)s)",
        type=float, default=150.0)
    add("--log-tail-lines", f"server log lines kept per configuration in {SERVER_LOGS_FILE} (default %(default)s)",
        type=int, default=200)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True)
    add_run_arguments(subparsers.add_parser("run", help="serve and benchmark the configurations"))
    report = subparsers.add_parser("report", help="merge result files and write the report and plots")
    report.add_argument("--inputs", nargs="+", required=True, help="results.json files of earlier runs")
    report.add_argument("--out", required=True, help="output folder")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args = build_parser().parse_args(argv)
    return command_run(args) if args.command == "run" else command_report(args)


if __name__ == "__main__":
    sys.exit(main())
