#!/usr/bin/env python3
"""Two configurations served at once, the same prompts sent to each in turn, wave by wave:

    python benchmark/paired.py --model-path M --draft-model-path D --configs eagle3,dynamic \\
        --concurrencies 4,1 --input-len 512 --output-len 64 --pairs 40 --out DIR [options]

At low concurrency a run of ``interleaved.py`` lasts seconds, and the host of the GPU machine ran
the same kernel launches up to 1.6x slower for stretches of seconds (one H200, 2026-12-03,
``results/2026-12-03-h200-dummy8b-ttft-1-4-phases-draft-layer-choice/``): one server's median
TTFT moved by up to 50% from run to run, more than the differences sought there. Here each
*pair* is one wave of ``concurrency`` fresh prompts (random token ids) sent to the first
configuration and, as soon as it has finished, the same wave to the second (the order flips
every pair), so the two waves of a pair run a fraction of a second apart, under the same host.
Each pair gives the second configuration's median TTFT and output throughput (the wave's output
tokens over its wall time) over the first's; the report gives the median of those ratios over
the pairs and their quartiles, which a few slow stretches cannot move, and the geometric mean of
the ratios with its 95% confidence interval (normal on the logarithms, pairs taken as
independent), which says whether a difference was measured at all. Requests are sglang's
own (``sglang.benchmark.serving.async_request_sglang_generate``, as bench_serving sends them);
servers start as ``interleaved.py`` starts them, and every server's GC is frozen after the
``--warmup-pairs``. ``--report-from DIR`` summarises a saved run again, without servers.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable, Sequence

import interleaved
from sweeplib import bench, bench_driver, configs, results, server

logger = logging.getLogger("paired")

RESULTS_FILE = "results.json"
REPORT_FILE = "report.md"
TOKEN_ID_RANGE = (3, 8000)  # clear of the tokenizers' special ids, inside every vocabulary used here
RequestFn = Callable[[str, list[int], int], Awaitable["WaveRequest"]]


@dataclasses.dataclass(frozen=True)
class WaveRequest:
    ok: bool
    ttft_ms: float
    output_tokens: int


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


def wave_prompts(seed: int, concurrency: int, pair: int, count: int, input_len: int) -> list[list[int]]:
    """Fresh random token ids for one pair: both configurations get the same, no pair repeats."""
    rng = random.Random(f"{seed}:{concurrency}:{pair}")
    return [[rng.randrange(*TOKEN_ID_RANGE) for _ in range(input_len)] for _ in range(count)]


def pair_order(names: Sequence[str], pair: int) -> list[str]:
    return list(names) if pair % 2 == 0 else list(reversed(names))


async def run_wave(config: str, url: str, prompts: list[list[int]], output_len: int,
                   request: RequestFn) -> Wave:
    started = time.perf_counter()
    done = await asyncio.gather(*(request(url, prompt, output_len) for prompt in prompts))
    wall_s = time.perf_counter() - started
    ok = [item for item in done if item.ok]
    return Wave(config, tuple(item.ttft_ms for item in ok), sum(item.output_tokens for item in ok),
                wall_s, len(done) - len(ok))


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return (values[0],) * 3
    low, middle, high = statistics.quantiles(values, n=4)
    return low, middle, high


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
    ttft = [pair[other].median_ttft_ms / pair[first].median_ttft_ms for pair in complete]
    throughput = [pair[other].throughput / pair[first].throughput for pair in complete]
    if not complete:
        return {"pairs": 0}
    return {
        "pairs": len(complete),
        "median_ttft_ratio_quartiles": quartiles(ttft),
        "throughput_ratio_quartiles": quartiles(throughput),
        "ttft_ratio_geometric_mean_ci95": geometric_mean_interval(ttft),
        "throughput_ratio_geometric_mean_ci95": geometric_mean_interval(throughput),
        "pairs_other_ttft_lower": sum(ratio < 1 for ratio in ttft),
        "median_ttft_ms": {name: statistics.median(pair[name].median_ttft_ms for pair in complete)
                           for name in (first, other)},
        "median_throughput": {name: statistics.median(pair[name].throughput for pair in complete)
                              for name in (first, other)},
    }


def interval_text(interval: Sequence[float]) -> str:
    low, centre, high = interval
    return f"{centre:.3f} [{low:.3f}, {high:.3f}]"


def report_markdown(document: dict, first: str, other: str) -> str:
    source = document["sources"][0]
    lines = [f"# {other} against {first}: the same prompts, wave by wave", "",
             f"`{source['command_line']}`, {source['created']}, {source['gpu']}.", "",
             f"Per pair: {other}'s value over {first}'s; quartiles over the pairs (25% / median / 75%), "
             "geometric mean over the pairs [its 95% confidence interval].", "",
             f"| requests | pairs | median TTFT ratio | TTFT ratio, geometric mean | output throughput ratio "
             f"| throughput ratio, geometric mean | pairs with {other}'s TTFT lower "
             f"| median TTFT, ms ({first} / {other}) | output tok/s ({first} / {other}) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in document["summary"]:
        summary = row["summary"]
        if not summary["pairs"]:
            lines.append(f"| {row['concurrency']} | 0 |" + " n/a |" * 7)
            continue
        ttft = " / ".join(f"{value:.3f}" for value in summary["median_ttft_ratio_quartiles"])
        throughput = " / ".join(f"{value:.3f}" for value in summary["throughput_ratio_quartiles"])
        ttft_mean, throughput_mean = (interval_text(summary[key]) for key in (
            "ttft_ratio_geometric_mean_ci95", "throughput_ratio_geometric_mean_ci95"))
        ms, tps = summary["median_ttft_ms"], summary["median_throughput"]
        lines.append(f"| {row['concurrency']} | {summary['pairs']} | {ttft} | {ttft_mean} | {throughput} | "
                     f"{throughput_mean} | "
                     f"{summary['pairs_other_ttft_lower']} | {ms[first]:.1f} / {ms[other]:.1f} | "
                     f"{tps[first]:.0f} / {tps[other]:.0f} |")
    return "\n".join(lines) + "\n"


def sglang_request(visible_special_tokens: bool) -> RequestFn:
    """One streamed /generate request as bench_serving sends it (its module-level arguments are
    the defaults of its command line)."""
    from sglang.benchmark import serving

    serving.args = bench_driver.bench_serving_parser(serving).parse_args(["--backend", "sglang"])

    async def request(url: str, prompt: list[int], output_len: int) -> WaveRequest:
        extra = bench.visible_special_tokens_body(output_len) if visible_special_tokens else {}
        output = await serving.async_request_sglang_generate(serving.RequestFuncInput(
            prompt=prompt, api_url=url + "/generate", prompt_len=len(prompt), output_len=output_len,
            model="", lora_name=None, image_data=None, extra_request_body=extra))
        return WaveRequest(output.success, output.ttft * 1000, output.output_len)

    return request


async def measure(args: argparse.Namespace, names: tuple[str, ...], urls: dict[str, str],
                  request: RequestFn, on_pairs_warm: Callable[[], None]) -> list[dict]:
    """Every concurrency's warm-up pairs, then its measured pairs; the waves of measured pairs."""
    measured = []
    for concurrency in args.concurrencies:
        for pair in range(args.warmup_pairs + args.pairs):
            prompts = wave_prompts(args.seed, concurrency, pair, concurrency, args.input_len)
            waves = {name: await run_wave(name, urls[name], prompts, args.output_len, request)
                     for name in pair_order(names, pair)}
            if pair == args.warmup_pairs - 1:
                on_pairs_warm()
            if pair >= args.warmup_pairs:
                measured.append({"concurrency": concurrency, "pair": pair - args.warmup_pairs,
                                 "waves": {name: dataclasses.asdict(wave) for name, wave in waves.items()}})
                logger.info("c=%d pair %d: %s", concurrency, pair - args.warmup_pairs, ", ".join(
                    f"{name} TTFT {wave.median_ttft_ms:.1f} ms {wave.throughput:.0f} tok/s"
                    for name, wave in waves.items()))
    return measured


def summarise(measured: list[dict], concurrencies: Sequence[int], first: str, other: str) -> list[dict]:
    rows = []
    for concurrency in concurrencies:
        pairs = [{name: Wave(**{**wave, "ttfts_ms": tuple(wave["ttfts_ms"])}) for name, wave in item["waves"].items()}
                 for item in measured if item["concurrency"] == concurrency]
        rows.append({"concurrency": concurrency, "summary": pair_summary(pairs, first, other)})
    return rows


def freeze_gcs(urls: dict[str, str]) -> None:
    for url in urls.values():
        bench_driver.freeze_gc(url)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    configs.add_server_arguments(parser)
    parser.set_defaults(configs="eagle3,dynamic", server_timeout_s=600.0)
    add = parser.add_argument
    add("--out", required=True, help="output folder")
    add("--concurrencies", type=interleaved.concurrency_list, default=[4, 1],
        help="comma-separated, run in the given order (default 4,1)")
    add("--input-len", type=int, default=512)
    add("--output-len", type=int, default=64)
    add("--pairs", type=int, default=40, help="measured pairs per concurrency (default %(default)s)")
    add("--warmup-pairs", type=int, default=2, help="unrecorded pairs per concurrency first (default %(default)s)")
    add("--seed", type=int, default=1)
    add("--max-total-tokens", type=int, help="KV cap of each server (default: as interleaved.py)")
    add("--visible-special-tokens", action="store_true", help="requests with skip_special_tokens=False")
    add("--pin-cpus", action="store_true", help="as interleaved.py's")
    add("--report-from", metavar="DIR", help="summarise the results.json in DIR again and rewrite its report; "
        "starts no server")
    return parser


def write_report(document: dict, out_dir: Path) -> None:
    names = tuple(configs.parse_config_list(document["sources"][0]["settings"]["configs"]))
    document["summary"] = summarise(document["pairs"], document["sources"][0]["settings"]["concurrencies"],
                                    *names)
    results.save_results(document, out_dir / RESULTS_FILE)
    (out_dir / REPORT_FILE).write_text(report_markdown(document, *names))
    print((out_dir / REPORT_FILE).read_text())


def saved_run_to_report(argv: list[str] | None) -> Path | None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--report-from", type=Path)
    return parser.parse_known_args(argv)[0].report_from


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    saved_run = saved_run_to_report(argv)
    if saved_run is not None:
        write_report(results.load_results(saved_run / RESULTS_FILE), saved_run)
        return 0
    args = build_parser().parse_args(argv)
    args.server_env = configs.parse_env_assignments(args.server_env)
    names = tuple(configs.parse_config_list(args.configs))
    if len(names) != 2 or min(args.pairs, args.warmup_pairs) < 1:
        raise SystemExit("--configs names two configurations; --pairs and --warmup-pairs are at least 1")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    args.adaptive_config_path = configs.adaptive_config_path(args, list(names), out_dir)
    workloads = [interleaved.Workload(args.input_len, args.output_len, tuple(args.concurrencies), 1, 1)]
    given = sys.argv[1:] if argv is None else argv
    document = results.new_results_document([sys.executable, sys.argv[0], *given], {
        key: getattr(args, key) for key in ("configs", "concurrencies", "input_len", "output_len", "pairs",
                                             "warmup_pairs", "seed", "server_env")})
    served: list[interleaved.ServedConfig] = []
    with tempfile.TemporaryDirectory() as scratch_name:
        try:
            interleaved.start_servers(args, names, workloads, Path(scratch_name), document, served)
            urls = {entry.config: server.base_url_of(args.host, entry.port) for entry in served}
            document["pairs"] = asyncio.run(measure(
                args, names, urls, sglang_request(args.visible_special_tokens), lambda: freeze_gcs(urls)))
        except server.ServerError as error:
            logger.error("%s", error)
            return 1
        finally:
            for entry in served:
                server.stop_server(entry.running)
    write_report(document, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
