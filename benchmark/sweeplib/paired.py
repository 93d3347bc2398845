"""Pair statistics of two configurations run on the same prompts one right after the other (rounds
in `run.py`; waves of the former paired.py's files): per pair the other's median TTFT and output
throughput over the first's (cancelling most of the host's slow stretches); their quartiles and
geometric mean with its 95% interval (normal on the logarithms, pairs independent)."""

from __future__ import annotations

import dataclasses
import math
import statistics

from sweeplib.bench import first_tokens_s


@dataclasses.dataclass(frozen=True)
class Wave:
    config: str
    ttfts_ms: tuple[float, ...]
    output_tokens: int
    wall_s: float
    failed: int

    @property
    def median_ttft_ms(self) -> float:
        return statistics.median(self.ttfts_ms) if self.ttfts_ms else float("nan")

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.wall_s


def wave_of_run(run: dict) -> Wave:
    """A run of run.py as one wave: its requests' TTFTs, output tokens and bench_serving durations."""
    m, timed = run["metrics"], [1000 * t for s in run["segments"] for t in first_tokens_s(s["requests"]) if t is not None]
    return Wave(run["config"], tuple(timed), m["total_output_tokens"], m["duration"], m["requests"] - m["completed"])


def quartiles(values: list[float]) -> tuple[float, float, float]:
    return tuple(statistics.quantiles(values, n=4)) if len(values) > 1 else (values[0],) * 3


def geometric_mean_interval(ratios: list[float]) -> tuple[float, float, float]:
    """(low, geometric mean, high): the 95% confidence interval of the mean log-ratio."""
    logs = [math.log(ratio) for ratio in ratios]
    centre = statistics.fmean(logs)
    if len(logs) < 2:
        return (math.exp(centre),) * 3
    half_width = statistics.NormalDist().inv_cdf(0.975) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(centre - half_width), math.exp(centre), math.exp(centre + half_width)


def pair_summary(pairs: list[dict[str, Wave]], first: str, other: str) -> dict:
    """The other configuration over the first, pair by pair, for the pairs where no request failed."""
    complete = [pair for pair in pairs if not pair[first].failed and not pair[other].failed]
    if not complete:
        return {"pairs": 0}
    ttft = [pair[other].median_ttft_ms / pair[first].median_ttft_ms for pair in complete]
    throughput = [pair[other].throughput / pair[first].throughput for pair in complete]
    return {
        "pairs": len(complete), "pairs_other_ttft_lower": sum(ratio < 1 for ratio in ttft),
        "median_ttft_ratio_quartiles": quartiles(ttft), "throughput_ratio_quartiles": quartiles(throughput),
        "ttft_ratio_geometric_mean_ci95": geometric_mean_interval(ttft),
        "throughput_ratio_geometric_mean_ci95": geometric_mean_interval(throughput),
        **{key: {name: statistics.median(getattr(pair[name], field) for pair in complete) for name in (first, other)}
           for key, field in (("median_ttft_ms", "median_ttft_ms"), ("median_throughput", "throughput"))},
    }


def summarise(measured: list[dict], first: str, other: str) -> list[dict]:
    """Per workload (per concurrency in the former paired.py's files), in the order measured."""
    key = lambda item: item.get("workload", item["concurrency"])  # noqa: E731
    return [{"workload" if isinstance(label, str) else "concurrency": label, "summary": pair_summary(
        [{name: Wave(**{**wave, "ttfts_ms": tuple(wave["ttfts_ms"])}) for name, wave in item["waves"].items()}
         for item in measured if key(item) == label], first, other)}
        for label in dict.fromkeys(map(key, measured))]


def pair_table(rows: list[tuple[object, dict]], first: str, other: str, label: str) -> list[str]:
    """One row per (workload or concurrency, pair_summary)."""
    lines = [f"Per pair: {other}'s value over {first}'s; quartiles over the pairs (25% / median / 75%), "
             "geometric mean over the pairs [its 95% confidence interval].", "",
             f"| {label} | pairs | median TTFT ratio | TTFT ratio, geometric mean | output throughput ratio "
             f"| throughput ratio, geometric mean | pairs with {other}'s TTFT lower "
             f"| median TTFT, ms ({first} / {other}) | output tok/s ({first} / {other}) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key, summary in rows:
        if not summary["pairs"]:
            lines.append(f"| {key} | 0 |" + " n/a |" * 7)
            continue
        ms, tps = summary["median_ttft_ms"], summary["median_throughput"]
        ratios = [" / ".join(f"{value:.3f}" for value in summary[f"{quartiles}_ratio_quartiles"])
                  + " | {1:.3f} [{0:.3f}, {2:.3f}]".format(*summary[f"{name}_ratio_geometric_mean_ci95"])
                  for quartiles, name in (("median_ttft", "ttft"), ("throughput", "throughput"))]
        lines.append(f"| {key} | {summary['pairs']} | {' | '.join(ratios)} | {summary['pairs_other_ttft_lower']} | "
                     f"{ms[first]:.1f} / {ms[other]:.1f} | {tps[first]:.0f} / {tps[other]:.0f} |")
    return lines


def round_pairs(runs: list[dict], first: str, other: str) -> list[tuple[str, dict]]:
    """Per workload (in the order run): the pairs of its rounds in which both configurations ran."""
    rows = []
    for workload in dict.fromkeys(run["workload"] for run in runs):
        by_round: dict[int, dict[str, Wave]] = {}
        for run in (r for r in runs if r["workload"] == workload and r["config"] in (first, other) and r["segments"]):
            by_round.setdefault(run["round"], {})[run["config"]] = wave_of_run(run)
        rows.append((workload, pair_summary([p for p in by_round.values() if len(p) == 2], first, other)))
    return rows


def report_markdown(document: dict) -> str:
    """The report of the former paired.py's files."""
    source = document["sources"][0]
    first, other = source["settings"]["configs"].split(",")
    document["summary"] = summarise(document["pairs"], first, other)
    label = "workload" if any("workload" in row for row in document["summary"]) else "requests"
    return "\n".join([f"# {other} against {first}: the same prompts, wave by wave", "",
                      f"`{source['command_line']}`, {source['created']}, {source['gpu']}.", "",
                      *pair_table([(row.get("workload", row.get("concurrency")), row["summary"])
                                   for row in document["summary"]], first, other, label)]) + "\n"
