#!/usr/bin/env python3
"""Profile the GPU kernels of a few forward steps of each configuration under the same load.

For each configuration: start its server (the benchmark's command line, with
``SGLANG_LOG_FORWARD_ITERS=1`` so that its batch lines carry their forward step), keep
``--concurrency`` requests of random token ids running, and after ``--warmup-s`` ask sglang's
``/start_profile`` for a GPU trace of ``--profile-steps`` scheduler forward steps from a step
``START_LEAD_STEPS`` past the latest one logged; then summarise every trace
(``kernel_profile.py`` beside this file) into ``profile.md``: GPU busy time, idle share, and the top
kernels per prompt token. A diagnostic, not a benchmark: it answers where GPU time goes, e.g.

    python3 tools/profile_kernels.py --model-path M --draft-model-path D --load-format dummy \\
        --configs plain,dynamic --input-len 1024 --output-len 2 --concurrency 64 --out DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shlex
import sys
import threading
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

import kernel_profile  # noqa: E402
from sweeplib import configs, server  # noqa: E402  (the benchmark's server commands and lifecycle)

logger = logging.getLogger("profile_kernels")

TRACE_WAIT_S = 180.0
REQUEST_TIMEOUT_S = 600.0
# Steps between the latest forward step in the log and the first profiled one: enough for the
# request to reach the scheduler before that step is launched.
START_LEAD_STEPS = 20
FORWARD_ITERS_ENV = {"SGLANG_LOG_FORWARD_ITERS": "1"}
LOG_TAIL_LINES = 60


class RequestLoad:
    """``concurrency`` threads that each send one greedy request after another until stopped."""

    def __init__(self, base_url: str, concurrency: int, input_len: int, output_len: int, seed: int) -> None:
        self._url, self._input_len, self._output_len = base_url + "/generate", input_len, output_len
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(seed + i,), daemon=True)
                         for i in range(concurrency)]
        self.completed = self.failed = 0

    def _loop(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self._stop.is_set():
            try:
                post_json(self._url, {
                    "input_ids": [rng.randrange(3, 8000) for _ in range(self._input_len)],
                    "sampling_params": {"temperature": 0.0, "max_new_tokens": self._output_len, "ignore_eos": True},
                }, REQUEST_TIMEOUT_S)
                self.completed += 1
            except OSError:
                self.failed += 1
                if not self._stop.is_set():
                    time.sleep(1.0)

    def __enter__(self) -> RequestLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=REQUEST_TIMEOUT_S)


def post_json(url: str, body: dict, timeout_s: float) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        response.read()


def start_profile(base_url: str, trace_dir: Path, profile_id: str, first_iter: int,
                  steps: int) -> Path:
    """Ask for a GPU trace of forward steps ``first_iter`` .. ``first_iter + steps - 1`` (sglang
    answers at once and traces when the scheduler reaches them); the path it will be written to."""
    trace = trace_dir / f"{profile_id}-TP-0.trace.json.gz"
    trace.unlink(missing_ok=True)  # a trace of an earlier run must not pass for this one
    post_json(base_url + "/start_profile", {
        "output_dir": str(trace_dir), "start_step": first_iter, "num_steps": steps, "activities": ["GPU"],
        "profile_id": profile_id, "with_stack": False, "record_shapes": False}, 60)
    return trace


def wait_for_trace(path: Path, timeout_s: float) -> None:
    """The trace is complete once its size stops changing (sglang writes it after the window)."""
    deadline = time.monotonic() + timeout_s
    last_size = -1
    while time.monotonic() < deadline:
        size = path.stat().st_size if path.exists() else -1
        if size > 0 and size == last_size:
            return
        last_size = size
        time.sleep(2.0)
    raise TimeoutError(f"no complete trace at {path} after {timeout_s:.0f} s")


def profile_config(config: str, setup: configs.ServerSetup, env: dict[str, str],
                   args: argparse.Namespace, out_dir: Path) -> kernel_profile.KernelSummary:
    base_url = server.base_url_of(setup.host, setup.port)
    log_path = out_dir / f"server_{config}.log"
    running = server.start_server(config, configs.server_command(config, setup),
                                  {**env, **FORWARD_ITERS_ENV}, log_path, base_url)
    try:
        server.wait_until_healthy(running, args.server_timeout_s, LOG_TAIL_LINES)
        with RequestLoad(base_url, args.concurrency, args.input_len, args.output_len,
                         args.seed) as load:
            time.sleep(args.warmup_s)
            log_lines = log_path.read_text(errors="replace").splitlines()
            first_iter = kernel_profile.latest_forward_iter(log_lines) + START_LEAD_STEPS
            trace = start_profile(base_url, out_dir / "traces", config, first_iter,
                                  args.profile_steps)
            wait_for_trace(trace, TRACE_WAIT_S)
        logger.info("[%s] trace %s of steps %d-%d; %d requests completed, %d failed", config,
                    trace, first_iter, first_iter + args.profile_steps - 1, load.completed,
                    load.failed)
        return kernel_profile.summarise_trace(trace, log_path, first_iter, args.profile_steps)
    finally:
        server.stop_server(running)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    configs.add_server_arguments(parser)
    parser.set_defaults(configs="plain,dynamic", server_timeout_s=600.0)
    for flag, kwargs in (
        ("--input-len", dict(type=int, default=1024)), ("--output-len", dict(type=int, default=2)),
        ("--concurrency", dict(type=int, default=64)),
        ("--warmup-s", dict(type=float, default=20.0, help="seconds of load before the profiled window")),
        ("--profile-steps", dict(type=int, default=40, help="scheduler forward steps in the profiled window")),
        ("--seed", dict(type=int, default=0)), ("--out", dict(required=True)),
    ):
        parser.add_argument(flag, **kwargs)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args = build_parser().parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = configs.parse_config_list(args.configs)
    setup = configs.server_setup(args, out_dir)
    env = configs.parse_env_assignments(args.server_env)
    summaries = {config: profile_config(config, setup, env, args, out_dir) for config in names}
    command = shlex.join([sys.executable] + sys.argv)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    (out_dir / "profile.md").write_text(
        f"# Kernel profile\n\n- {started}\n- `{command}`\n\n"
        + kernel_profile.comparison_markdown(summaries))
    (out_dir / "summaries.json").write_text(json.dumps(
        {config: vars(summary) for config, summary in summaries.items()}, indent=1))
    print((out_dir / "profile.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
