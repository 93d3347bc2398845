#!/usr/bin/env python3
"""Run sglang.bench_serving's command line once per (concurrency, prompts) pair, in one process.

Importing sglang.bench_serving (torch, transformers, sglang.srt) took about 25 s on the GPU
machine, so the sweep pays it once per configuration instead of once per concurrency (and
not again for its warm-up wave). The runs come in groups, each with its own bench_serving
flags (the warm-up wave has a shorter output and its own output file). Each pair is a complete
bench_serving run (its own warmup, cache flush and result line), with one change: the
`--flush-cache` request after the warmup asks the server to wait until it is idle
(`/flush_cache?timeout=...`). bench_serving's own request has no timeout, and sglang refuses a
flush (HTTP 400, which fails the run) unless the scheduler is fully idle, and under the overlap
scheduler a finished request stays in its last batch for one more step (read from
Scheduler.is_fully_idle in sglang 0.5.17; the race itself has not been observed). Right after
that flush, that is after bench_serving's own warm-up request, the driver appends the server's
`/server_info` to `<output file>.after_warmup.jsonl` as `{"max_concurrency": C, "server_info":
...}`, so that a run's counters can be read from its measured requests alone.

    python bench_driver.py 1:8 4:12 -- <bench_serving flags without --max-concurrency/--num-prompts> \
        [--next-group 1:8 4:12 -- <flags> ...]
"""

from __future__ import annotations

import json
import sys
import traceback

FLUSH_WAIT_S = 30.0
GROUP_SEPARATOR = "--next-group"
AFTER_WARMUP_SUFFIX = ".after_warmup.jsonl"
# The run in progress: where its after-warm-up snapshot goes, and its concurrency.
_current_run: dict = {}


def after_warmup_file(output_file: str) -> str:
    return output_file + AFTER_WARMUP_SUFFIX


def output_file_of(bench_flags: list[str]) -> str | None:
    return bench_flags[bench_flags.index("--output-file") + 1] if "--output-file" in bench_flags else None


def parse_runs(tokens: list[str]) -> list[tuple[int, int]]:
    runs = []
    for token in tokens:
        concurrency, _, prompts = token.partition(":")
        runs.append((int(concurrency), int(prompts)))
    return runs


def parse_groups(argv: list[str]) -> list[tuple[list[tuple[int, int]], list[str]]]:
    """(runs, bench_serving flags) of each group of the command line, in order."""
    groups: list[list[str]] = [[]]
    for token in argv:
        if token == GROUP_SEPARATOR:
            groups.append([])
        else:
            groups[-1].append(token)
    parsed = []
    for group in groups:
        separator = group.index("--")
        parsed.append((parse_runs(group[:separator]), group[separator + 1:]))
    return parsed


def flush_when_idle(base_url: str, backend: str) -> None:
    """Stand-in for bench_serving's flush_server_cache (sglang backends only), which then
    records the server's state after the warm-up."""
    import requests

    response = requests.post(f"{base_url}/flush_cache", params={"timeout": FLUSH_WAIT_S},
                             timeout=FLUSH_WAIT_S + 10)
    response.raise_for_status()
    record_after_warmup(base_url, requests)


def record_after_warmup(base_url: str, requests) -> None:
    """Append the run's after-warm-up snapshot; a failed fetch only leaves it out."""
    snapshot_file = _current_run.get("snapshot_file")
    if snapshot_file is None:
        return
    try:
        info = requests.get(f"{base_url}/server_info", timeout=30).json()
    except (requests.RequestException, ValueError):
        return
    with open(snapshot_file, "a") as out:
        out.write(json.dumps({"max_concurrency": _current_run["concurrency"], "server_info": info}) + "\n")


def main(argv: list[str]) -> int:
    groups = parse_groups(argv)
    from sglang.benchmark import serving  # what `python -m sglang.bench_serving` runs

    serving.flush_server_cache = flush_when_idle
    failures = 0
    for concurrency, prompts, bench_flags in (
        (c, n, flags) for runs, flags in groups for c, n in runs
    ):
        sys.argv = ["sglang.bench_serving", *bench_flags,
                    "--max-concurrency", str(concurrency), "--num-prompts", str(prompts)]
        output_file = output_file_of(bench_flags)
        _current_run.update(concurrency=concurrency,
                            snapshot_file=after_warmup_file(output_file) if output_file else None)
        print(f"bench_driver: concurrency {concurrency}, {prompts} prompts", flush=True)
        try:
            serving.cli_main()
        except (Exception, SystemExit):  # bench_serving sys.exit()s on some errors; one failed run must not stop the others
            failures += 1
            traceback.print_exc()
            print(f"bench_driver: concurrency {concurrency} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
