#!/usr/bin/env python3
"""The serving benchmark: plain, EAGLE3, adaptive EAGLE3 and EAGLE3_DYNAMIC on named workloads (`run`: serve, drive
with sglang.bench_serving, write results.json and report.md; `report`: report saved results). See benchmark/README.md."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import re
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

from sweeplib import bench, configs, report, results, server, workloads

logger = logging.getLogger("benchmark")

RESULTS_FILE, SERVER_LOGS_FILE, DRIVER_LOG_FILE = "results.json", "server_logs_tail.txt", "bench_driver_tail.txt"
TRACE_ENV = "SGLANG_DYNAMIC_EAGLE_TRACE"
SIMULATE_ENV = "SGLANG_SIMULATE_ACC_LEN"  # sglang's simulated acceptance (speed benchmarks with dummy weights)
MIX_FILE_ENV = "SGLANG_DE_TEST_ACCEPTANCE_MIX_FILE"  # test plugin (test/gpu/native_ops_plugin): per-request mixtures
MIX_FILE = "acceptance_mix.txt"
SHARED_GPU_MAX_TOTAL_TOKENS = 120_000  # held by three 8B-shaped servers on one H200 (shared/gpu/README.md)
MIN_GROUP_WINDOW_S = 120.0  # no server group is started with less of the time budget left
ERROR_TAIL_LINES = 30
KV_TOKENS = re.compile(re.escape(server.KV_ALLOCATED) + r".*?#tokens: (\d+)")
SKIPPED = "time budget spent"
SETTINGS = ("configs", "schedule", "rounds", "warmup", "goodput_tpot_ms", "visible_special_tokens", "server_env",
            "max_total_tokens", "seed", "bench_args", "time_budget_s", "acceptance")


def run_order(names: tuple[str, ...], workload_index: int, round_index: int) -> list[str]:
    """One round of a workload's servers: rotated per workload, reversed every other round (A B, then B A): none always first."""
    shift = workload_index % len(names)
    order = list(names[shift:] + names[:shift])
    return order[::-1] if round_index % 2 else order


def group_commands(plan: argparse.Namespace, group: tuple[str, ...]) -> list[tuple[str, int, list[str], dict]]:
    """(config, port, command, environment) of every server of a group: one command line for all
    but the speculative flags, the next port each; up at once, each gets the same KV cap and a
    static memory fraction by start order; with --trace, EAGLE3_DYNAMIC servers write a decode-step trace."""
    result = []
    for index, name in enumerate(group):
        port = plan.port + plan.names.index(name)
        memory = configs.memory_flags(index, len(group), plan.max_total_tokens or SHARED_GPU_MAX_TOTAL_TOKENS) if len(
            group) > 1 else ("--max-total-tokens", str(plan.max_total_tokens)) if plan.max_total_tokens else ()
        setup = dataclasses.replace(plan.setup, port=port, common_args=configs.set_flags(plan.setup.common_args, memory))
        trace = {TRACE_ENV: str(plan.out_dir / f"{name}_trace.jsonl")} if name in configs.DYNAMIC_CONFIGS and plan.trace else {}
        result.append((name, port, configs.server_command(name, setup), {**plan.server_env, **trace}))
    return result


def config_record(command: list[str], env: dict, error: str | None = None) -> dict:
    return {"status": "skipped", "error": error, "server_command": [results.shown_paths(p) for p in command],
            "server_env": env, "startup_s": None, "max_running_requests": None, "kv_tokens": None}


class PluginMissing(server.ServerError): """The servers lack the plugin that --acceptance and ~MIX need."""


def start_group(plan: argparse.Namespace, group: tuple[str, ...], document: dict, served: dict[str, server.RunningServer]) -> None:
    """Start the servers one after the other, the next once the one before has allocated its KV
    pools, then wait until all are healthy; each goes into ``served`` as it is launched, so that the
    caller stops it whatever happens. One that does not start is recorded (failed_to_start) and
    stopped, the others go on; raises when none started or the run's acceptance plugin is missing."""
    launched, record = {}, document["configs"]

    def failed(name: str, error: server.ServerError) -> None:  # recorded and stopped (no GPU memory held)
        if group[1:] and re.search(r"OutOfMemory|CUDA.{,8}out of memory|(of|no) GPU memory|Not enough memory", str(error)):
            error = type(error)(f"{error}\n[{name}] out of GPU memory beside other servers: try --schedule sequential")
        record[name].update(status="failed_to_start", error=str(error))
        if name in served:
            server.stop_server(served[name])
        if isinstance(error, PluginMissing):
            raise error
        logger.error("%s", error)

    for index, (name, port, command, env) in enumerate(group_commands(plan, group)):
        record[name], launched[name] = config_record(command, env), time.monotonic()
        logger.info("[%s] starting: %s", name, shlex.join(command))
        try:
            served[name] = server.start_server(name, command, env, plan.scratch / f"{name}.log",
                                               server.base_url_of(plan.host, port))
            if index < len(group) - 1:
                server.wait_until_kv_allocated(served[name], 1 if name == configs.PLAIN else 2, plan.server_timeout_s,
                                               ERROR_TAIL_LINES)
        except server.ServerError as error:
            failed(name, error)
    for name in (n for n in group if record[n]["status"] != "failed_to_start"):
        try:
            server.wait_until_healthy(served[name], plan.server_timeout_s - (time.monotonic() - launched[name]),
                                      ERROR_TAIL_LINES)
            info, log = server.fetch_server_info(served[name].base_url), served[name].log_path.read_text(errors="replace")
            if plan.acceptance_file and "simulated acceptance differs by request" not in log:
                raise PluginMissing(f"[{name}] the acceptance test plugin did not load: pip install -e "
                                    "test/gpu/native_ops_plugin (--acceptance and ~MIX need it)")
        except server.ServerError as error:
            failed(name, error)
            continue
        kv = KV_TOKENS.search(log)
        record[name].update(
            status=results.RUN_OK, startup_s=time.monotonic() - launched[name], kv_tokens=kv and int(kv.group(1)),
            max_running_requests=server.effective_max_running_requests(info),
            dynamic_policy=results.policy_settings(results.find_mode_counters(info)))
        logger.info("[%s] healthy, KV pool of %s tokens", name, record[name]["kv_tokens"])
    if not any(record[name]["status"] == results.RUN_OK for name in group):
        raise server.ServerError(f"no server of {', '.join(group)} started")


def set_acceptance(plan: argparse.Namespace, workload: workloads.Workload | None) -> str | None:
    """Write the next run's simulated acceptance (``~MIX``, else ``--acceptance``) where the test plugin reads it."""
    mixture = plan.acceptance_file and ((workload and workload.acceptance) or plan.acceptance)
    if mixture:
        results.write_atomically(plan.acceptance_file, mixture + "\n")
    return mixture or None


def run_workload(plan: argparse.Namespace, client: bench.BenchClient, running: server.RunningServer,
                 workload: workloads.Workload, index: int, round_index: int, deadline: float) -> dict:
    """Every segment of a workload against one server: the run record (metrics over all requests;
    EAGLE3_DYNAMIC's counters from after bench_serving's first warm-up request to the end)."""
    record = {"config": running.config, "workload": workload.name, "round": round_index, "status": results.RUN_OK,
              "error": None, "started_at": time.time(), "metrics": {}, "segments": [], "mode_counters": None,
              "acceptance": set_acceptance(plan, workload)}
    before = None
    for number, segment in enumerate(workload.segments):
        if segment.prompts:
            output_file = plan.scratch / f"{running.config}_{results.file_safe(workload.name)}_{round_index}_{number}.jsonl"
            timeout_s = min(plan.bench_timeout_s, deadline - time.monotonic())
            reply = {"ok": False, "error": SKIPPED} if timeout_s <= 0 else client.run(
                bench.segment_flags(segment, plan.tokenizer, plan.host, plan.port + plan.names.index(running.config),
                                    plan.seed + 1000 * round_index + 100 * index + number, str(output_file),
                                    plan.bench_args),
                plan.visible_special_tokens, timeout_s, lambda: server.server_is_running(running))
            before = before or results.find_mode_counters(reply.get("after_warmup"), complete=False)
            line = bench.last_line(output_file) if reply["ok"] else None
            if line is None:
                budget = timeout_s < plan.bench_timeout_s and reply["error"] in ("timeout", SKIPPED)
                record.update(status="skipped" if budget else "failed",
                              error=SKIPPED if budget else reply["error"] or "no result line")
                break
            record["segments"].append({"bench": bench.raw_row(line), "requests": bench.request_stats(line)})
        time.sleep(max(0.0, min(segment.idle_s, deadline - time.monotonic())))
    after = results.find_mode_counters(server.fetch_server_info(running.base_url), complete=False)
    if before or after:
        record["mode_counters"] = {"before": before, "after": after, "delta": results.counter_delta(before, after)}
    record.update(ended_at=time.time(), wall_s=time.time() - record["started_at"])
    if record["segments"]:
        metrics = record["metrics"] = bench.workload_metrics(record["segments"], plan.goodput_tpot_ms)
        if metrics["completed"] < metrics["requests"] and record["status"] == results.RUN_OK:
            record.update(status="incomplete", error=f"{metrics['completed']} of {metrics['requests']} completed")
    return record


def benchmark_group(plan: argparse.Namespace, group: tuple[str, ...], served: dict[str, server.RunningServer],
                    document: dict, client: bench.BenchClient, deadline: float) -> None:
    """Warm each server up (as round --rounds: own seed; under "warmups"), then each round of every workload."""
    for running, warm_up in ((r, w) for r in served.values() for w in plan.warmups if server.server_is_running(r)):
        record = run_workload(plan, client, running, warm_up, 0, plan.rounds, deadline)
        document.setdefault("warmups", []).append({k: record[k] for k in ("config", "workload", "status", "error")})
    for round_index in range(plan.rounds):
        for index, workload in enumerate(plan.workloads):
            for name in run_order(group, index, round_index):
                problem = SKIPPED if deadline - time.monotonic() < workload.expected_s() else (
                    None if name in served and server.server_is_running(served[name]) else "server not running")
                if problem:
                    record = {"config": name, "workload": workload.name, "round": round_index, "error": problem,
                              "status": "skipped" if problem == SKIPPED else "failed", "metrics": {}, "segments": []}
                else:
                    record = run_workload(plan, client, served[name], workload, index, round_index, deadline)
                document["runs"].append(record)
                results.save_results(document, plan.out_dir / RESULTS_FILE)
                m = record["metrics"]
                logger.info("[%s] %s: %s%s", name, workload.name, record["status"], (
                    f", {m['request_throughput']:.2f} req/s, {m['output_throughput']:.0f} tok/s, TTFT p50 "
                    f"{m['median_ttft_ms']:.0f} ms, goodput {m['goodput']:.2f} req/s") if m.get("completed") else "")


def command_run(args: argparse.Namespace) -> int:
    plan = build_plan(args)
    deadline = time.monotonic() + (args.time_budget_s if args.time_budget_s is not None else math.inf)
    settings = {key: getattr(plan, key) for key in SETTINGS}
    settings["workloads"] = [{"name": w.name, "segments": [{**dataclasses.asdict(s), "rate": s.rate if math.isfinite(
        s.rate) else None} for s in w.segments]} for w in plan.workloads]
    document = results.new_results_document([sys.executable, os.path.relpath(__file__), *args.argv], settings,
                                            args.git_commit)
    tails: dict[str, str] = {}
    # An outer `timeout` sends SIGTERM: unwind, so that the servers are stopped and what finished is written.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with tempfile.TemporaryDirectory(prefix="benchmark-") as scratch:
        plan.scratch = Path(scratch)
        client = bench.BenchClient(plan.scratch / "bench_driver.log")
        try:
            groups = [(name,) for name in plan.names] if plan.schedule == "sequential" else [plan.names]
            for number, group in enumerate(groups):  # each an equal share of the budget left (README)
                if deadline - time.monotonic() < MIN_GROUP_WINDOW_S:
                    document["configs"].update({name: config_record(command, env, SKIPPED)
                                                for name, _, command, env in group_commands(plan, group)})
                    continue
                served: dict[str, server.RunningServer] = {}
                try:
                    start_group(plan, group, document, served)
                    share = (deadline - time.monotonic()) / (len(groups) - number)  # of what is left, for this group
                    benchmark_group(plan, group, served, document, client, time.monotonic() + share)
                except server.ServerError as error:
                    logger.error("%s", error)
                finally:
                    for name, running in served.items():
                        server.stop_server(running)
                        tails[name] = server.log_tail(running.log_path, args.log_tail_lines)
                        if name in configs.DYNAMIC_CONFIGS and plan.trace:
                            results.split_trace(plan.out_dir / f"{name}_trace.jsonl", [
                                r for r in document["runs"] if r["config"] == name], plan.out_dir, f"trace_{name}_")
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            client.close()
            (plan.out_dir / DRIVER_LOG_FILE).write_text(server.log_tail(client.log_path, args.log_tail_lines))
            (plan.out_dir / SERVER_LOGS_FILE).write_text("".join(
                f"===== {name}: last lines of the server log =====\n{tail}\n" for name, tail in tails.items()))
            (plan.out_dir / report.REPORT_FILE).write_text(report.render_markdown(document))
            results.save_results(document, plan.out_dir / RESULTS_FILE)
            logger.info("wrote %s and %s", plan.out_dir / RESULTS_FILE, plan.out_dir / report.REPORT_FILE)
    return 0 if all(r["status"] == results.RUN_OK for r in [*document["configs"].values(), *document["runs"]]) else 1


def command_report(args: argparse.Namespace) -> int:
    """The report of each input in turn (several: one after the other, in one file)."""
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / args.name).write_text("\n---\n\n".join(
        report.render_markdown(results.load_results(Path(path)), args.goodput_tpot_ms) for path in args.inputs))
    return 0


def build_plan(args: argparse.Namespace) -> argparse.Namespace:
    """The arguments, checked, with the workloads, server setup and environment resolved."""
    plan = argparse.Namespace(**vars(args))
    plan.names = tuple(configs.parse_config_list(args.configs))
    options = workloads.Options(args.traffic_s, args.idle_s, args.waves, args.min_prompts)
    plan.workloads = workloads.parse_workloads(args.workload or ["closed-1,closed-4,closed-16,closed-64"], options)
    if len({results.file_safe(w.name) for w in plan.workloads}) < len(plan.workloads):
        raise ValueError("two workload names differ only in characters a file name cannot hold (e.g. @ and ~)")
    plan.warmups = [] if args.warmup == "none" else workloads.parse_workloads([args.warmup], options)
    if args.schedule == "paired" and len(plan.names) != 2:
        raise SystemExit("--schedule paired takes two --configs")
    plan.out_dir = Path(args.out).resolve()
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    plan.server_env = configs.parse_env_assignments(args.server_env)
    plan.acceptance_file = None
    if args.acceptance or any(w.acceptance for w in plan.workloads + plan.warmups):  # the plugin reads a file
        default = args.acceptance or plan.server_env.get(SIMULATE_ENV)
        if default is None:
            raise ValueError(f"a workload with ~MIX needs --acceptance MIX or --server-env {SIMULATE_ENV}=X")
        plan.acceptance = workloads.acceptance_mixture(default.replace(",", "/"), "--acceptance" if args.acceptance
                                                       else f"--server-env {SIMULATE_ENV}")
        plan.acceptance_file = plan.out_dir / MIX_FILE
        plan.server_env = {SIMULATE_ENV: "1", **plan.server_env, MIX_FILE_ENV: str(plan.acceptance_file)}
        set_acceptance(plan, None)
    plan.setup = configs.server_setup(args, plan.out_dir)
    plan.tokenizer = args.tokenizer or args.model_path
    plan.bench_args = tuple(shlex.split(args.bench_args))
    return plan


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="serve the configurations and benchmark them")
    configs.add_server_arguments(run)
    run.set_defaults(configs="plain,eagle3,dynamic", server_timeout_s=600.0)
    for flag, kwargs in (
        ("--out", dict(required=True, help="output folder")),
        ("--tokenizer", dict(help="bench_serving's tokenizer (default: --model-path)")),
        ("--workload", dict(action="append", default=[], help="comma-separated names, repeatable (README)")),
        ("--schedule", dict(choices=("interleaved", "sequential", "paired"), default="interleaved")),
        ("--rounds", dict(type=int, default=1, help="runs (pairs) of each workload per configuration")),
        ("--warmup", dict(default="warmup", help="unrecorded workload(s) every server runs first, or none")),
        ("--traffic-s", dict(type=float, default=workloads.Options.traffic_s, help="seconds of arrivals of poisson-R (default %(default)s)")),
        ("--idle-s", dict(type=float, default=workloads.Options.idle_s, help="idle gaps of burst and load-step (default %(default)s)")),
        ("--goodput-tpot-ms", dict(type=float, default=50.0, help="goodput: requests with TPOT at most this")),
        ("--max-total-tokens", dict(type=int, help=f"KV cap (default {SHARED_GPU_MAX_TOTAL_TOKENS} when shared)")),
        ("--visible-special-tokens", dict(action="store_true", help="requests with skip_special_tokens=False")),
        ("--acceptance", dict(help="simulated acceptance MIX of workloads without ~MIX (needs the test plugin; README)")),
        ("--bench-args", dict(default="", help="extra sglang.bench_serving flags for every run")),
        ("--seed", dict(type=int, default=1)), ("--waves", dict(type=int, default=workloads.Options.waves)),
        ("--min-prompts", dict(type=int, default=workloads.Options.min_prompts, help="closed-C: max(this, --waves x C) prompts")),
        ("--trace", dict(action="store_true", help="EAGLE3_DYNAMIC servers write a decode-step trace (off: as served)")),
        ("--bench-timeout-s", dict(type=float, default=300.0, help="longest bench_serving run (default 300)")),
        ("--time-budget-s", dict(type=float, help="deadline of the whole run (README)")),
        ("--git-commit", dict(help="commit to record (default: git describe of this checkout)")),
        ("--log-tail-lines", dict(type=int, default=200, help="server log lines kept per configuration")),
    ):
        run.add_argument(flag, **kwargs)
    again = commands.add_parser("report", help="write the report of saved results again (no servers)")
    again.add_argument("--inputs", nargs="+", required=True, help="results.json files (also .json.xz)")
    again.add_argument("--out", required=True, help="output folder")
    again.add_argument("--name", default=report.REPORT_FILE, help="report file name (default %(default)s)")
    again.add_argument("--goodput-tpot-ms", type=float, help="recompute goodput with this TPOT target")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    try:
        return command_run(args) if args.command == "run" else command_report(args)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    sys.exit(main())
