"""The benchmark's tables, reports, merging and plots (benchmark/sweeplib/report.py, results.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

import sweep  # noqa: E402
from sweeplib import configs, mode_counters, report, results  # noqa: E402
from benchmark_helpers import counters, ok_run, document_with, SPEC_COUNTS_BEFORE, SPEC_COUNTS_AFTER  # noqa: E402


@given(st.dictionaries(st.sampled_from(configs.CONFIG_NAMES), st.floats(1.0, 1e5), min_size=2))
def test_ratio_to_best_other(values):
    for config, value in values.items():
        best_other = max(v for name, v in values.items() if name != config)
        assert report.ratio_to_best_other(values, config) == pytest.approx(value / best_other)
    best = max(values, key=values.get)
    assert report.ratio_to_best_other(values, best) >= 1.0


def test_ratio_needs_another_configuration():
    assert report.ratio_to_best_other({"plain": 5.0}, "plain") is None


def test_throughput_table_shows_ratio_to_best_other():
    values = {(1, "plain"): 200.0, (1, "eagle3"): 370.0, (1, "dynamic"): 360.0,
              (64, "plain"): 6100.0, (64, "eagle3"): 4000.0, (64, "dynamic"): 6000.0}
    document = document_with([ok_run(c, n, v) for (n, c), v in values.items()], ["plain", "eagle3", "dynamic"])
    table = report.throughput_table(document)
    assert table[0] == "| concurrency | plain | eagle3 | dynamic |"
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]] for line in table[2:]}
    for concurrency in (1, 64):
        row_values = {c: v for (n, c), v in values.items() if n == concurrency}
        best = max(row_values, key=row_values.get)
        for cell, config in zip(rows[str(concurrency)], ["plain", "eagle3", "dynamic"]):
            ratio = row_values[config] / max(v for c, v in row_values.items() if c != config)
            assert f"({ratio:.2f}x)" in cell
            assert cell.startswith("**") == (config == best)


def test_baseline_ratio_table_divides_by_the_better_of_plain_and_eagle3():
    values = {(1, "plain"): 200.0, (1, "eagle3"): 400.0, (1, "dynamic"): 380.0, (1, "dynamic-fixed"): 400.0,
              (64, "plain"): 6000.0, (64, "eagle3"): 4000.0, (64, "dynamic"): 6000.0,
              (64, "dynamic-fixed"): 5400.0}
    document = document_with([ok_run(c, n, v) for (n, c), v in values.items()],
                             ["plain", "eagle3", "dynamic", "dynamic-fixed"])
    table = report.baseline_ratio_table(document)
    assert table[0] == "| config | 1 | 64 | geometric mean |"
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]] for line in table[2:]}
    assert rows["dynamic"] == ["0.950", "1.000", f"{(0.95 * 1.0) ** 0.5:.3f}"]
    assert rows["dynamic-fixed"] == ["1.000", "0.900", f"{(1.0 * 0.9) ** 0.5:.3f}"]


def test_baseline_ratio_table_needs_both_baselines():
    document = document_with([ok_run("plain", 1, 200.0), ok_run("dynamic", 1, 210.0)], ["plain", "dynamic"])
    assert report.baseline_ratio_table(document) == [
        "No EAGLE3_DYNAMIC run with both plain and EAGLE3 runs beside it."]


def test_latency_table_and_failed_runs_are_left_out():
    failed = ok_run("eagle3", 4, 999.0)
    failed["status"] = "failed"
    document = document_with([ok_run("plain", 4, 700.0, tpot=5.0), ok_run("eagle3", 1, 370.0, tpot=2.5), failed],
                             ["plain", "eagle3"])
    table = report.latency_table(document, "median_tpot_ms", "p99_tpot_ms")
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]] for line in table[2:]}
    assert rows["4"] == ["5.0 / 7.5", "-"]
    assert rows["1"] == ["-", "2.5 / 3.8"]
    assert "run `eagle3` c=4: failed" in "\n".join(report.problem_lines(document))


def test_mode_counter_table_lists_dynamic_runs():
    delta = mode_counters.counter_delta(counters(10, 0), counters(40, 90, 1, 0, 0))
    document = document_with([ok_run("dynamic", 64, 5000.0, delta=delta), ok_run("plain", 64, 6000.0)],
                             ["plain", "dynamic"])
    table = report.mode_counter_table(document)
    assert len(table) == 3
    assert f"{100 * 30 / 120:.1f}%" in table[2]


def test_mode_counter_table_shows_the_requests_per_speculative_step():
    delta = mode_counters.counter_delta(SPEC_COUNTS_BEFORE, SPEC_COUNTS_AFTER)
    table = report.mode_counter_table(document_with([ok_run("dynamic", 64, 5000.0, delta=delta)],
                                                    ["dynamic"]))
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    row = [cell.strip() for cell in table[2].strip("|").split("|")]
    assert row[header.index("requests per spec step")] == "3.0"


def test_mode_counter_table_says_whether_a_runs_warm_up_request_is_counted():
    delta = mode_counters.counter_delta(counters(10, 0), counters(40, 90))
    after_warmup = ok_run("dynamic", 64, 5000.0, delta=delta)
    after_warmup["mode_counters"]["before_source"] = mode_counters.BEFORE_AFTER_WARMUP
    older = ok_run("dynamic", 128, 5000.0, delta=delta)
    table = report.mode_counter_table(document_with([after_warmup, older], ["dynamic"]))
    assert table[0].endswith("| warm-up request included |")
    assert table[2].endswith("| no | no |") and table[3].endswith("| no | yes |")


def test_prefill_table_shows_the_drafts_share_of_prefill_gpu_time():
    before = {**counters(10, 0), "prefill_batches": 2, "prefill_tokens": 1000,
              "prefill_target_gpu_ms": 50.0, "prefill_draft_gpu_ms": 2.0}
    after = {**counters(40, 90), "prefill_batches": 12, "prefill_tokens": 9000,
             "prefill_target_gpu_ms": 450.0, "prefill_draft_gpu_ms": 12.0}
    delta = mode_counters.counter_delta(before, after)
    document = document_with([ok_run("dynamic", 64, 5000.0, delta=delta), ok_run("plain", 64, 6000.0)],
                             ["plain", "dynamic"])
    table = report.prefill_table(document)
    assert len(table) == 3
    cells = [cell.strip() for cell in table[2].split("|")[1:-1]]
    assert cells == ["dynamic", "64", "10", "8000", "400.0", "10.0", "2.5%"]
    without = document_with([ok_run("plain", 64, 6000.0)], ["plain"])
    assert report.prefill_table(without)[0].startswith("No run reported prefill timings")


def test_plain_ratio_table_compares_throughputs_and_ttft_with_plain():
    dynamic = ok_run("dynamic", 64, 5000.0)
    dynamic["metrics"]["median_ttft_ms"] = 33.0
    document = document_with([dynamic, ok_run("plain", 64, 6250.0), ok_run("plain", 128, 7000.0)],
                             ["plain", "dynamic"])
    table = report.plain_ratio_table(document)
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line for line in table[2:]}
    assert set(rows) == {("dynamic", "output throughput"), ("dynamic", "request throughput"),
                         ("dynamic", "median TTFT")}
    assert "| 0.800 |" in rows[("dynamic", "output throughput")]
    assert "| 0.800 |" in rows[("dynamic", "request throughput")]
    assert "| 1.100 |" in rows[("dynamic", "median TTFT")]
    assert table[0] == "| config | ratio of | 64 |"  # 128 has no dynamic run to compare
    assert report.plain_ratio_table(document_with([ok_run("plain", 1, 200.0)], ["plain"]))[0] \
        .startswith("No EAGLE3_DYNAMIC run")


def test_markdown_report_has_every_section():
    document = document_with([ok_run("plain", 1, 200.0), ok_run("eagle3", 1, 370.0)], ["plain", "eagle3"])
    text = report.render_markdown(document)
    for heading in ("Output throughput", "TTFT (ms)", "TPOT (ms)", "ITL (ms)", "mode counters",
                    "prefill GPU time", "TTFT p10 / p50 / p90", "EAGLE3_DYNAMIC / plain decoding",
                    "TTFT probe", "Servers", "Problems"):
        assert heading in text
    assert "(1.85x)" in text and "(0.54x)" in text


def test_merging_two_partial_result_files(tmp_path):
    first = document_with([ok_run("plain", 1, 200.0), ok_run("eagle3", 1, 370.0)], ["plain", "eagle3"],
                          created="2026-11-29T01:00:00+00:00")
    second = document_with([ok_run("adaptive", 1, 360.0), ok_run("dynamic", 1, 365.0), ok_run("eagle3", 1, 380.0)],
                           ["adaptive", "dynamic"], created="2026-11-29T02:00:00+00:00")
    paths = []
    for index, document in enumerate((first, second)):
        path = tmp_path / f"part{index}.json"
        results.save_results(document, path)
        paths.append(path)
    merged = results.merge_results([results.load_results(p) for p in paths])
    assert set(merged["configs"]) == {"plain", "eagle3", "adaptive", "dynamic"}
    assert [s["created"] for s in merged["sources"]] == [first["sources"][0]["created"], second["sources"][0]["created"]]
    keys = [(r["config"], r["concurrency"]) for r in merged["runs"]]
    assert len(keys) == len(set(keys)) == 4
    eagle3 = next(r for r in merged["runs"] if r["config"] == "eagle3")
    assert eagle3["metrics"]["output_throughput"] == 380.0


def test_merging_keeps_a_success_over_a_later_failure():
    first = document_with([ok_run("eagle3", 1, 370.0)], ["eagle3"], created="2026-11-29T01:00:00+00:00")
    failed = ok_run("eagle3", 1, 0.0)
    failed["status"] = "failed"
    second = document_with([failed, ok_run("plain", 1, 200.0)], ["eagle3", "plain"],
                           created="2026-11-29T02:00:00+00:00")
    first["configs"]["eagle3"]["startup_s"] = 11.0
    second["configs"]["eagle3"]["startup_s"] = 22.0
    merged = results.merge_results([first, second])
    eagle3 = [r for r in merged["runs"] if r["config"] == "eagle3"]
    assert [r["status"] for r in eagle3] == ["ok"]
    assert eagle3[0]["metrics"]["output_throughput"] == 370.0
    assert merged["configs"]["eagle3"]["startup_s"] == 11.0
    assert set(merged["configs"]) == {"eagle3", "plain"}


def test_report_command_writes_report_and_plots_from_recorded_json(tmp_path):
    runs = [ok_run(c, n, 100.0 * n + i) for i, c in enumerate(configs.CONFIG_NAMES) for n in (1, 4, 16, 64, 128)]
    part = tmp_path / "part.json"
    results.save_results(document_with(runs, list(configs.CONFIG_NAMES)), part)
    out = tmp_path / "merged"
    assert sweep.main(["report", "--inputs", str(part), "--out", str(out)]) == 0
    for name in (sweep.RESULTS_FILE, report.REPORT_FILE, report.THROUGHPUT_PLOT_FILE, report.TPOT_PLOT_FILE):
        assert (out / name).stat().st_size > 0, name
    assert (out / report.THROUGHPUT_PLOT_FILE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(results.load_results(out / sweep.RESULTS_FILE)["runs"]) == len(runs)


def test_load_results_rejects_other_schema(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"schema_version": 0}))
    with pytest.raises(ValueError):
        results.load_results(path)


def test_report_recomputes_a_runs_counter_change_from_its_snapshots():
    stale = mode_counters.counter_delta(counters(10, 0), counters(30, 5))
    record = {"before": SPEC_COUNTS_BEFORE, "after": SPEC_COUNTS_AFTER, "delta": stale}
    assert mode_counters.run_delta(record)["speculative_accept_length"] == pytest.approx(3.0)
    assert mode_counters.run_delta({"before": None, "after": None, "delta": stale}) == stale
    assert mode_counters.run_delta(None) is None


def test_recorded_commands_write_the_offline_install_folder_as_kit_dir(tmp_path, monkeypatch):
    kit = tmp_path / "kit"
    monkeypatch.setenv("KIT_DIR", str(kit))
    command = ["python3", "sweep.py", "--model-path", f"{kit}/models/llama8b"]
    document = results.new_results_document(command, {})
    assert document["sources"][0]["command_line"].endswith("--model-path $KIT_DIR/models/llama8b")
    monkeypatch.delenv("KIT_DIR")
    assert results.shown_paths(f"{kit}/models/llama8b") == f"{kit}/models/llama8b"
