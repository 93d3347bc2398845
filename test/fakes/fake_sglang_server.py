"""A stand-in for ``python -m sglang.launch_server`` that the benchmark (benchmark/run.py) can drive on CPU.

Started with a server's flags, it logs "KV Cache is allocated ... #tokens: N" (N from
--max-total-tokens; twice for a speculative server, like sglang 0.5.17's target and draft pools)
after ``ALLOCATE_S``, answers /health once ``READY_S`` have passed, and serves:

* ``/generate``: streamed like sglang (cumulative ``text`` with ``completion_tokens``); as with
  dummy weights under simulated acceptance, the text stays empty until the last chunk unless the
  request asks for ``skip_special_tokens: false``; every request (its sampling parameters and
  text) is appended to ``requests.jsonl`` in $FAKE_SERVER_DIR when that is set;
* ``/server_info`` (with EAGLE3_DYNAMIC's ``dynamic_eagle`` counters for an EAGLE3_DYNAMIC server),
  ``/v1/models`` (the model path), ``/flush_cache``, ``/freeze_gc``.

The server on port $FAKE_CRASH_PORT exits at start, as a server whose graph capture crashed
(with $FAKE_CRASH_MESSAGE as its last words, if set).

An EAGLE3_DYNAMIC server appends two decode-step trace lines per request to
$SGLANG_DYNAMIC_EAGLE_TRACE, as the plugin does: a step line with its time ``t`` and a time line.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from http.server import ThreadingHTTPServer

from json_http import JsonHandler

ALLOCATE_S = 0.2
READY_S = 0.4
TOKEN_S = 0.002
STARTED = time.monotonic()
STATE = {"requests": 0, "step": 0}
LOCK = threading.Lock()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    for flag in ("--model-path", "--speculative-algorithm", "--mem-fraction-static"):
        parser.add_argument(flag)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-total-tokens", type=int, default=100_000)
    return parser.parse_known_args()[0]


ARGS = parse_args()
DYNAMIC = ARGS.speculative_algorithm == "EAGLE3_DYNAMIC"


def counters() -> dict:
    served = STATE["requests"]
    return {"speculative_steps": 3 * served, "plain_steps": 2 * served, "switches_to_plain": served,
            "switches_to_speculative": served, "catchup_tokens": 0, "mean_accept_length": 2.5,
            "policy_probes": served, "crossover_batch": 24}


def trace(record: dict) -> None:
    path = os.environ.get("SGLANG_DYNAMIC_EAGLE_TRACE")
    if DYNAMIC and path:
        with open(path, "a") as out:
            out.write(json.dumps(record) + "\n")


class Handler(JsonHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            ready = time.monotonic() - STARTED > READY_S
            self.send_response(200 if ready else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/server_info":
            state = {"effective_max_running_requests_per_dp": 48 if ARGS.speculative_algorithm else 128,
                     **({"dynamic_eagle": counters()} if DYNAMIC else {})}
            self.reply({"version": "fake", "internal_states": [state]})
        elif self.path == "/v1/models":
            self.reply({"data": [{"id": ARGS.model_path}]})
        else:
            self.reply({})

    def do_POST(self) -> None:
        body = self.read_json()
        if not self.path.startswith("/generate"):
            return self.reply({"success": True})
        params = body.get("sampling_params", {})
        with LOCK:
            STATE["requests"] += 1
            STATE["step"] += 1
            step = STATE["step"]
        if os.environ.get("FAKE_SERVER_DIR"):
            with open(os.path.join(os.environ["FAKE_SERVER_DIR"], "requests.jsonl"), "a") as out:
                out.write(json.dumps({"port": ARGS.port, "sampling_params": params, "text": body.get("text")}) + "\n")
        trace({"k": "step", "step": step, "t": round(time.time(), 4), "mode": "speculative", "b": 1})
        trace({"k": "time", "step": step, "ms": 1.0})
        tokens = int(params.get("max_new_tokens", 16))
        visible = params.get("skip_special_tokens") is False
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for count in range(1, tokens + 1):
            time.sleep(TOKEN_S)
            text = "x" * count if visible or count == tokens else ""
            chunk = {"text": text, "meta_info": {"completion_tokens": count}}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"fake server {ARGS.speculative_algorithm or 'plain'} started at {time.time():.4f}", flush=True)
    if str(ARGS.port) == os.environ.get("FAKE_CRASH_PORT"):
        raise SystemExit(os.environ.get("FAKE_CRASH_MESSAGE",
                                        "fake server: crashed while capturing CUDA graphs (FAKE_CRASH_PORT)"))
    if os.environ.get("SGLANG_DE_TEST_ACCEPTANCE_MIX_FILE") and not os.environ.get("FAKE_WITHOUT_MIX_PLUGIN"):
        print("SGLANG_DE_TEST_ACCEPTANCE_MIX_FILE=...: simulated acceptance differs by request", flush=True)
    time.sleep(ALLOCATE_S)
    for _ in range(2 if ARGS.speculative_algorithm else 1):
        print(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {ARGS.max_total_tokens}, "
              f"KV size: 1.00 GB (at {time.time():.4f})", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
