"""The benchmark's reports, ratios, merging, and the committed results written again
(benchmark/sweeplib/report.py, results.py, paired.py)."""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

import run  # noqa: E402
from sweeplib import configs, report, results  # noqa: E402
from benchmark_helpers import (counters, document_with, ok_run, SPEC_COUNTS_AFTER, SPEC_COUNTS_BEFORE,  # noqa: E402
                               traffic_document, traffic_run)

RESULTS = Path(__file__).resolve().parents[1] / "benchmark" / "results"


def section(text: str, heading: str) -> list[str]:
    """The table lines (or the one sentence) of the section whose heading starts with ``heading``."""
    lines = text.split("\n## " + heading, 1)[1].split("\n## ", 1)[0].splitlines()[1:]
    return [line for line in lines if line.startswith("|")] or [line for line in lines if line][-1:]


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def rows_of(table: list[str]) -> dict[str, list[str]]:
    """A table's rows by their first cell (by "config / metric" in the ratio tables)."""
    ratio_table = cells(table[0])[:2] == ["config", "ratio of"]
    return {" / ".join(cells(line)[:2]) if ratio_table else cells(line)[0]: cells(line)[2 if ratio_table else 1:]
            for line in table[2:]}


@given(st.dictionaries(st.sampled_from(configs.CONFIG_NAMES), st.floats(1.0, 1e5), min_size=2))
def test_ratio_to_best_other(values):
    for config, value in values.items():
        best_other = max(v for name, v in values.items() if name != config)
        assert report.ratio_to_best_other(values, config) == pytest.approx(value / best_other)
    best = max(values, key=values.get)
    assert report.ratio_to_best_other(values, best) >= 1.0
    assert report.ratio_to_best_other({"plain": 5.0}, "plain") is None


def test_the_better_baseline_is_the_larger_throughput_and_the_smaller_latency():
    values = {"plain": 100.0, "eagle3": 50.0, "dynamic": 60.0}
    assert report.ratio_to_baselines(values, "dynamic") == pytest.approx(0.6)
    assert report.ratio_to_baselines(values, "dynamic", lower_is_better=True) == pytest.approx(1.2)
    assert report.ratio_to_baselines(values, "dynamic", True, ("plain",)) == pytest.approx(0.6)
    assert report.ratio_to_baselines({"plain": 1.0, "dynamic": 1.0}, "dynamic") is None  # no eagle3


def traffic_report(goodput_tpot_ms: float | None = None) -> str:
    """poisson-4: plain is fast at TTFT and slow per token, EAGLE3 the reverse, dynamic between."""
    runs = [traffic_run("plain", "poisson-4", 0.040, [0.030] * 8 + [0.070] * 2, duration=10.0),
            traffic_run("eagle3", "poisson-4", 0.080, [0.010] * 10, duration=8.0),
            traffic_run("dynamic", "poisson-4", 0.050, [0.012] * 10, duration=8.0),
            traffic_run("dynamic", "long-1", 0.5, [0.02] * 4), traffic_run("plain", "long-1", 0.4, [0.02] * 4)]
    return report.render_markdown(traffic_document(runs), goodput_tpot_ms)


def test_traffic_report_divides_dynamic_by_plain_and_by_the_better_baseline_per_metric():
    text = traffic_report()
    vs_plain = rows_of(section(text, "EAGLE3_DYNAMIC / plain decoding"))
    vs_best = rows_of(section(text, "EAGLE3_DYNAMIC / best of plain and EAGLE3"))
    assert section(text, "EAGLE3_DYNAMIC / plain decoding")[0] == "| config | ratio of | poisson-4 | long-1 |"
    assert vs_plain["dynamic / request throughput"] == ["1.250", "1.000"]  # 10 requests in 8 s against 10 s
    assert vs_plain["dynamic / TTFT p50"][0] == "1.250" and vs_best["dynamic / TTFT p50"] == ["1.250"]
    assert vs_best["dynamic / TPOT p50"] == ["1.200"]  # over EAGLE3's 10 ms, the better one
    assert vs_best["dynamic / request throughput"] == ["1.000"]  # EAGLE3 also took 8 s
    assert vs_plain["dynamic / goodput"][0] == f"{(10 / 8) / (8 / 10):.3f}"  # plain: 2 requests over 50 ms
    goodput = rows_of(section(text, "Goodput"))
    assert goodput["poisson-4"] == ["0.80 (0.64x)", "**1.25** (1.00x)", "1.25 (1.00x)"]
    assert rows_of(section(traffic_report(100.0), "Goodput"))["poisson-4"][0] == "1.00 (0.80x)"
    assert rows_of(section(text, "TPOT (ms)"))["poisson-4"] == ["30.0 / 70.0", "10.0 / 10.0", "12.0 / 12.0"]
    assert "ITL (ms)" not in text  # the benchmark's own runs keep no per-token latencies


def test_rounds_are_averaged_and_workloads_keep_the_order_they_ran_in():
    runs = [traffic_run("plain", "poisson-8", 0.01, [0.01] * 4, duration=d, round_index=r)
            for r, d in enumerate((2.0, 4.0))] + [traffic_run("plain", "closed-1", 0.01, [0.01] * 4)]
    grid = report.metric_grid(traffic_document(runs), "request_throughput")
    assert list(grid) == ["poisson-8", "closed-1"]
    assert grid["poisson-8"]["plain"] == pytest.approx((4 / 2 + 4 / 4) / 2)


def test_mode_counters_show_each_runs_change_and_its_probes():
    dynamic = traffic_run("dynamic", "poisson-4", 0.01, [0.01])
    dynamic["mode_counters"] = {"before": {**SPEC_COUNTS_BEFORE, "policy_probes": 2},
                                "after": {**SPEC_COUNTS_AFTER, "policy_probes": 5}, "delta": None}
    table = section(report.render_markdown(traffic_document([dynamic])), "EAGLE3_DYNAMIC mode counters")
    row = dict(zip(cells(table[0]), cells(table[2])))
    assert (row["spec steps"], row["plain steps"], row["probes"]) == ("20", "5", "policy_probes 3")
    assert (row["share of speculative steps"], row["requests per spec step"]) == ("80.0%", "3.0")
    assert row["accept length in spec steps (this run)"] == "3.00"
    assert row["host µs per step: worker / spec step / plain step"] == "- / - / -"  # older plugins


def test_mode_counters_show_host_microseconds_per_step_of_each_part():
    dynamic = traffic_run("dynamic", "poisson-4", 0.01, [0.01])
    host_before = {"host_dispatch_ms": 10.0, "host_speculative_step_ms": 100.0, "host_plain_step_ms": 50.0}
    host_after = {"host_dispatch_ms": 12.5, "host_speculative_step_ms": 160.0, "host_plain_step_ms": 60.0}
    dynamic["mode_counters"] = {"before": {**SPEC_COUNTS_BEFORE, **host_before},
                                "after": {**SPEC_COUNTS_AFTER, **host_after}, "delta": None}
    table = section(report.render_markdown(traffic_document([dynamic])), "EAGLE3_DYNAMIC mode counters")
    row = dict(zip(cells(table[0]), cells(table[2])))
    # 20 speculative and 5 plain steps: 2.5 ms / 25, 60 ms / 20, 10 ms / 5
    assert row["host µs per step: worker / spec step / plain step"] == "100 / 3000 / 2000"


def test_a_segment_says_its_shape_and_a_shared_prefix_segment_its_system_prompts():
    import dataclasses
    import math
    from sweeplib.workloads import workload

    def text(name: str) -> str:  # as results.json stores it (an infinite rate as None)
        segment = dataclasses.asdict(workload(name)[0].segments[0])
        return report.segment_text({**segment, "rate": segment["rate"] if math.isfinite(segment["rate"]) else None})
    assert text("shared-4@4") == ("16 prompts of input 256 after one of 8 system prompts of 2048 / output 512 "
                                  "tokens x [0.25, 1], 4 req/s")
    assert text("closed-2") == "16 prompts of input 512 / output 256 tokens, all at once, at most 2 at a time"


def test_problems_name_failed_runs_and_unequal_kv_pools():
    failed = {**traffic_run("eagle3", "poisson-4", 0.01, [0.01]), "status": "failed", "error": "server died\nx"}
    document = traffic_document([traffic_run("plain", "poisson-4", 0.01, [0.01]), failed])
    assert report.problem_lines(document) == ["- run `eagle3` poisson-4: failed: server died"]
    equal = report.render_markdown(document)
    document["configs"]["dynamic"]["kv_tokens"] = 90000
    assert report.problem_lines(document)[-1].startswith("- KV pools differ (tokens): ")
    # ... and say so under the header, before any ratio.
    header = report.render_markdown(document).partition("## Output throughput")[0]
    assert "\n\n**KV pools differ (tokens): {" in header and "'dynamic': 90000" in header
    assert "KV pools differ" not in equal


def test_sweep_files_keep_their_concurrency_rows_and_tables():
    values = {(1, "plain"): 200.0, (1, "eagle3"): 370.0, (1, "dynamic"): 360.0,
              (64, "plain"): 6100.0, (64, "eagle3"): 4000.0, (64, "dynamic"): 6000.0}
    document = document_with([ok_run(c, n, v) for (n, c), v in values.items()], ["plain", "eagle3", "dynamic"])
    text = report.render_markdown(document)
    table = section(text, "Output throughput")
    assert table[0] == "| concurrency | plain | eagle3 | dynamic |"
    assert rows_of(table)["1"] == ["200 (0.54x)", "**370** (1.03x)", "360 (0.97x)"]
    assert rows_of(section(text, "EAGLE3_DYNAMIC / best of"))["dynamic / output throughput"] == [
        f"{360 / 370:.3f}", f"{6000 / 6100:.3f}"]
    assert rows_of(section(text, "ITL (ms)"))["64"] == ["5.0 / 10.0"] * 3


def test_the_report_command_writes_each_inputs_report_in_turn(tmp_path):
    first = traffic_document([traffic_run("plain", "poisson-4", 0.01, [0.01])])
    second = traffic_document([traffic_run("plain", "long-1", 0.01, [0.01])])
    for document, name in ((first, "a.json"), (second, "b.json")):
        results.save_results(document, tmp_path / name)
    assert run.main(["report", "--inputs", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out",
                     str(tmp_path / "r"), "--name", "both.md"]) == 0
    text = (tmp_path / "r" / "both.md").read_text()
    assert text == report.render_markdown(first) + "\n---\n\n" + report.render_markdown(second)
    assert text.index("| poisson-4 |") < text.index("| long-1 |")


def test_load_results_reads_xz_and_rejects_other_schemas(tmp_path):
    path = tmp_path / "results.json.xz"
    path.write_bytes(lzma.compress(json.dumps(traffic_document([])).encode()))
    assert results.load_results(path)["schema_version"] == results.SCHEMA_VERSION
    (tmp_path / "old.json").write_text(json.dumps({"schema_version": 0}))
    with pytest.raises(ValueError):
        results.load_results(tmp_path / "old.json")


def test_report_recomputes_a_runs_counter_change_from_its_snapshots():
    stale = results.counter_delta(counters(10, 0), counters(30, 5))
    record = {"before": SPEC_COUNTS_BEFORE, "after": SPEC_COUNTS_AFTER, "delta": stale}
    assert results.run_delta(record)["speculative_accept_length"] == pytest.approx(3.0)
    assert results.run_delta({"before": None, "after": None, "delta": stale}) == stale
    assert results.run_delta(None) is None


def test_recorded_commands_write_the_offline_install_folder_as_its_variable(tmp_path, monkeypatch):
    kit = tmp_path / "kit"
    monkeypatch.setenv("SGLANG_OFFLINE_ENV", str(kit))
    document = results.new_results_document(["python3", "run.py", "--model-path", f"{kit}/models/llama8b"], {}, "c")
    assert document["sources"][0]["command_line"].endswith("--model-path $SGLANG_OFFLINE_ENV/models/llama8b")
    monkeypatch.delenv("SGLANG_OFFLINE_ENV")
    assert results.shown_paths(f"{kit}/models/llama8b") == f"{kit}/models/llama8b"


# Committed results: every one is written again and compared with its committed report where the
# layout is the same: the sweep files' tables, the interleaved files' runs, the paired file whole.
def committed(kind: str) -> list[Path]:
    paths = sorted(p for p in RESULTS.rglob("*") if p.name.endswith(("results.json", "results.json.xz")))
    command = {p: results.load_results(p)["sources"][0]["command_line"] for p in paths}
    return [p for p in paths if (kind + ".py") in command[p]]


def report_beside(path: Path) -> Path:
    return path.with_name(path.name.replace("results.json.xz", "report.md").replace("results.json", "report.md"))


def test_committed_results_of_every_format_are_found():
    counts = {kind: len(committed(kind)) for kind in ("sweep", "interleaved", "paired", "run")}
    assert counts["sweep"] >= 30 and counts["interleaved"] >= 15 and counts["paired"] >= 1 and counts["run"] >= 2


@pytest.mark.parametrize("path", committed("run"), ids=lambda p: str(p.relative_to(RESULTS)))
def test_committed_reports_of_the_driver_regenerate_whole(path):
    assert report.render_markdown(results.load_results(path)) == report_beside(path).read_text()


@pytest.mark.parametrize("path", committed("sweep"), ids=lambda p: str(p.relative_to(RESULTS)))
def test_committed_sweep_reports_regenerate_with_the_same_tables(path):
    text = report.render_markdown(results.load_results(path))
    old = report_beside(path).read_text()
    for heading in ("Output throughput (tok/s)", "TTFT (ms)", "TPOT (ms)", "ITL (ms)"):
        assert section(text, heading) == section(old, heading), heading


def every_run(text: str, columns: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The named columns of each row of the table that follows "Every run, in the order it ran"."""
    after = text.split("Every run, in the order it ran", 1)[1].split("\n|", 1)[1]
    lines = ("|" + after).split("\n\n", 1)[0].splitlines()
    header = cells(lines[0])
    return [tuple(cells(line)[header.index(column)] for column in columns) for line in lines[2:]]


@pytest.mark.parametrize("path", committed("interleaved"), ids=lambda p: str(p.relative_to(RESULTS)))
def test_committed_interleaved_reports_regenerate_with_the_same_runs(path):
    """The former interleaved.py's reports, in whichever of its layouts, list every run in order;
    the grid lists the same runs, with the same throughput and median TTFT."""
    text = report.render_markdown(results.load_results(path))
    old = every_run(report_beside(path).read_text(), ("config", "tok/s", "median TTFT (ms)"))
    assert old and every_run(text, ("config", "output tok/s", "TTFT p50 (ms)")) == old


def test_the_committed_paired_report_regenerates_through_the_report_command(tmp_path):
    (path,) = committed("paired")
    assert run.main(["report", "--inputs", str(path), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").read_text() == report_beside(path).read_text()
    assert not (tmp_path / "results.json").exists()  # one input: nothing merged, nothing rewritten
