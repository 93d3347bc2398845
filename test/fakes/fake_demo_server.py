"""A stand-in for ``python -m sglang.launch_server`` that models/tiny-pair/demo.sh can talk to:
``/health``, ``/generate`` (a completion of the requested length) and ``/server_info`` with
EAGLE3_DYNAMIC's counters after the requests it served."""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SERVED = {"requests": 0}
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/server_info":
            served = SERVED["requests"]
            counters = {"speculative_steps": 10 * served, "plain_steps": 20 * served,
                        "switches_to_plain": served, "switches_to_speculative": served,
                        "catchup_tokens": 5 * served, "mean_accept_length": 2.4}
            self._reply({"internal_states": [{"dynamic_eagle": counters}]})
        else:
            self._reply({})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with LOCK:
            SERVED["requests"] += 1
        tokens = body["sampling_params"]["max_new_tokens"]
        self._reply({"text": "x" * tokens, "meta_info": {"completion_tokens": tokens}})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args, _ = parser.parse_known_args()
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
