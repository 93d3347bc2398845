"""Markdown tables and PNG plots from a result document (see results.py)."""

from __future__ import annotations

import math
from pathlib import Path

from sweeplib import mode_counters
from sweeplib.configs import CONFIG_NAMES, DYNAMIC, DYNAMIC_FIXED, EAGLE3, PLAIN
from sweeplib.results import RUN_OK, successful_runs

REPORT_FILE = "report.md"
THROUGHPUT_PLOT_FILE = "throughput.png"
TPOT_PLOT_FILE = "tpot.png"

LATENCY_TABLES: tuple[tuple[str, str, str], ...] = (
    ("TTFT (ms), median / p99", "median_ttft_ms", "p99_ttft_ms"),
    ("TPOT (ms), median / p99", "median_tpot_ms", "p99_tpot_ms"),
    ("ITL (ms), median / p99", "median_itl_ms", "p99_itl_ms"),
)
# (metric, what the row shows) of the EAGLE3_DYNAMIC / plain table.
PLAIN_RATIO_METRICS = (
    ("output_throughput", "output throughput"),
    ("request_throughput", "request throughput"),
    ("median_ttft_ms", "median TTFT"),
)


def ordered_configs(names: set[str]) -> list[str]:
    """Known configurations in their canonical order, then any others alphabetically."""
    return [n for n in CONFIG_NAMES if n in names] + sorted(names - set(CONFIG_NAMES))


def runs_in_report_order(document: dict) -> list[dict]:
    """Successful runs by canonical configuration order, then concurrency."""
    rank = {name: index for index, name in enumerate(ordered_configs({r["config"] for r in document["runs"]}))}
    return sorted(successful_runs(document), key=lambda r: (rank[r["config"]], r["concurrency"]))


def metric_grid(document: dict, metric: str) -> dict[int, dict[str, float]]:
    """{concurrency: {config: value}} over successful runs that have the metric."""
    grid: dict[int, dict[str, float]] = {}
    for run in successful_runs(document):
        if run["metrics"].get(metric) is not None:
            grid.setdefault(int(run["concurrency"]), {})[run["config"]] = float(run["metrics"][metric])
    return grid


def ratio_to_best_other(values: dict[str, float], config: str) -> float | None:
    """values[config] over the largest value of any other configuration; None if there is none
    or it is not positive."""
    others = [value for name, value in values.items() if name != config]
    return values[config] / max(others) if others and max(others) > 0 else None


def ratio_to_baselines(values: dict[str, float], config: str) -> float | None:
    """values[config] over the better of plain decoding and EAGLE3; None without both."""
    if config not in values or PLAIN not in values or EAGLE3 not in values:
        return None
    best = max(values[PLAIN], values[EAGLE3])
    return values[config] / best if best > 0 else None


def _format_number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _concurrency_table(grid: dict[int, dict[str, float]], cell) -> list[str]:
    """One row per concurrency, one column per configuration: cell(values of the row, config)."""
    configs = ordered_configs({c for row in grid.values() for c in row})
    rows = [[str(c)] + [cell(c, config) for config in configs] for c in sorted(grid)]
    return _markdown_table(["concurrency"] + configs, rows)


def throughput_table(document: dict) -> list[str]:
    grid = metric_grid(document, "output_throughput")

    def cell(concurrency: int, config: str) -> str:
        values = grid[concurrency]
        if config not in values:
            return "-"
        number = f"{values[config]:.0f}"
        if config == max(values, key=values.get) and len(values) > 1:
            number = f"**{number}**"
        ratio = ratio_to_best_other(values, config)
        return number if ratio is None else f"{number} ({ratio:.2f}x)"

    return _concurrency_table(grid, cell)


def latency_table(document: dict, median_key: str, p99_key: str) -> list[str]:
    medians, p99s = metric_grid(document, median_key), metric_grid(document, p99_key)
    return _concurrency_table(medians, lambda c, config: (
        f"{_format_number(medians[c].get(config))} / {_format_number(p99s.get(c, {}).get(config))}"
        if config in medians[c] else "-"))


def accept_length_table(document: dict) -> list[str]:
    grid = metric_grid(document, "accept_length")
    return _concurrency_table(grid, lambda c, config: _format_number(grid[c].get(config), 2))


def baseline_ratio_table(document: dict) -> list[str]:
    """EAGLE3_DYNAMIC configurations over the best of plain and EAGLE3, per concurrency, and
    the geometric mean over the concurrencies where both baselines ran."""
    grid = metric_grid(document, "output_throughput")
    rows = []
    for config in (DYNAMIC, DYNAMIC_FIXED):
        ratios = [ratio_to_baselines(grid[c], config) for c in sorted(grid)]
        present = [r for r in ratios if r is not None]
        if present:
            geomean = math.exp(sum(math.log(r) for r in present) / len(present))
            rows.append([config] + [_format_number(r, 3) for r in ratios] + [f"{geomean:.3f}"])
    if not rows:
        return ["No EAGLE3_DYNAMIC run with both plain and EAGLE3 runs beside it."]
    return _markdown_table(["config"] + [str(c) for c in sorted(grid)] + ["geometric mean"], rows)


def plain_ratio_table(document: dict) -> list[str]:
    """EAGLE3_DYNAMIC over plain decoding per concurrency: throughputs (above 1 is faster) and
    median TTFT (below 1 is sooner), what a prefill-heavy comparison needs."""
    rows = []
    for config in (DYNAMIC, DYNAMIC_FIXED):
        for metric, label in PLAIN_RATIO_METRICS:
            ratios = {c: values[config] / values[PLAIN] for c, values in metric_grid(document, metric).items()
                      if config in values and values.get(PLAIN)}
            if ratios:
                rows.append((config, label, ratios))
    if not rows:
        return ["No EAGLE3_DYNAMIC run with a plain run beside it."]
    concurrencies = sorted({c for _, _, ratios in rows for c in ratios})
    return _markdown_table(["config", "ratio of"] + [str(c) for c in concurrencies],
                           [[config, label] + [_format_number(ratios.get(c), 3) for c in concurrencies]
                            for config, label, ratios in rows])


def _run_table(document: dict, header: list[str], row, empty: str | None = None) -> list[str]:
    """One row per successful run in report order: row(run) (None leaves the run out)."""
    rows = [r for r in map(row, runs_in_report_order(document)) if r is not None]
    return _markdown_table(header, rows) if rows or empty is None else [empty]


def mode_counter_table(document: dict) -> list[str]:
    def row(run: dict) -> list[str] | None:
        delta = mode_counters.run_delta(run.get("mode_counters"))
        if not delta:
            return None
        fraction = delta["speculative_step_fraction"]
        warm_up_excluded = (run.get("mode_counters") or {}).get("before_source") == mode_counters.BEFORE_AFTER_WARMUP
        return [
            run["config"], str(run["concurrency"]), "-" if fraction is None else f"{100 * fraction:.1f}%",
            str(delta["speculative_steps"]), _format_number(delta.get(mode_counters.RUN_SPECULATIVE_BATCH_FIELD)),
            str(delta["plain_steps"]), str(delta["switches_to_plain"]), str(delta["switches_to_speculative"]),
            str(delta["catchup_tokens"]), _format_number(delta.get("catchup_gpu_ms")),
            _format_number(delta.get(mode_counters.RUN_ACCEPT_FIELD), 2),
            _format_number(delta["mean_accept_length"], 2),
            "yes" if delta["counters_reset_during_run"] else "no", "no" if warm_up_excluded else "yes",
        ]

    header = ["config", "concurrency", "share of speculative steps", "spec steps", "requests per spec step",
              "plain steps", "switches to plain", "switches to spec", "catch-up tokens", "catch-up GPU ms",
              "accept length in spec steps (this run)", "mean accept length (server lifetime)",
              "counters reset", "warm-up request included"]
    return _run_table(document, header, row,
                      "No run reported EAGLE3_DYNAMIC mode counters (`dynamic_eagle` in /server_info).")


def prefill_table(document: dict) -> list[str]:
    def row(run: dict) -> list[str] | None:
        delta = mode_counters.run_delta(run.get("mode_counters")) or {}
        target_ms, draft_ms = delta.get("prefill_target_gpu_ms"), delta.get("prefill_draft_gpu_ms")
        if target_ms is None or draft_ms is None:
            return None
        return [run["config"], str(run["concurrency"]), str(delta.get("prefill_batches", "-")),
                str(delta.get("prefill_tokens", "-")), _format_number(target_ms), _format_number(draft_ms),
                f"{100 * draft_ms / target_ms:.1f}%" if target_ms else "-"]

    header = ["config", "concurrency", "prefill batches", "prompt tokens", "target extend GPU ms",
              "draft extend GPU ms", "draft / target"]
    return _run_table(document, header, row,
                      "No run reported prefill timings (`prefill_target_gpu_ms` in /server_info).")


def ttft_diagnostics_table(document: dict) -> list[str]:
    def row(run: dict) -> list[str]:
        diag = run.get("ttft_diagnostics") or {}
        deciles = diag.get("ttft_deciles_ms")
        return [
            run["config"], str(run["concurrency"]), _format_number(run["metrics"].get("median_ttft_ms")),
            _format_number(run["metrics"].get("median_e2e_latency_ms")),
            _format_number(diag.get("median_ttft_to_median_e2e"), 2),
            _format_number(diag.get("first_request_ttft_ms")),
            _format_number(diag.get("median_ttft_excluding_first_ms")),
            f"{diag.get('requests_with_text_only_in_last_chunk', '-')} / "
            f"{diag.get('requests_without_visible_text', '-')} of {run['num_prompts']}",
            " / ".join(_format_number(deciles[i], 0) for i in (0, 4, 8)) if deciles else "-",
        ]

    header = ["config", "concurrency", "median TTFT", "median E2E", "TTFT / E2E", "first request TTFT",
              "median TTFT without first", "text only in last chunk / never", "TTFT p10 / p50 / p90"]
    return _run_table(document, header, row)


def _configs_in_order(document: dict) -> list[tuple[str, dict]]:
    return [(name, document["configs"][name]) for name in ordered_configs(set(document["configs"]))]


def probe_table(document: dict) -> list[str]:
    rows = [
        [name] + [_format_number(probe[key]) for key in (
            "cold_token_ttft_ms", "cold_text_ttft_ms", "warm_median_token_ttft_ms",
            "warm_median_text_ttft_ms", "warm_median_e2e_ms")]
        + [", ".join(str(r["first_output_id"]) for r in probe["requests"])]
        for name, probe in ((name, config.get("ttft_probe")) for name, config in _configs_in_order(document))
        if probe
    ]
    if not rows:
        return ["No TTFT probe was run."]
    return _markdown_table(["config", "cold token TTFT", "cold text TTFT", "warm token TTFT (median)",
                            "warm text TTFT (median)", "warm E2E (median)", "first output ids"], rows)


def server_table(document: dict) -> list[str]:
    rows = [[name, config["status"], _format_number(config.get("startup_s"), 0),
             str(config.get("max_running_requests", "-")),
             ", ".join(f"{key} {value}" for key, value in (config.get("dynamic_policy") or {}).items()) or "-",
             str(config.get("server_version", "-"))]
            for name, config in _configs_in_order(document)]
    return _markdown_table(["config", "status", "startup (s)", "effective max running requests",
                            "EAGLE3_DYNAMIC policy (from /server_info)", "sglang"], rows)


def _first_line(text: str | None) -> str:
    return text.splitlines()[0] if text else ""


def problem_lines(document: dict) -> list[str]:
    lines = [f"- server `{name}`: {config['status']}: {_first_line(config.get('error'))}"
             for name, config in document["configs"].items() if config["status"] != RUN_OK]
    lines += [f"- run `{run['config']}` c={run['concurrency']}: {run['status']}: {_first_line(run.get('error'))}"
              for run in document["runs"] if run["status"] != RUN_OK]
    return lines or ["None."]


def source_lines(document: dict) -> list[str]:
    lines = []
    for source in document["sources"]:
        settings = source["settings"]
        lines += [
            f"- {source['created']}, GPU {source['gpu'] or 'unknown'}, sglang {source['sglang_version'] or 'unknown'}; "
            f"input {settings['input_len']} / output {settings['output_len']} tokens, "
            f"prompts per run max({settings['min_prompts']}, {settings['waves']} x concurrency)",
            f"  - `{source['command_line']}`",
        ]
    return lines


def command_lines(document: dict) -> list[str]:
    lines = []
    for name, config in _configs_in_order(document):
        env = " ".join(f"{k}={v}" for k, v in sorted((config.get("server_env") or {}).items()))
        lines.append(f"- `{name}`: `{(env + ' ') if env else ''}{' '.join(config.get('server_command') or [])}`")
    return lines


def render_markdown(document: dict) -> str:
    sections: list[list[str]] = [
        ["# EAGLE3_DYNAMIC sweep", "", *source_lines(document)],
        ["## Output throughput (tok/s)", "",
         "Each cell: throughput (ratio to the best other configuration at that concurrency; "
         "above 1.00x means this configuration was the fastest). Bold: fastest.", "",
         *throughput_table(document)],
        ["## EAGLE3_DYNAMIC / best of plain and EAGLE3 (output throughput)", "",
         *baseline_ratio_table(document)],
        ["## EAGLE3_DYNAMIC / plain decoding", "",
         "Throughputs above 1 are faster than plain decoding; TTFT below 1 is sooner.", "",
         *plain_ratio_table(document)],
    ]
    for title, median_key, p99_key in LATENCY_TABLES:
        sections.append([f"## {title}", "", *latency_table(document, median_key, p99_key)])
    sections += [
        ["## Acceptance length (bench_serving `accept_length`, server-wide since the run's cache flush)", "",
         "Tokens per request per target decode forward. EAGLE3_DYNAMIC's plain steps count as "
         "verify steps that accept one token, so at large batches this approaches 1.0; its "
         "acceptance in speculative steps alone is in the mode-counter table below.", "",
         *accept_length_table(document)],
        ["## EAGLE3_DYNAMIC mode counters (change over each run)", "",
         "From bench_serving's warm-up request of the run (after the flush that follows it) to "
         "the run's end; where that snapshot is missing (result files before 2026-12-01), from "
         "the previous run's end, so the warm-up request is counted too.", "",
         *mode_counter_table(document)],
        ["## EAGLE3_DYNAMIC prefill GPU time (change over each run)", "",
         "From CUDA events around each prefill's target extend and draft extend: what the "
         "draft's prefill costs next to the target's.", "",
         *prefill_table(document)],
        ["## TTFT checks from bench_serving's per-request details", "",
         "bench_serving stamps TTFT at the first chunk with visible text. TTFT / E2E near 1 and "
         "requests whose text came only in the last chunk mean the TTFT column measured "
         "detokenization, not the first token (benchmark/README.md).", "",
         *ttft_diagnostics_table(document)],
        ["## TTFT probe at concurrency 1 (ms)", "",
         "token TTFT: first streamed chunk with a completion token; text TTFT: first chunk with "
         "visible text (bench_serving's definition). Cold: the first long-prompt request the "
         "server served.", "",
         *probe_table(document)],
        ["## Servers", "", *server_table(document), "", *command_lines(document)],
        ["## Problems", "", *problem_lines(document)],
    ]
    return "\n\n".join("\n".join(section) for section in sections) + "\n"


def write_metric_plot(document: dict, metric: str, ylabel: str, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = metric_grid(document, metric)
    configs = ordered_configs({c for row in grid.values() for c in row})
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for config in configs:
        points = sorted((c, row[config]) for c, row in grid.items() if config in row)
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=config)
    axes.set_xscale("log", base=2)
    axes.set_xticks(sorted(grid), [str(c) for c in sorted(grid)])
    axes.minorticks_off()
    axes.set(xlabel="concurrency (log scale)", ylabel=ylabel, title=title)
    axes.grid(True, alpha=0.3)
    if configs:
        axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


PLOTS = ((THROUGHPUT_PLOT_FILE, "output_throughput", "output tokens/s", "Output throughput vs concurrency"),
         (TPOT_PLOT_FILE, "median_tpot_ms", "median TPOT (ms)", "Median time per output token vs concurrency"))


def write_report(document: dict, out_dir: Path) -> list[Path]:
    """Write report.md, throughput.png and tpot.png into out_dir; return their paths."""
    (out_dir / REPORT_FILE).write_text(render_markdown(document))
    for file, metric, ylabel, title in PLOTS:
        write_metric_plot(document, metric, ylabel, title, out_dir / file)
    return [out_dir / REPORT_FILE] + [out_dir / file for file, *_ in PLOTS]
