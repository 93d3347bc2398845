"""A stand-in for ``python -m sglang.launch_server`` that the kernel profiler can drive on CPU.

It serves ``/health``, ``/generate`` (a short sleep per request) and ``/start_profile`` (with
``start_step`` and ``num_steps``), counts "forward steps" on a timer, prints sglang-style batch
lines with ``[iter]`` (every step a prefill of ``TOKENS_PER_STEP`` tokens), and writes a gzipped
Chrome trace with one 10 us kernel per profiled step, the way sglang's profiler does.
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from json_http import JsonHandler, port_argument

STEP_S = 0.02
TOKENS_PER_STEP = 1000
KERNEL_US = 10.0


class Scheduler:
    def __init__(self) -> None:
        self.forward_ct = 0
        self.profile: dict | None = None
        self.lock = threading.Lock()

    def run(self) -> None:
        while True:
            time.sleep(STEP_S)
            with self.lock:
                self.forward_ct += 1
                step = self.forward_ct
                self._maybe_write_trace(step)
            print(f"[t] Prefill batch [{step}], #new-seq: 1, #new-token: {TOKENS_PER_STEP}, "
                  "#cached-token: 0", flush=True)

    def _maybe_write_trace(self, step: int) -> None:
        profile = self.profile
        if profile is None or step < profile["start_step"] + profile["num_steps"]:
            return
        events = [{"ph": "X", "cat": "kernel", "name": "fake_gemm", "ts": 100.0 * i,
                   "dur": KERNEL_US} for i in range(profile["num_steps"])]
        out = Path(profile["output_dir"])
        out.mkdir(parents=True, exist_ok=True)
        with gzip.open(out / f"{profile['profile_id']}-TP-0.trace.json.gz", "wt") as trace:
            json.dump({"traceEvents": events}, trace)
        print("[t] Profiling done. Traces are saved to: " + str(out), flush=True)
        self.profile = None


SCHEDULER = Scheduler()


class Handler(JsonHandler):
    def do_GET(self) -> None:
        self.reply({"ok": True})

    def do_POST(self) -> None:
        body = self.read_json()
        if self.path == "/start_profile":
            with SCHEDULER.lock:
                SCHEDULER.profile = body
            self.reply({"success": True})
        else:
            time.sleep(0.01)
            self.reply({"output_ids": [1]})


def main() -> None:
    port = port_argument()
    threading.Thread(target=SCHEDULER.run, daemon=True).start()
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    sys.exit(main())
