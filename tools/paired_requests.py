#!/usr/bin/env python3
"""First tokens of two configurations compared request by request, in runs that sent both the
same requests (``benchmark/run.py`` rounds: one seed per round, so request i of a round is the
same prompt and arrival for both). A ratio of medians or of p99s mixes requests; this gives each
request's own ratio, and lists the requests where the second configuration was slower by
``--factor`` or more, with their neighbours grouped: a cluster of consecutive arrivals slowed
together points at one event on that server (a pause, a compile), one request at its own work.
Then, pooled over the rounds, the ratios of the median and p99 TTFT with a rough 90% interval
from a circular block bootstrap over the paired requests (blocks of ``BLOCK`` consecutive
arrivals, so a cluster stays one draw): how far a p99 of a few hundred requests can be trusted,
and the bootstrap's median, steadier where a percentile sits on a step of the TTFT curve.

    python3 tools/paired_requests.py benchmark/results/<folder>/pin/results.json.xz plain dynamic [--workload poisson-10@20] [--factor 2]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib.bench import first_tokens_s, percentile  # noqa: E402
from sweeplib.results import load_results  # noqa: E402


LISTED = 8  # clusters listed per round
BLOCK = 10  # consecutive arrivals resampled together: at 10 req/s, a second of traffic
DRAWS = 2000


def ttfts_by_round(document: dict, config: str, workload: str) -> Dict[int, List[float]]:
    """Milliseconds to the first token of each request, per round; None where it failed or has no
    first-token time (``first_tokens_s``)."""
    out = {}
    for run in document["runs"]:
        if run["config"] == config and run["workload"] == workload and run.get("segments"):
            if run["round"] in out:
                raise ValueError(f"{config} {workload}: two runs of round {run['round']}")
            out[run["round"]] = [None if t is None else 1000 * t for s in run["segments"]
                                 for t in first_tokens_s(s["requests"])]
    return out


def slow_clusters(first: Sequence[float], other: Sequence[float], factor: float
                  ) -> List[List[Tuple[int, float, float]]]:
    """Runs of request indices where ``other`` took ``factor`` times ``first`` or more, two such
    requests with one other between them joined: [(index, other ms, first ms), ...] per cluster."""
    slow = [i for i, (a, b) in enumerate(zip(first, other)) if a and b and b >= factor * a]
    clusters: List[List[Tuple[int, float, float]]] = []
    for i in slow:
        if clusters and i - clusters[-1][-1][0] <= 2:
            clusters[-1].append((i, other[i], first[i]))
        else:
            clusters.append([(i, other[i], first[i])])
    return clusters


def paired_rounds(a: Dict[int, List[float]], b: Dict[int, List[float]]) -> List[List[Tuple[float, float]]]:
    """Per round both answered (same requests), the (first, other) TTFTs of requests both
    answered; rounds with none left out."""
    rounds = [[(p, q) for p, q in zip(a[r], b[r]) if p is not None and q is not None]
              for r in sorted(set(a) & set(b)) if len(a[r]) == len(b[r])]
    return [pairs for pairs in rounds if pairs]


def percentile_ratio(pairs: List[Tuple[float, float]], q: float) -> float:
    """The ``q``-th percentile of the other configuration's TTFTs over the first's."""
    return percentile([y for _, y in pairs], q) / percentile([x for x, _ in pairs], q)


def bootstrap_ratios(rounds: List[List[Tuple[float, float]]], q: float, draws: int = DRAWS,
                     block: int = BLOCK, seed: int = 0) -> List[float]:
    """``percentile_ratio`` of ``draws`` resamples: each round's pairs redrawn, round by round,
    in blocks of ``block`` consecutive requests wrapping around the round's end (a circular
    block bootstrap: every request equally likely, a clustered slowdown one draw)."""
    rng = random.Random(seed)
    samples = []
    for _ in range(draws):
        pooled: List[Tuple[float, float]] = []
        for pairs in rounds:
            n = len(pairs)
            starts = [rng.randrange(n) for _ in range(math.ceil(n / block))]
            pooled += [pairs[(s + k) % n] for s in starts for k in range(block)][:n]
        samples.append(percentile_ratio(pooled, q))
    return samples


def ratio_summary(rounds: List[List[Tuple[float, float]]], q: float, draws: int = DRAWS,
                  block: int = BLOCK, seed: int = 0) -> Tuple[float, float, float, float]:
    """The pooled ratio of the ``q``-th percentiles, then the median, 5th and 95th percentiles of
    its bootstrap (``bootstrap_ratios``): the last two a rough 90% interval (its ends move by a
    few hundredths with the seed at 2,000 draws). Where a percentile sits on a step of either
    TTFT curve (a queue's ramp), the pooled ratio can fall outside the interval; the bootstrap's
    median is then the steadier reading."""
    samples = bootstrap_ratios(rounds, q, draws, block, seed)
    pooled = [pair for pairs in rounds for pair in pairs]
    return (percentile_ratio(pooled, q), percentile(samples, 50), percentile(samples, 5),
            percentile(samples, 95))


def _summary_text(name: str, point: float, median: float, low: float, high: float) -> str:
    text = f"{name} {point:.3f} [{low:.3f}, {high:.3f}], bootstrap median {median:.3f}"
    if not low <= point <= high:
        text += " (the ratio lies outside its interval: a step in the TTFT curve; read the median)"
    return text


def _cluster_text(cluster: List[Tuple[int, float, float]], shown: int = 4) -> str:
    """A cluster's requests (index: other ms / first ms); a long one's first few and its span."""
    text = ", ".join(f"{i}: {q:.0f} / {p:.0f}" for i, q, p in cluster[:shown])
    if len(cluster) > shown:
        text += f" ... {len(cluster)} requests to {cluster[-1][0]}"
    return text


def report(document: dict, first: str, other: str, workload: str, factor: float) -> str:
    a, b = ttfts_by_round(document, first, workload), ttfts_by_round(document, other, workload)
    lines = [f"{other} over {first}, {workload}, request by request (TTFT ms):", ""]
    for round_index in sorted(set(a) & set(b)):
        x, y = a[round_index], b[round_index]
        if len(x) != len(y):
            lines.append(f"round {round_index}: {len(x)} against {len(y)} requests, not the same requests")
            continue
        ratios = [q / p for p, q in zip(x, y) if p and q]
        if not ratios:
            lines.append(f"round {round_index}: no request answered by both")
            continue
        clusters = slow_clusters(x, y, factor)
        slow = sum(len(c) for c in clusters)
        text = "; ".join(map(_cluster_text, clusters[:LISTED])) or "none"
        more = f"; {len(clusters) - LISTED} more clusters" if len(clusters) > LISTED else ""
        lines.append(f"round {round_index}: median ratio {statistics.median(ratios):.3f} over {len(ratios)} "
                     f"requests; {slow} {factor:g}x or slower ({other} / {first}): {text}{more}")
    rounds = paired_rounds(a, b)
    if rounds:
        text = "; ".join(_summary_text(name, *ratio_summary(rounds, q)) for name, q in (("p50", 50), ("p99", 99)))
        lines += ["", f"pooled over {len(rounds)} round(s), {sum(map(len, rounds))} requests, TTFT ratio "
                  f"({other} / {first}) with a rough 90% circular block-bootstrap interval: {text}"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("first")
    parser.add_argument("other")
    parser.add_argument("--workload", default=None, help="default: every workload both ran")
    parser.add_argument("--factor", type=float, default=2.0)
    args = parser.parse_args(argv)
    document = load_results(args.results)
    workloads = [args.workload] if args.workload else sorted(
        {r["workload"] for r in document["runs"] if r["config"] == args.first}
        & {r["workload"] for r in document["runs"] if r["config"] == args.other})
    for workload in workloads:
        print(report(document, args.first, args.other, workload, args.factor))
    return 0


if __name__ == "__main__":
    sys.exit(main())
