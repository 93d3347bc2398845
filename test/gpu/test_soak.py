"""Soak: thousands of mode switches under a mixed load, on the 8B-shaped dummy model (bf16).

Six clients keep the running batch near the switch thresholds (disable above 2, enable at 2,
patience 1) with short greedy requests, streaming requests that disconnect after a few chunks,
requests aborted through ``/abort_request`` while they run, and requests with token ids
outside the vocabulary. Asserted: the server never dies; every greedy request that finished
normally equals a plain server's output (a difference counts only as a numerical tie where
the plain top-2 logprob margin is below 1e-3); bad requests get HTTP 400; GPU memory does not
grow from the first third of the run to the last; after the load drains, sglang's idle check
finds no leaked KV or request slots; the counters add up.

Run it alone: ``bash test/gpu/run_on_device.sh test/gpu/test_soak.py``.
``SGLANG_DE_SOAK_SECONDS`` bounds the load (default 300 s); it stops early at
``MIN_SWITCHES`` switches.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import List, Optional

import pytest

from gpu_servers import compare_with_plain, dummy8b_args, running_servers

pytestmark = pytest.mark.gpu

SOAK_SECONDS = float(os.environ.get("SGLANG_DE_SOAK_SECONDS", "300"))
MIN_SWITCHES = 10_000
CLIENTS = 6
MEMORY_GROWTH_LIMIT_MIB = 128
SOAK_FLAGS = [
    "--speculative-disable-batch-threshold", "2",
    "--speculative-enable-batch-threshold", "2",
    "--speculative-switch-patience", "1",
]
LEAK_TEXT = "memory leak detected"


@dataclass
class SoakLog:
    """What the clients did, shared between their threads."""

    completed: List[dict] = field(default_factory=list)  # {"prompt", "output"}
    aborted: int = 0
    aborted_before_finish: int = 0
    disconnected: int = 0
    bad_statuses: List[int] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, **changes) -> None:
        with self.lock:
            for name, value in changes.items():
                current = getattr(self, name)
                if isinstance(current, list):
                    current.append(value)
                else:
                    setattr(self, name, current + value)


@pytest.fixture(scope="module")
def soak_servers(kit_models):
    target, draft = dummy8b_args(kit_models)
    specs = {
        "soak_plain": target + ["--mem-fraction-static", "0.4"],
        "soak_dynamic": target + ["--mem-fraction-static", "0.6",
                                  "--speculative-algorithm", "EAGLE3_DYNAMIC", *draft,
                                  *SOAK_FLAGS],
    }
    with running_servers(specs) as started:
        yield started


def random_prompt(rng: random.Random) -> dict:
    return {
        "input_ids": [rng.randrange(3, 8000) for _ in range(rng.choice([8, 24, 64, 200]))],
        "max_new_tokens": rng.randint(1, 24),
    }


def generate_payload(prompt: dict, **extra) -> dict:
    return {
        "input_ids": prompt["input_ids"],
        "sampling_params": {"temperature": 0.0, "max_new_tokens": prompt["max_new_tokens"],
                            "ignore_eos": True},
        **extra,
    }


def post_status(server, path: str, payload: dict, timeout: float = 120) -> tuple[int, Optional[dict]]:
    request = urllib.request.Request(server.url + path, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()  # /abort_request answers with an empty body
            return response.status, json.loads(body) if body else None
    except urllib.error.HTTPError as error:
        return error.code, None


def greedy_request(server, prompt: dict, log: SoakLog) -> None:
    status, output = post_status(server, "/generate", generate_payload(prompt))
    if status != 200:
        log.add(errors=f"greedy request: HTTP {status}")
    else:
        log.add(completed={"prompt": prompt, "output": output})


def streaming_disconnect(server, prompt: dict, rng: random.Random, log: SoakLog) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    body = json.dumps(generate_payload({**prompt, "max_new_tokens": 64}, stream=True))
    connection.request("POST", "/generate", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    for _ in range(rng.randint(1, 3)):
        if not response.readline():
            break
    connection.close()  # mid-stream: the server must abort the request, not choke on it
    log.add(disconnected=1)


def aborted_request(server, prompt: dict, rng: random.Random, log: SoakLog, rid: str) -> None:
    payload = generate_payload({**prompt, "max_new_tokens": 64}, rid=rid)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(post_status, server, "/generate", payload)
        time.sleep(rng.uniform(0.005, 0.06))
        post_status(server, "/abort_request", {"rid": rid})
        status, output = pending.result()
    finish = ((output or {}).get("meta_info") or {}).get("finish_reason") or {}
    log.add(aborted=1, aborted_before_finish=int(status != 200 or finish.get("type") == "abort"))


def bad_request(server, rng: random.Random, log: SoakLog) -> None:
    bad_id = rng.choice([-2, 10**6])
    status, _ = post_status(server, "/generate", generate_payload({"input_ids": [5, bad_id, 7],
                                                                   "max_new_tokens": 4}))
    log.add(bad_statuses=status)


def client(server, seed: int, deadline: float, stop: threading.Event, log: SoakLog) -> None:
    rng = random.Random(seed)
    count = 0
    while time.monotonic() < deadline and not stop.is_set():
        count += 1
        prompt = random_prompt(rng)
        kind = rng.random()
        try:
            if kind < 0.75:
                greedy_request(server, prompt, log)
            elif kind < 0.85:
                streaming_disconnect(server, prompt, rng, log)
            elif kind < 0.95:
                aborted_request(server, prompt, rng, log, rid=f"soak-{seed}-{count}")
            else:
                bad_request(server, rng, log)
        except (OSError, ValueError) as error:  # connection failures, unreadable answers
            log.add(errors=f"{type(error).__name__}: {error}")
        time.sleep(rng.uniform(0.0, 0.02))


def device_used_mib() -> float:
    import torch

    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


def watch_switches_and_memory(server, deadline: float, stop: threading.Event,
                              samples: List[tuple[float, float]]) -> None:
    while time.monotonic() < deadline and not stop.is_set():
        counters = server.dynamic_counters()
        samples.append((time.monotonic(), device_used_mib()))
        if counters["switches_to_plain"] + counters["switches_to_speculative"] >= MIN_SWITCHES:
            stop.set()
        time.sleep(2.0)


def memory_growth_mib(samples: List[tuple[float, float]]) -> float:
    third = max(1, len(samples) // 3)
    return max(m for _, m in samples[-third:]) - max(m for _, m in samples[:third])


def replay_on_plain(completed: List[dict], plain_server) -> List[dict]:
    with ThreadPoolExecutor(max_workers=32) as pool:
        return list(pool.map(
            lambda entry: plain_server.generate(entry["prompt"]["input_ids"],
                                                entry["prompt"]["max_new_tokens"],
                                                top_logprobs_num=2),
            completed,
        ))


def leak_lines(server) -> List[str]:
    return [line for line in server.log_path.read_text(errors="replace").splitlines()
            if LEAK_TEXT in line]


def test_soak_thousands_of_switches(soak_servers):
    server, plain_server = soak_servers["soak_dynamic"], soak_servers["soak_plain"]
    before = server.dynamic_counters()
    log, stop, samples = SoakLog(), threading.Event(), []
    deadline = time.monotonic() + SOAK_SECONDS
    threads = [threading.Thread(target=client, args=(server, seed, deadline, stop, log))
               for seed in range(CLIENTS)]
    threads.append(threading.Thread(target=watch_switches_and_memory,
                                    args=(server, deadline, stop, samples)))
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started

    time.sleep(5.0)  # drained: sglang's idle check runs now
    after = server.dynamic_counters()
    switches = (after["switches_to_plain"] - before.get("switches_to_plain", 0)
                + after["switches_to_speculative"] - before.get("switches_to_speculative", 0))
    ties, failures = compare_with_plain([entry["output"] for entry in log.completed],
                                        replay_on_plain(log.completed, plain_server))
    growth = memory_growth_mib(samples)
    leaks = leak_lines(server)
    print(
        f"soak: {elapsed:.0f} s, {switches} switches, {len(log.completed)} greedy requests "
        f"compared ({ties} ties, {len(failures)} failures), {log.aborted} aborts "
        f"({log.aborted_before_finish} before finishing), {log.disconnected} disconnects, "
        f"bad requests {len(log.bad_statuses)} (statuses {sorted(set(log.bad_statuses))}), "
        f"client errors {log.errors[:5]}, device memory growth {growth:.0f} MiB over "
        f"{len(samples)} samples, leak lines {leaks[:3]}, counters {after}"
    )
    assert server.process.poll() is None, server.log_tail()
    assert switches >= MIN_SWITCHES
    assert not failures
    assert not log.errors
    assert set(log.bad_statuses) <= {400}
    assert growth <= MEMORY_GROWTH_LIMIT_MIB
    assert not leaks
    assert abs(after["switches_to_plain"] - after["switches_to_speculative"]) <= 1
    assert after["catchup_forwards"] <= after["switches_to_speculative"]
    assert after["plain_graph_steps"] <= after["plain_steps"]
