#!/usr/bin/env python3
"""Run `python -m sglang.bench_serving FLAGS` once per stdin line {"flags", "visible_special_tokens"}
in one process (its import takes ~25 s on the GPU machine); answer each with a stdout line {"ok",
"error", "after_warmup"}. `--flush-cache` waits until the server is idle, freezes its GC (a 540-600
ms collection otherwise hit some runs) and reads `/server_info`. `visible_special_tokens`: every
request with skip_special_tokens=False, so that tokens without text still stamp the first token
(`--extra-request-body` would replace each request's own `max_new_tokens`); benchmark/README.md."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import traceback

FLUSH_WAIT_S = 30.0
_after_warmup: dict = {}


def with_visible_special_tokens(serving, request_func):
    """The request function, sending bench_serving's sampling parameters plus skip_special_tokens=False."""
    async def request(request_func_input, pbar=None):
        args = serving.args
        params = {"temperature": args.temperature, "max_new_tokens": request_func_input.output_len,
                  "ignore_eos": not args.disable_ignore_eos, "skip_special_tokens": False,
                  **({"top_p": args.top_p} if args.top_p < 1.0 else {})}
        extra = {**request_func_input.extra_request_body, "sampling_params": params}
        return await request_func(dataclasses.replace(request_func_input, extra_request_body=extra), pbar)

    return request


def flush_when_idle(base_url: str, backend: str) -> None:
    """Stand-in for bench_serving's flush_server_cache (sglang backends only): flush once idle,
    freeze the GC, keep the server info (a failed fetch only leaves it out)."""
    import requests

    requests.post(f"{base_url}/flush_cache", params={"timeout": FLUSH_WAIT_S},
                  timeout=FLUSH_WAIT_S + 10).raise_for_status()
    requests.post(f"{base_url}/freeze_gc", timeout=FLUSH_WAIT_S).raise_for_status()
    try:
        _after_warmup["info"] = requests.get(f"{base_url}/server_info", timeout=30).json()
    except (requests.RequestException, ValueError):
        pass


def run_one(serving, request: dict) -> dict:
    """One run, as `python -m sglang.bench_serving FLAGS` makes it (its cli_main)."""
    _after_warmup.clear()
    original, argv = serving.ASYNC_REQUEST_FUNCS["sglang"], sys.argv
    if request.get("visible_special_tokens"):
        serving.ASYNC_REQUEST_FUNCS["sglang"] = with_visible_special_tokens(serving, original)
    sys.argv = ["bench_serving", *request["flags"]]
    try:
        serving.cli_main()
        error = None
    except (Exception, SystemExit):  # bench_serving sys.exit()s on some errors; go on
        error = traceback.format_exc()
        print(error, file=sys.stderr, flush=True)
    finally:
        serving.ASYNC_REQUEST_FUNCS["sglang"], sys.argv = original, argv
    return {"ok": error is None, "error": error, "after_warmup": _after_warmup.get("info")}


def main(lines=None, out=None) -> int:
    if out is None:  # the driver process: answers on stdout, whatever else is printed (C code too) to stderr
        out = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
    from sglang.benchmark import serving  # what `python -m sglang.bench_serving` runs

    serving.flush_server_cache = flush_when_idle
    for line in lines if lines is not None else sys.stdin:
        if line.strip():
            out.write(json.dumps(run_one(serving, json.loads(line))) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
