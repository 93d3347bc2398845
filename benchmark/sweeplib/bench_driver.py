#!/usr/bin/env python3
"""Run sglang.bench_serving once per (concurrency, prompts) pair, in one process:

    python bench_driver.py 1:8 4:12 -- <bench_serving flags> [--next-group 1:8 -- <flags> ...]

Importing bench_serving took about 25 s on the GPU machine: one process per configuration pays
it once. Each pair is a complete `run_benchmark` call with the namespace bench_serving's own
parser makes of the group's flags plus --max-concurrency and --num-prompts. Its `--flush-cache`
request waits until the server is idle (`/flush_cache?timeout=`): sglang refuses a flush (HTTP
400, failing the run) while a finished request is still in the overlap scheduler's last batch
(Scheduler.is_fully_idle in sglang 0.5.17; read, not observed). After that flush the driver
freezes the server's garbage collector (sglang's `/freeze_gc`: the tokenizer manager's and the
scheduler's tracked objects move to the permanent generation), then appends
`{"max_concurrency": C, "server_info": ...}` to `<output file>.after_warmup.jsonl`.

Without the freeze, a generation-2 collection over a server's start-up heap lands in some
measured runs and not others: 540-600 ms in the tokenizer manager of a plain and of an
EAGLE3_DYNAMIC server alike, each time at the start of a run whose first request then waited
about as long for its first token (one H200, 8B-shaped model, 2026-12-03). sglang's own log
advises the freeze after warm-up requests; every configuration gets it, before every run.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

FLUSH_WAIT_S = 30.0
GROUP_SEPARATOR = "--next-group"
AFTER_WARMUP_SUFFIX = ".after_warmup.jsonl"
_current_run: dict = {}  # the after-warm-up snapshot file and concurrency of the run in progress


def after_warmup_file(output_file: str) -> str:
    return output_file + AFTER_WARMUP_SUFFIX


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
        runs = [tuple(int(part) for part in token.split(":")) for token in group[:separator]]
        parsed.append((runs, group[separator + 1:]))
    return parsed


def bench_serving_parser(serving) -> argparse.ArgumentParser:
    """The parser bench_serving's `cli_main` builds, taken just before it would read sys.argv."""

    class Built(Exception):
        pass

    class Parser(argparse.ArgumentParser):
        def parse_args(self, *args, **kwargs):
            raise Built(self)

    original, serving.ArgumentParser = serving.ArgumentParser, Parser
    try:
        serving.cli_main()
    except Built as built:
        parser = built.args[0]
        parser.__class__ = argparse.ArgumentParser
        return parser
    finally:
        serving.ArgumentParser = original
    raise RuntimeError("bench_serving's cli_main did not parse arguments")


def freeze_gc(base_url: str) -> None:
    """sglang's ``/freeze_gc``: the server's tracked objects move to the permanent generation."""
    import requests

    requests.post(f"{base_url}/freeze_gc", timeout=FLUSH_WAIT_S).raise_for_status()


def flush_when_idle(base_url: str, backend: str) -> None:
    """Stand-in for bench_serving's flush_server_cache (sglang backends only), which then
    freezes the server's GC and appends the run's after-warm-up snapshot; a failed snapshot
    fetch only leaves it out."""
    import requests

    requests.post(f"{base_url}/flush_cache", params={"timeout": FLUSH_WAIT_S},
                  timeout=FLUSH_WAIT_S + 10).raise_for_status()
    freeze_gc(base_url)
    if _current_run.get("snapshot_file") is None:
        return
    try:
        info = requests.get(f"{base_url}/server_info", timeout=30).json()
    except (requests.RequestException, ValueError):
        return
    with open(_current_run["snapshot_file"], "a") as out:
        out.write(json.dumps({"max_concurrency": _current_run["concurrency"], "server_info": info}) + "\n")


def main(argv: list[str]) -> int:
    groups = parse_groups(argv)
    from sglang.benchmark import serving  # what `python -m sglang.bench_serving` runs

    parser = bench_serving_parser(serving)
    serving.flush_server_cache = flush_when_idle
    failures = 0
    for runs, flags in groups:
        for concurrency, prompts in runs:
            print(f"bench_driver: concurrency {concurrency}, {prompts} prompts", flush=True)
            try:
                args = parser.parse_args(
                    [*flags, "--max-concurrency", str(concurrency), "--num-prompts", str(prompts)])
                serving._validate_parsed_gsp_args(parser, args)  # as cli_main does
                _current_run.update(concurrency=concurrency, snapshot_file=args.output_file and
                                    after_warmup_file(args.output_file))
                serving.run_benchmark(args)
            except (Exception, SystemExit):  # bench_serving sys.exit()s on some errors; go on
                failures += 1
                traceback.print_exc()
                print(f"bench_driver: concurrency {concurrency} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
