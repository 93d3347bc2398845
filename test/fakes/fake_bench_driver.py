"""A stand-in for benchmark/sweeplib/bench_driver.py that answers at once, without sglang.

Per request line it reads the server's /server_info (answered as "after_warmup"), sends one
request to the server the flags name (so that the server counts and traces it), and appends a
bench_serving-shaped result line with --num-prompts requests of --random-output-len tokens to
--output-file (TTFT 10 ms and 5 ms per later token; 20 ms and 100 ms on port $FAKE_SLOW_PORT),
each run lasting 2 s; a --seed numpy would refuse fails as bench_serving does. With $FAKE_DRIVER_SLEEP_S it waits that long before answering; every
request line is appended to $FAKE_DRIVER_LOG when that is set.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request


def flag(flags: list[str], name: str, default=None):
    return flags[flags.index(name) + 1] if name in flags else default


def main() -> None:
    for text in sys.stdin:
        request = json.loads(text)
        flags = request["flags"]
        if os.environ.get("FAKE_DRIVER_LOG"):
            mix_file = os.environ.get("FAKE_MIX_FILE")  # what a server's acceptance plugin would read now
            if mix_file:
                with open(mix_file) as mix:
                    request["mix"] = mix.read().strip()
            with open(os.environ["FAKE_DRIVER_LOG"], "a") as log:
                log.write(json.dumps(request) + "\n")
        seed = int(flag(flags, "--seed", 0))
        if not 0 <= seed < 2**32:  # bench_serving passes it to numpy.random.seed, which refuses it
            print(json.dumps({"ok": False, "error": "ValueError: Seed must be between 0 and 2**32 - 1"}), flush=True)
            continue
        base = f"http://{flag(flags, '--host')}:{flag(flags, '--port')}"
        info = json.loads(urllib.request.urlopen(base + "/server_info", timeout=10).read())  # after the warm-up
        body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 2}}).encode()
        urllib.request.urlopen(urllib.request.Request(base + "/generate", data=body), timeout=10).read()
        prompts, tokens = int(flag(flags, "--num-prompts")), int(flag(flags, "--random-output-len"))
        slow = flag(flags, "--port") == os.environ.get("FAKE_SLOW_PORT")
        ttft, itl = (0.02, 0.1) if slow else (0.01, 0.005)
        line = {"backend": "sglang", "request_rate": float(flag(flags, "--request-rate")),
                "max_concurrency": flag(flags, "--max-concurrency"), "completed": prompts,
                "duration": 2.0, "accept_length": 2.5 if "dynamic_eagle" in json.dumps(info) else None,
                "output_lens": [tokens] * prompts, "ttfts": [ttft] * prompts,
                "itls": [[itl] * (tokens - 1)] * prompts, "errors": [""] * prompts, "server_info": info}
        time.sleep(float(os.environ.get("FAKE_DRIVER_SLEEP_S", "0")))
        with open(flag(flags, "--output-file"), "a") as out:
            out.write(json.dumps(line) + "\n")
        print(json.dumps({"ok": True, "error": None, "after_warmup": info}), flush=True)


if __name__ == "__main__":
    main()
