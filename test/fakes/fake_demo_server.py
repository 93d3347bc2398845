"""A stand-in for ``python -m sglang.launch_server`` that models/tiny-pair/demo.sh can talk to:
``/health``, ``/generate`` (a completion of the requested length) and ``/server_info`` with
EAGLE3_DYNAMIC's counters after the requests it served."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer

from json_http import JsonHandler, port_argument

SERVED = {"requests": 0}
LOCK = threading.Lock()


class Handler(JsonHandler):
    def do_GET(self) -> None:
        if self.path == "/server_info":
            served = SERVED["requests"]
            counters = {"speculative_steps": 10 * served, "plain_steps": 20 * served,
                        "switches_to_plain": served, "switches_to_speculative": served,
                        "catchup_tokens": 5 * served, "mean_accept_length": 2.4}
            self.reply({"internal_states": [{"dynamic_eagle": counters}]})
        else:
            self.reply({})

    def do_POST(self) -> None:
        body = self.read_json()
        with LOCK:
            SERVED["requests"] += 1
        tokens = body["sampling_params"]["max_new_tokens"]
        self.reply({"text": "x" * tokens, "meta_info": {"completion_tokens": tokens}})


def main() -> None:
    port = port_argument()
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
