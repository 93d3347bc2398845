"""The benchmark's one entry point (benchmark/run.py), end to end against stand-in servers and a
stand-in bench driver (test/fakes/), and its parts: schedules, server commands, trace splitting."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

import run  # noqa: E402
from sweeplib import bench, report, results, server, workloads  # noqa: E402
from benchmark_helpers import FAKES, flag_values, free_port  # noqa: E402


@pytest.fixture
def fakes(monkeypatch, tmp_path):
    """Servers are test/fakes/fake_sglang_server.py with the server's own flags; the bench driver
    is test/fakes/fake_bench_driver.py, logging every run it is asked for."""
    real_start = server.start_server

    def start_fake(config, command, env, log_path, base_url):
        flags = command[command.index("sglang.launch_server") + 1:]
        return real_start(config, [sys.executable, str(FAKES / "fake_sglang_server.py"), *flags], env, log_path,
                          base_url)

    monkeypatch.setattr(server, "start_server", start_fake)
    monkeypatch.setattr(server, "HEALTH_POLL_S", 0.05)
    monkeypatch.setattr(bench, "DRIVER_PATH", FAKES / "fake_bench_driver.py")
    monkeypatch.setenv("FAKE_DRIVER_LOG", str(tmp_path / "driver_requests.jsonl"))
    monkeypatch.setenv("FAKE_SERVER_DIR", str(tmp_path))
    return tmp_path


def main(out: Path, *flags: str) -> int:
    return run.main(["run", "--model-path", "m", "--draft-model-path", "d", "--load-format", "dummy",
                     "--port", str(free_port()), "--out", str(out), *flags])


def driver_requests(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "driver_requests.jsonl").read_text().splitlines()]


def test_interleaved_end_to_end(fakes):
    out = fakes / "out"
    assert main(out, "--workload", "closed-2,poisson-5", "--traffic-s", "1", "--visible-special-tokens",
                "--server-env", "SGLANG_SIMULATE_ACC_LEN=3.0", "--git-commit", "abc", "--trace") == 0
    document = json.loads((out / "results.json").read_text(), parse_constant=pytest.fail)  # strict JSON: no inf
    source = document["sources"][0]
    assert source["git_commit"] == "abc" and "run.py run" in source["command_line"] and source["created"]
    names = ["plain", "eagle3", "dynamic"]
    commands = {name: flag_values(document["configs"][name]["server_command"]) for name in names}
    assert [commands[n]["--mem-fraction-static"] for n in names] == [("0.28",), ("0.57",), ("0.85",)]
    assert all(document["configs"][n]["kv_tokens"] == run.SHARED_GPU_MAX_TOTAL_TOKENS for n in names)
    envs = {name: document["configs"][name]["server_env"] for name in names}
    assert envs["dynamic"][run.TRACE_ENV] == str(out.resolve() / "dynamic_trace.jsonl")
    assert all(run.TRACE_ENV not in envs[n] and envs[n]["SGLANG_SIMULATE_ACC_LEN"] == "3.0" for n in names[:2])
    # Each next server started once the one before had logged its KV cache allocation.
    logs = (out / run.SERVER_LOGS_FILE).read_text()
    started = [float(t) for t in re.findall(r"started at ([\d.]+)", logs)]
    allocated = [float(t) for t in re.findall(r"\(at ([\d.]+)\)", logs)]
    assert len(started) == 3 and started[1] >= allocated[0] and started[2] >= allocated[2]  # plain: 1, eagle3: 2
    # Every server warmed up first (unrecorded), then each workload against each server, rotating.
    requests = driver_requests(fakes)
    assert [flag_values(["x", *r["flags"]])["--num-prompts"] for r in requests[:3]] == [("32",)] * 3
    assert all(r["visible_special_tokens"] for r in requests)
    assert [(r["workload"], r["config"]) for r in document["runs"]] == [
        ("closed-2", "plain"), ("closed-2", "eagle3"), ("closed-2", "dynamic"),
        ("poisson-5", "eagle3"), ("poisson-5", "dynamic"), ("poisson-5", "plain")]
    seeds = {(r["flags"][r["flags"].index("--port") + 1], r["flags"][r["flags"].index("--seed") + 1])
             for r in requests[3:]}
    assert len({seed for _, seed in seeds}) == 2  # one seed per workload, the same for every server
    for record in document["runs"]:
        assert record["status"] == "ok" and record["metrics"]["completed"] == record["metrics"]["requests"]
        assert record["segments"][0]["bench"]["duration"] == 2.0 and "ttfts" not in record["segments"][0]["bench"]
    dynamic = [r for r in document["runs"] if r["config"] == "dynamic"]
    for record in dynamic:
        delta = record["mode_counters"]["delta"]
        assert delta["speculative_steps"] == 3 and delta["policy_probes"] == 1  # one request per fake run
        trace = [json.loads(line) for line in (out / record["trace"]["file"]).read_text().splitlines()]
        assert record["trace"]["file"] == f"trace_dynamic_{record['workload']}.jsonl"
        assert [line["k"] for line in trace] == ["step", "time"]
        assert record["started_at"] <= trace[0]["t"] <= record["ended_at"]
    assert all("trace" not in r and r["mode_counters"] is None for r in document["runs"] if r["config"] != "dynamic")
    assert sum(1 for _ in open(out / "dynamic_trace.jsonl")) == 6  # the warm-up's two lines are in no workload
    text = (out / "report.md").read_text()
    assert "## EAGLE3_DYNAMIC / best of plain and EAGLE3" in text and "| dynamic | goodput |" in text
    assert "`poisson-5`: 8 prompts of input 1024 / output 512 tokens x [0.25, 1], 5 req/s" in text
    assert run.main(["report", "--inputs", str(out / "results.json"), "--out", str(fakes / "again")]) == 0
    assert (fakes / "again" / "report.md").read_text() == text


def test_a_workloads_acceptance_is_what_the_servers_read_during_its_runs(fakes, monkeypatch):
    out = fakes / "out"
    monkeypatch.setenv("FAKE_MIX_FILE", str(out / run.MIX_FILE))
    assert main(out, "--workload", "closed-2,closed-2~1.3:0.5/4.0:0.5,closed-4~1.6", "--configs", "plain,dynamic",
                "--server-env", "SGLANG_SIMULATE_ACC_LEN=3.0") == 0, [(c, v["status"], v["error"]) for c, v in json.loads((out / "results.json").read_text())["configs"].items()] + [(r["workload"], r["status"], r["error"]) for r in json.loads((out / "results.json").read_text())["runs"]]
    document = json.loads((out / "results.json").read_text())
    env = document["configs"]["dynamic"]["server_env"]
    assert env[run.MIX_FILE_ENV] == str(out.resolve() / run.MIX_FILE) and env["SGLANG_SIMULATE_ACC_LEN"] == "3.0"
    seen = [(r["flags"][r["flags"].index("--num-prompts") + 1], r["mix"]) for r in driver_requests(fakes)]
    assert seen == [("32", "3.0")] * 2 + [("16", "3.0")] * 2 + [("16", "1.3:0.5,4.0:0.5")] * 2 + [("16", "1.6")] * 2
    assert [(r["workload"], r["acceptance"]) for r in document["runs"]][::2] == [
        ("closed-2", "3.0"), ("closed-2~1.3:0.5/4.0:0.5", "1.3:0.5,4.0:0.5"), ("closed-4~1.6", "1.6")]
    with pytest.raises(SystemExit, match="needs --acceptance MIX or --server-env"):
        main(fakes / "other", "--workload", "closed-2~1.6")
    with pytest.raises(SystemExit, match="^error: --server-env SGLANG_SIMULATE_ACC_LEN: acceptance '0.5'"):
        main(fakes / "other", "--workload", "closed-2~1.6", "--server-env", "SGLANG_SIMULATE_ACC_LEN=0.5")
    with pytest.raises(SystemExit, match="differ only in characters"):
        main(fakes / "other", "--workload", "poisson-6@15,poisson-6~15")


def test_without_the_acceptance_plugin_on_the_servers_nothing_runs(fakes, monkeypatch):
    """A server without the test plugin would run every request at sglang's simulated length."""
    monkeypatch.setenv("FAKE_WITHOUT_MIX_PLUGIN", "1")
    out = fakes / "out"
    assert main(out, "--workload", "closed-2~1.6", "--configs", "plain", "--acceptance", "3.0") == 1
    document = json.loads((out / "results.json").read_text())
    assert "acceptance test plugin did not load" in document["configs"]["plain"]["error"]
    assert not [r for r in document["runs"] if r.get("segments")]


def test_a_warm_up_may_carry_its_own_acceptance(fakes):
    out = fakes / "out"
    assert main(out, "--workload", "closed-2", "--warmup", "warmup~1.6", "--configs", "plain",
                "--server-env", "SGLANG_SIMULATE_ACC_LEN=3.0") == 0
    assert json.loads((out / "results.json").read_text())["runs"][0]["acceptance"] == "3.0"


def test_every_server_is_warmed_up_with_a_seed_bench_serving_takes_and_the_outcome_is_kept(fakes):
    """bench_serving seeds numpy with --seed (0 to 2**32 - 1); the stand-in driver refuses others as it does."""
    out = fakes / "out"
    assert main(out, "--workload", "closed-2,poisson-5", "--traffic-s", "1", "--configs", "plain,dynamic",
                "--rounds", "2") == 0
    document = json.loads((out / "results.json").read_text())
    assert [(w["config"], w["workload"], w["status"]) for w in document["warmups"]] == [
        ("plain", "warmup", "ok"), ("dynamic", "warmup", "ok")]
    seeds = [int(flag_values(["x", *r["flags"]])["--seed"][0]) for r in driver_requests(fakes)]
    assert all(0 <= seed < 2**32 for seed in seeds)
    warm_up_seeds, measured_seeds = set(seeds[:2]), set(seeds[2:])
    assert len(warm_up_seeds) == 1 and not warm_up_seeds & measured_seeds
    assert len(measured_seeds) == 4  # both servers of a round get the same prompts; workloads and rounds differ


def test_sequential_serves_one_configuration_at_a_time_with_its_own_memory_flags(fakes):
    out = fakes / "out"
    assert main(out, "--configs", "plain,dynamic", "--schedule", "sequential", "--workload", "closed-2,closed-4",
                "--warmup", "none") == 0
    document = json.loads((out / "results.json").read_text())
    assert [(r["config"], r["workload"]) for r in document["runs"]] == [
        ("plain", "closed-2"), ("plain", "closed-4"), ("dynamic", "closed-2"), ("dynamic", "closed-4")]
    for name in ("plain", "dynamic"):
        flags = flag_values(document["configs"][name]["server_command"])
        assert flags["--mem-fraction-static"] == ("0.80",) and "--max-total-tokens" not in flags
    assert len(driver_requests(fakes)) == 4  # no warm-up
    # Without --trace, as served: no trace written, none split, the report says so.
    assert run.TRACE_ENV not in document["configs"]["dynamic"]["server_env"]
    assert not list(out.glob("*trace*")) and all("trace" not in r for r in document["runs"])
    assert "None." in (out / "report.md").read_text().split("## Decode-step traces")[1].split("\n## ")[0]


def test_a_spent_time_budget_skips_what_would_not_end_in_time(fakes, monkeypatch):
    out = fakes / "out"
    assert main(out, "--workload", "closed-2", "--time-budget-s", "0") == 1
    document = json.loads((out / "results.json").read_text())
    assert {c["status"] for c in document["configs"].values()} == {"skipped"} and document["runs"] == []
    assert "time budget spent" in (out / "report.md").read_text()
    # Started, but no workload fits what is left: each is recorded as skipped, none is sent.
    monkeypatch.setattr(run, "MIN_GROUP_WINDOW_S", 0.0)
    assert main(out, "--configs", "plain", "--workload", "poisson-5,closed-2", "--warmup", "none",
                "--time-budget-s", "5") == 1
    document = json.loads((out / "results.json").read_text())
    assert document["configs"]["plain"]["status"] == "ok"
    assert [(r["workload"], r["status"], r["error"]) for r in document["runs"]] == [
        ("poisson-5", "skipped", "time budget spent"), ("closed-2", "skipped", "time budget spent")]


def test_rounds_are_outermost_so_a_spent_budget_drops_later_rounds_not_whole_workloads(fakes):
    out = fakes / "out"
    assert main(out, "--configs", "plain", "--workload", "closed-1,closed-2", "--rounds", "2", "--warmup", "none") == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [(r["workload"], r["round"]) for r in runs] == [
        ("closed-1", 0), ("closed-2", 0), ("closed-1", 1), ("closed-2", 1)]


@pytest.mark.parametrize("shared", [True, False], ids=["equal shares", "negative control: one deadline"])
def test_one_server_at_a_time_splits_the_budget_so_a_short_one_drops_rounds_not_servers(fakes, monkeypatch, shared):
    """Sequential schedule, two servers, two rounds of runs of 100 s on a clock only the runs move, a
    250 s budget: each server takes an equal share of what is left when it starts (plain 125 s: one
    round; then EAGLE3_DYNAMIC 150 s: one round). With the whole budget as every server's deadline
    (the negative control) plain runs both rounds and EAGLE3_DYNAMIC none: no comparison at all."""
    clock = [0.0]

    def fake_run(plan, client, running, workload, index, round_index, deadline):
        ok = clock[0] + 100.0 <= deadline
        clock[0] += 100.0 if ok else 0.0
        return {"config": running.config, "workload": workload.name, "round": round_index, "metrics": {},
                "status": "ok" if ok else "skipped", "error": None if ok else run.SKIPPED, "segments": []}

    def one_deadline(plan, group, served, document, client, deadline):
        return real_group(plan, group, served, document, client, 250.0)

    monkeypatch.setattr(run, "time", argparse.Namespace(monotonic=lambda: clock[0], time=lambda: 0.0,
                                                        sleep=lambda s: None))
    monkeypatch.setattr(run, "run_workload", fake_run)
    monkeypatch.setattr(run, "MIN_GROUP_WINDOW_S", 0.0)
    real_group = run.benchmark_group
    if not shared:
        monkeypatch.setattr(run, "benchmark_group", one_deadline)
    out = fakes / "out"
    main(out, "--configs", "plain,dynamic", "--schedule", "sequential", "--workload", "closed-2", "--rounds", "2",
         "--warmup", "none", "--time-budget-s", "250")
    runs = json.loads((out / "results.json").read_text())["runs"]
    done = [(r["config"], r["round"]) for r in runs if r["status"] == "ok"]
    assert (done == [("plain", 0), ("dynamic", 0)]) is shared
    assert shared or done == [("plain", 0), ("plain", 1)]


def test_a_run_still_going_at_the_end_of_the_budget_is_stopped_and_skipped(fakes, monkeypatch):
    monkeypatch.setattr(run, "MIN_GROUP_WINDOW_S", 0.0)
    monkeypatch.setattr(workloads, "SEGMENT_OVERHEAD_S", 0.0)
    monkeypatch.setenv("FAKE_DRIVER_SLEEP_S", "30")
    out = fakes / "out"
    assert main(out, "--configs", "plain", "--workload", "closed-2", "--warmup", "none", "--time-budget-s", "4") == 1
    (record,) = json.loads((out / "results.json").read_text())["runs"]
    assert (record["status"], record["error"], record["segments"]) == ("skipped", "time budget spent", [])


def test_a_server_that_died_gets_no_more_runs_and_the_others_go_on(fakes, monkeypatch):
    monkeypatch.setattr(server, "server_is_running", lambda running: running.config != "eagle3")
    out = fakes / "out"
    assert main(out, "--workload", "closed-2,closed-4", "--warmup", "none") == 1
    document = json.loads((out / "results.json").read_text())
    statuses = {(r["config"], r["workload"]): (r["status"], r["error"]) for r in document["runs"]}
    assert statuses[("eagle3", "closed-2")] == statuses[("eagle3", "closed-4")] == ("failed", "server not running")
    assert {statuses[(c, w)][0] for c in ("plain", "dynamic") for w in ("closed-2", "closed-4")} == {"ok"}
    assert len(driver_requests(fakes)) == 4
    assert "- run `eagle3` closed-2: failed: server not running" in (out / "report.md").read_text()


def test_a_server_that_does_not_start_is_recorded_and_the_others_run(fakes, monkeypatch):
    port = free_port()
    monkeypatch.setenv("FAKE_CRASH_PORT", str(port + 1))  # the second server (eagle3) exits at start
    out = fakes / "out"
    assert run.main(["run", "--model-path", "m", "--draft-model-path", "d", "--port", str(port), "--out", str(out),
                     "--workload", "closed-2", "--server-timeout-s", "20"]) == 1
    document = json.loads((out / "results.json").read_text())
    assert document["configs"]["eagle3"]["status"] == "failed_to_start"
    assert "crashed while capturing" in document["configs"]["eagle3"]["error"]
    assert "--schedule sequential" not in document["configs"]["eagle3"]["error"]  # not a memory error
    assert {c: document["configs"][c]["status"] for c in ("plain", "dynamic")} == {"plain": "ok", "dynamic": "ok"}
    statuses = {r["config"]: r["status"] for r in document["runs"]}
    assert statuses == {"plain": "ok", "eagle3": "failed", "dynamic": "ok"}


TORCH_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB."
PLUGIN_OOM = "StartupError: EAGLE3_DYNAMIC: out of GPU memory allocating the draft catch-up stash (1024 MiB) ..."
SGLANG_OOM = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
SGLANG_NO_POOL = ("ValueError: Loaded weights leave no GPU memory for the KV cache under "  # H100, 2026-12-07
                  "--mem-fraction-static=0.85. Raise --mem-fraction-static above 0.965")
POOL_FULL = "RuntimeError: Prefill out of memory. Try to lower your batch size."  # the KV pool, not the GPU


@pytest.mark.parametrize("configs, message, hint", [
    ("plain,eagle3,dynamic", TORCH_OOM, True), ("plain,eagle3,dynamic", PLUGIN_OOM, True),
    ("plain,eagle3,dynamic", SGLANG_OOM, True), ("plain,eagle3,dynamic", SGLANG_NO_POOL, True),
    ("plain,eagle3,dynamic", POOL_FULL, False), ("eagle3", TORCH_OOM, False)])
def test_a_server_out_of_gpu_memory_beside_others_is_told_to_run_alone(fakes, monkeypatch, configs, message, hint):
    """Three 8B-shaped servers do not fit an 80 GB GPU (H100, 2026-12-05): the one that runs out of
    GPU memory beside the others is recorded with the way out; a full KV pool or a server alone
    gets no such hint."""
    port = free_port()
    monkeypatch.setenv("FAKE_CRASH_PORT", str(port + configs.split(",").index("eagle3")))  # eagle3's port
    monkeypatch.setenv("FAKE_CRASH_MESSAGE", message)
    out = fakes / "out"
    run.main(["run", "--model-path", "m", "--draft-model-path", "d", "--port", str(port), "--out", str(out),
              "--configs", configs, "--workload", "closed-2", "--server-timeout-s", "20"])
    error = json.loads((out / "results.json").read_text())["configs"]["eagle3"]["error"]
    assert message in error and ("--schedule sequential" in error) is hint


def test_a_group_where_no_server_starts_runs_nothing(fakes, monkeypatch):
    port = free_port()
    monkeypatch.setenv("FAKE_CRASH_PORT", str(port))
    out = fakes / "out"
    assert run.main(["run", "--model-path", "m", "--port", str(port), "--out", str(out), "--configs", "plain",
                     "--workload", "closed-2", "--server-timeout-s", "20"]) == 1
    document = json.loads((out / "results.json").read_text())
    assert document["configs"]["plain"]["status"] == "failed_to_start" and document["runs"] == []


def test_paired_rounds_send_the_same_prompts_to_both_servers_in_turn_and_report_pair_ratios(fakes, monkeypatch):
    out, port = fakes / "out", free_port()
    monkeypatch.setenv("FAKE_SLOW_PORT", str(port + 1))  # dynamic's server: TTFT 20 ms against 10 ms
    assert run.main(["run", "--model-path", "m", "--draft-model-path", "d", "--port", str(port), "--out", str(out),
                     "--configs", "plain,dynamic", "--schedule", "paired", "--workload", "closed-2", "--rounds", "3",
                     "--warmup", "none"]) == 0
    document = json.loads((out / "results.json").read_text())
    assert [(r["config"], r["round"]) for r in document["runs"]] == [
        ("plain", 0), ("dynamic", 0), ("dynamic", 1), ("plain", 1), ("plain", 2), ("dynamic", 2)]
    seeds = [flag_values(["x", *r["flags"]])["--seed"] for r in driver_requests(fakes)]
    assert seeds[0] == seeds[1] and seeds[2] == seeds[3] and len(set(seeds)) == 3  # the same prompts per pair
    text = (out / "report.md").read_text()
    assert "## Round by round: dynamic against plain" in text and "against eagle3" not in text
    assert "| closed-2 | 3 | 2.000 / 2.000 / 2.000 | 2.000 [2.000, 2.000] | 1.000 / 1.000 / 1.000 |" in text


def test_paired_needs_two_configurations(tmp_path):
    with pytest.raises(SystemExit):
        main(tmp_path, "--schedule", "paired", "--configs", "plain,eagle3,dynamic")


def test_run_order_rotates_per_workload_and_reverses_every_other_round():
    names = ("a", "b", "c")
    assert [run.run_order(names, w, 0) for w in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert run.run_order(("a", "b"), 0, 1) == ["b", "a"]


def plan_of(tmp_path: Path, *flags: str) -> argparse.Namespace:
    args = run.build_parser().parse_args(["run", "--model-path", "m", "--draft-model-path", "d",
                                          "--out", str(tmp_path), *flags])
    return run.build_plan(args)


def test_group_commands_share_every_flag_but_speculative_and_memory_ones(tmp_path):
    plan = plan_of(tmp_path, "--configs", "plain,eagle3,adaptive,dynamic", "--max-total-tokens", "80000")
    commands = run.group_commands(plan, plan.names)
    assert [port for _, port, _, _ in commands] == [30000, 30001, 30002, 30003]
    flags = [flag_values(command) for _, _, command, _ in commands]
    assert [f["--mem-fraction-static"] for f in flags] == [("0.21",), ("0.42",), ("0.64",), ("0.85",)]
    assert {f["--max-total-tokens"] for f in flags} == {("80000",)}
    shared = [{k: v for k, v in f.items() if not k.startswith("--speculative-") and k not in (
        "--port", "--mem-fraction-static")} for f in flags]
    assert all(s == shared[0] for s in shared)
    assert [run.TRACE_ENV in env for *_, env in commands] == [False, False, False, False]  # as served
    traced = plan_of(tmp_path, "--configs", "plain,eagle3,adaptive,dynamic", "--trace")
    assert [run.TRACE_ENV in env for *_, env in run.group_commands(traced, traced.names)] == [
        False, False, False, True]
    (single,) = run.group_commands(plan, ("dynamic",))
    assert flag_values(single[2])["--max-total-tokens"] == ("80000",) and single[1] == 30003


def test_split_trace_cuts_by_time_and_keeps_a_steps_lines_together(tmp_path):
    trace = tmp_path / "trace.jsonl"
    config = {"k": "config", "calibration": {}}  # written first, without a time: every file gets it
    lines = [{"k": "step", "step": 1, "t": 10.0}, {"k": "step", "step": 2, "t": 20.0, "mode": "plain"},
             {"k": "time", "step": 1, "ms": 1.0}, {"k": "verify", "step": 2, "tokens": 3},
             {"k": "step", "step": 3, "t": 30.0, "mode": "speculative"}, {"k": "catchup", "t": 31.0}]
    trace.write_text("".join(json.dumps(line) + "\n" for line in [config] + lines) + '{"k": "step", "t"')
    runs = [{"workload": "a", "started_at": 5.0, "ended_at": 12.0}, {"workload": "b@1", "started_at": 15.0,
            "ended_at": 25.0}, {"workload": "b@1", "started_at": 29.0, "ended_at": 35.0}, {"workload": "c"}]
    results.split_trace(trace, runs, tmp_path, "t_")
    kept = {name: [json.loads(line) for line in (tmp_path / f"t_{name}.jsonl").read_text().splitlines()]
            for name in ("a", "b_1")}
    assert kept["a"] == [config, lines[0], lines[2]]  # step 1's time line goes with step 1, written after step 2
    assert kept["b_1"] == [config, lines[1], lines[3], lines[4], lines[5]]  # names keep to letters, digits, . _ -
    assert runs[1]["trace"] == runs[2]["trace"] == {"file": "t_b_1.jsonl", "lines": 5,
                                                    "steps_by_mode": {"plain": 1, "speculative": 1}}
    assert "trace" not in runs[3]  # skipped: it never ran
    results.split_trace(tmp_path / "none.jsonl", runs[:1], tmp_path, "n_")
    assert runs[0]["trace"]["lines"] == 0


def test_report_of_a_saved_run_can_use_another_goodput_target(fakes):
    out = fakes / "out"
    assert main(out, "--configs", "plain", "--workload", "closed-2", "--warmup", "none") == 0
    saved = results.load_results(out / "results.json")
    assert saved["runs"][0]["metrics"]["goodput"] == pytest.approx(8.0)  # 16 requests in 2 s, TPOT 5 ms
    strict = report.render_markdown(results.load_results(out / "results.json"), goodput_tpot_ms=1.0)
    assert "## Goodput (req/s that completed with TPOT <= 1 ms)" in strict
    assert "| closed-2 | 0.00 |" in strict and "| closed-2 | 8.00 |" in (out / "report.md").read_text()


def test_a_failed_warm_up_is_reported_as_a_problem(fakes):
    out = fakes / "out"
    assert main(out, "--workload", "closed-2", "--configs", "plain", "--seed", "-5000") == 1  # seeds numpy refuses
    assert "- run `plain` warmup: failed: ValueError: Seed must be" in (out / "report.md").read_text()
