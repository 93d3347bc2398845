"""Markdown reports of result documents (results.py): runs in a grid, a row per workload (per concurrency, or workload
and concurrency, in older files), a column per configuration, rounds averaged; paired rounds in paired.py's table."""

from __future__ import annotations

import statistics

from sweeplib import bench, paired, results
from sweeplib.configs import CONFIG_NAMES, DYNAMIC, DYNAMIC_FIXED, EAGLE3, PLAIN

REPORT_FILE = "report.md"
LATENCY_TABLES = (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2E latency", "e2e_latency"))
# (metric, row label, lower is better) of EAGLE3_DYNAMIC over its baselines.
RATIO_METRICS = (("request_throughput", "request throughput", False), ("output_throughput", "output throughput", False),
                 ("goodput", "goodput", False), ("median_ttft_ms", "TTFT p50", True), ("p99_ttft_ms", "TTFT p99", True),
                 ("median_tpot_ms", "TPOT p50", True), ("p99_tpot_ms", "TPOT p99", True),
                 ("median_e2e_latency_ms", "E2E p50", True), ("p99_e2e_latency_ms", "E2E p99", True))


def row_key(run: dict):
    if "workload" in run and "concurrency" in run:  # the former interleaved.py's
        return f"{run['workload']} c={run['concurrency']}"
    return run.get("workload", run.get("concurrency"))


def row_header(document: dict) -> str:
    return "concurrency" if all(isinstance(row_key(run), int) for run in document["runs"]) else "workload"


def ordered_configs(names: set[str]) -> list[str]:
    """Known configurations in their canonical order, then any others alphabetically."""
    return [n for n in CONFIG_NAMES if n in names] + sorted(names - set(CONFIG_NAMES))


def ordered_rows(keys) -> list:
    """Concurrencies sorted; workloads in the order they first ran."""
    keys = list(dict.fromkeys(keys))
    return sorted(keys) if all(isinstance(key, int) for key in keys) else keys


def metric_grid(document: dict, metric: str) -> dict:
    """{row: {config: mean over the successful runs that have the metric}}, rows in order."""
    values: dict = {}
    for run in (run for run in document["runs"] if run["status"] == results.RUN_OK):
        if run["metrics"].get(metric) is not None:
            values.setdefault(row_key(run), {}).setdefault(run["config"], []).append(float(run["metrics"][metric]))
    return {key: {config: statistics.fmean(v) for config, v in values[key].items()} for key in ordered_rows(values)}


def ratio_to_best_other(values: dict[str, float], config: str) -> float | None:
    """values[config] over the largest value of any other configuration; None if there is none or it is not positive."""
    others = [value for name, value in values.items() if name != config]
    return values[config] / max(others) if others and max(others) > 0 else None


def ratio_to_baselines(values: dict[str, float], config: str, lower_is_better: bool = False,
                       baselines: tuple[str, ...] = (PLAIN, EAGLE3)) -> float | None:
    """values[config] over the better of the baselines (the smaller for latencies); None without all of them."""
    if config not in values or any(name not in values for name in baselines):
        return None
    best = (min if lower_is_better else max)(values[name] for name in baselines)
    return values[config] / best if best > 0 else None


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _markdown_table(header: list[str], rows, empty: str | None = None) -> list[str]:
    """The rows that are not None under the header; ``empty``, where given, instead of a table without rows."""
    rows = [row for row in rows if row is not None]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return [empty] if empty is not None and not rows else lines + ["| " + " | ".join(row) + " |" for row in rows]


def _grid_table(document: dict, grid: dict, cell) -> list[str]:
    """One row per workload or concurrency, one column per configuration: cell(row, config)."""
    configs = ordered_configs({c for row in grid.values() for c in row})
    return _markdown_table([row_header(document)] + configs,
                           [[str(key)] + [cell(key, config) for config in configs] for key in grid])


def throughput_table(document: dict, metric: str = "output_throughput", digits: int = 0) -> list[str]:
    """Each cell: the value (bold: the row's largest) and its ratio to the best other configuration."""
    grid = metric_grid(document, metric)

    def cell(key, config: str) -> str:
        values = grid[key]
        if config not in values:
            return "-"
        bold = "**" if config == max(values, key=values.get) and len(values) > 1 else ""
        ratio = ratio_to_best_other(values, config)
        return f"{bold}{values[config]:.{digits}f}{bold}" + ("" if ratio is None else f" ({ratio:.2f}x)")

    return _grid_table(document, grid, cell)


def latency_table(document: dict, name: str) -> list[str]:
    medians, p99s = metric_grid(document, f"median_{name}_ms"), metric_grid(document, f"p99_{name}_ms")
    return _grid_table(document, medians, lambda key, config: (
        f"{_number(medians[key].get(config))} / {_number(p99s.get(key, {}).get(config))}"
        if config in medians[key] else "-"))


def ratio_table(document: dict, baselines: tuple[str, ...]) -> list[str]:
    """EAGLE3_DYNAMIC over the better of the baselines, a row per metric, a column per workload."""
    rows = []
    for config in (DYNAMIC, DYNAMIC_FIXED):
        for metric, label, lower_is_better in RATIO_METRICS:
            ratios = {key: ratio for key, values in metric_grid(document, metric).items()
                      if (ratio := ratio_to_baselines(values, config, lower_is_better, baselines)) is not None}
            if ratios:
                rows.append((config, label, ratios))
    if not rows:
        return [f"No EAGLE3_DYNAMIC run with {' and '.join(baselines)} runs beside it."]
    keys = ordered_rows(key for _, _, ratios in rows for key in ratios)
    return _markdown_table(["config", "ratio of"] + [str(key) for key in keys],
                           [[config, label] + [_number(ratios.get(key), 3) for key in keys]
                            for config, label, ratios in rows])


def mode_counter_row(run: dict) -> list[str] | None:
    if not (delta := results.run_delta(run.get("mode_counters"))):
        return None
    fraction, spec, plain = delta["speculative_step_fraction"], delta["speculative_steps"], delta["plain_steps"]
    host = " / ".join(_number(1000 * delta[f] / n if f in delta and n else None, 0) for f, n in zip(
        results.HOST_MS_FIELDS, (spec + plain, spec, plain)))
    return [run["config"], str(row_key(run)), "-" if fraction is None else f"{100 * fraction:.1f}%",
            str(spec), _number(delta.get(results.RUN_SPECULATIVE_BATCH_FIELD)), str(plain),
            str(delta["switches_to_plain"]), str(delta["switches_to_speculative"]),
            ", ".join(f"{k} {v}" for k, v in delta.items() if "probe" in k) or "-", str(delta["catchup_tokens"]),
            _number(delta.get(results.RUN_ACCEPT_FIELD), 2), _number(delta["mean_accept_length"], 2),
            "yes" if delta["counters_reset_during_run"] else "no", host]


def every_run_row(run: dict) -> list[str]:
    metrics, delta = run.get("metrics") or {}, results.run_delta(run.get("mode_counters")) or {}
    return [str(row_key(run)), run["config"], str(run.get("round", 0)), run["status"],
            _number(metrics.get("output_throughput"), 0), _number(metrics.get("median_ttft_ms")),
            str(delta.get("speculative_steps", "")), str(delta.get("plain_steps", ""))]


def trace_row(run: dict) -> list[str] | None:
    trace = run.get("trace")
    return [run["config"], str(run["workload"]), str(run.get("round", 0)), trace["file"], str(trace["lines"]),
            ", ".join(f"{mode} {n}" for mode, n in sorted(trace["steps_by_mode"].items())) or "-"] if trace else None


def problem_lines(document: dict) -> list[str]:
    problems = [(f"server `{name}`", c) for name, c in document["configs"].items()] + [
        (f"run `{run['config']}` {row_key(run)}", run) for run in document["runs"] + document.get("warmups", [])]
    lines = [f"- {what}: {record['status']}: {(record.get('error') or '').partition(chr(10))[0]}"
             for what, record in problems if record["status"] != results.RUN_OK]
    pools = {name: config.get("kv_tokens") for name, config in document["configs"].items() if config.get("kv_tokens")}
    if len(set(pools.values())) > 1:  # also said under the report's header
        lines.append(f"- KV pools differ (tokens): {pools}")
    return lines or ["None."]


def segment_text(segment: dict) -> str:
    if not segment["prompts"]:
        return f"{segment['idle_s']:g} s idle"
    spread = f" x [{segment['range_ratio']:g}, 1]" if segment["range_ratio"] != 1 else ""
    rate = f"{segment['rate']:g} req/s" if segment["rate"] else "all at once"
    limit = f", at most {segment['concurrency']} at a time" if segment["concurrency"] else ""
    shared = f" after one of {segment['groups']} system prompts of {segment['prefix_len']}" if segment.get("groups") else ""
    return (f"{segment['prompts']} prompts of input {segment['input_len']}{shared} / output {segment['output_len']} "
            f"tokens{spread}, {rate}{limit}")


def source_lines(document: dict) -> list[str]:
    lines = []
    for source in document["sources"]:
        s = source["settings"]
        shape = (f"; git {source.get('git_commit') or 'unknown'}, schedule {s['schedule']}, {s['rounds']} round(s)"
                 if "schedule" in s else f"; input {s['input_len']} / output {s['output_len']} tokens"
                 if "input_len" in s else "")
        lines += [f"- {source['created']}, GPU {source['gpu'] or 'unknown'}, sglang {source['sglang_version']}"
                  f"{shape}", f"  - `{source['command_line']}`"]
        lines += [f"  - `{w['name']}`: " + "; then ".join(map(segment_text, w["segments"]))
                  for w in s.get("workloads", []) if "segments" in w]
    return lines


def grid_markdown(document: dict) -> str:
    goodput_ms = document["sources"][-1]["settings"].get("goodput_tpot_ms")
    sections = [
        ["# EAGLE3_DYNAMIC serving benchmark", "", *source_lines(document), *(f"\n**{line[2:]}**: every ratio below "
         "compares servers of unequal capacity." for line in problem_lines(document) if line.startswith("- KV pools"))],
        ["## Output throughput (tok/s)", "", "Each cell: throughput (ratio to the best other configuration; "
         "above 1.00x means this configuration was the fastest). Bold: fastest.", "", *throughput_table(document)],
        ["## Request throughput (req/s)", "", *throughput_table(document, "request_throughput", 2)],
        *([[f"## Goodput (req/s that completed with TPOT <= {goodput_ms:g} ms)", "",
            *throughput_table(document, "goodput", 2)]] if goodput_ms else []),
        *([f"## EAGLE3_DYNAMIC / {title}", "", "Throughputs and goodput above 1 are better, latencies below 1; "
           "the better baseline is taken per metric.", "", *ratio_table(document, baselines)]
          for title, baselines in (("plain decoding", (PLAIN,)), ("best of plain and EAGLE3", (PLAIN, EAGLE3)))),
        *([f"## {title} (ms), median / p99", "", *latency_table(document, name)] for title, name in LATENCY_TABLES
          if metric_grid(document, f"median_{name}_ms")),
        ["## Acceptance length (bench_serving `accept_length`)", "", "Tokens per request per target forward since "
         "the run's cache flush; EAGLE3_DYNAMIC's plain steps count as accepting one token.", "",
         *throughput_table(document, "accept_length", 2)],
        ["## EAGLE3_DYNAMIC mode counters (change over each run)", "", "From the state after bench_serving's "
         "(first) warm-up request to the end of the run, idle gaps included.", "",
         *_markdown_table(["config", row_header(document), "share of speculative steps", "spec steps",
                           "requests per spec step", "plain steps", "switches to plain", "switches to spec", "probes",
                           "catch-up tokens", "accept length in spec steps (this run)",
                           "mean accept length (server lifetime)", "counters reset",
                           "host µs per step: worker / spec step / plain step"],
                          (mode_counter_row(r) for r in document["runs"] if r["status"] == results.RUN_OK),
                          "No run reported EAGLE3_DYNAMIC mode counters (`dynamic_eagle` in /server_info).")],
        *([f"## Round by round: {DYNAMIC} against {baseline}", "", *paired.pair_table(paired.round_pairs(
            document["runs"], baseline, DYNAMIC), baseline, DYNAMIC, "workload")]
          for baseline in (PLAIN, EAGLE3) if {baseline, DYNAMIC} <= {r["config"] for r in document["runs"]}
          and any(r.get("round") and r.get("segments") for r in document["runs"])),
        ["## Every run, in the order it ran", "", *_markdown_table(
            [row_header(document), "config", "round", "status", "output tok/s", "TTFT p50 (ms)", "spec steps",
             "plain steps"], [every_run_row(run) for run in document["runs"]])],
        ["## Decode-step traces (`SGLANG_DYNAMIC_EAGLE_TRACE`, split by workload)", "",
         *_markdown_table(["config", "workload", "round", "file", "lines", "decode steps by mode"],
                          map(trace_row, document["runs"]), "None.")],
        ["## Servers", "", *_markdown_table(
            ["config", "status", "startup (s)", "KV pool (tokens)", "effective max running requests",
             "EAGLE3_DYNAMIC policy (from /server_info)"],
            [[name, c["status"], _number(c.get("startup_s"), 0), str(c.get("kv_tokens") or "-"),
              str(c.get("max_running_requests", "-")),
              ", ".join(f"{k} {v}" for k, v in (c.get("dynamic_policy") or {}).items()) or "-"]
             for name, c in ((n, document["configs"][n]) for n in ordered_configs(set(document["configs"])))]), "",
         *(f"- `{name}`: `{' '.join(f'{k}={v}' for k, v in sorted((c.get('server_env') or {}).items()))} "
           f"{' '.join(c.get('server_command') or [])}`" for name, c in document["configs"].items())],
        ["## Problems", "", *problem_lines(document)],
    ]
    return "\n\n".join("\n".join(section) for section in sections) + "\n"


def render_markdown(document: dict, goodput_tpot_ms: float | None = None) -> str:
    """The report of a result document; runs with stored requests get their metrics computed again (with
    ``goodput_tpot_ms``, a new goodput target)."""
    if "pairs" in document:
        return paired.report_markdown(document)
    settings = document["sources"][-1]["settings"]
    if goodput_tpot_ms is not None:
        settings["goodput_tpot_ms"] = goodput_tpot_ms
    for run in document["runs"]:
        if run.get("segments"):
            run["metrics"] = bench.workload_metrics(run["segments"], settings["goodput_tpot_ms"])
    return grid_markdown(document)
