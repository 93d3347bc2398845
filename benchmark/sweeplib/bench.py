"""Drive sglang.bench_serving (through bench_driver.py) and turn its result lines into metrics."""

from __future__ import annotations

import json
import math
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sweeplib.workloads import Segment

DRIVER_PATH = Path(__file__).resolve().with_name("bench_driver.py")
POLL_S = 0.5
# Per-request lists of bench_serving's --output-details, left out of the stored raw row.
DETAIL_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors", "server_info")


def segment_flags(segment: Segment, tokenizer: str, host: str, port: int, seed: int, output_file: str,
                  extra_args: tuple[str, ...] = ()) -> list[str]:
    """What `python -m sglang.bench_serving` gets for one segment."""
    shape = (["--dataset-name", "random-ids", "--random-input-len", str(segment.input_len), "--random-output-len",
              str(segment.output_len), "--random-range-ratio", str(segment.range_ratio)] if not segment.groups else
             ["--dataset-name", "generated-shared-prefix", "--gsp-num-groups", str(segment.groups),
              "--gsp-prompts-per-group", str(segment.prompts // segment.groups), "--gsp-system-prompt-len",
              str(segment.prefix_len), "--gsp-question-len", str(segment.input_len), "--gsp-output-len",
              str(segment.output_len), "--gsp-range-ratio", str(segment.range_ratio)])
    flags = ["--backend", "sglang", "--host", host, "--port", str(port), *shape, "--tokenizer", tokenizer,
             "--num-prompts", str(segment.prompts), "--request-rate", str(segment.rate), "--seed", str(seed),
             "--output-file", output_file, "--output-details", "--flush-cache", "--disable-tqdm"]
    return flags + (["--max-concurrency", str(segment.concurrency)] if segment.concurrency is not None else []) + [*extra_args]


class BenchClient:
    """One bench_driver process, started on first use and again after it was killed."""

    def __init__(self, log_path: Path, command: list[str] | None = None) -> None:
        self.log_path, self.command, self.process = log_path, command, None

    def _start(self) -> subprocess.Popen:
        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(self.command or [sys.executable, str(DRIVER_PATH)], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)
        self.replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._forward, args=(self.process.stdout, self.replies), daemon=True).start()
        return self.process

    @staticmethod
    def _forward(stdout, replies: queue.Queue) -> None:
        for line in stdout:
            replies.put(line)
        replies.put(None)

    def run(self, flags: list[str], visible_special_tokens: bool, timeout_s: float,
            alive: Callable[[], bool] = lambda: True) -> dict:
        """{"ok", "error", "after_warmup"}; error "timeout" or "server died" when it was killed."""
        process = self.process if self.process and self.process.poll() is None else self._start()
        process.stdin.write(json.dumps({"flags": flags, "visible_special_tokens": visible_special_tokens}) + "\n")
        process.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.replies.get(timeout=POLL_S)
            except queue.Empty:
                line = ""
            if line is None:
                return {"ok": False, "error": f"bench driver exited with {process.wait()}", "after_warmup": None}
            if line.strip():
                return json.loads(line)
            problem = "timeout" if time.monotonic() > deadline else None if alive() else "server died"
            if problem:
                self.close()
                return {"ok": False, "error": problem, "after_warmup": None}

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


def last_line(path: Path) -> dict | None:
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1]) if lines else None


def request_stats(line: dict) -> dict:
    """Per request: ok, output tokens, TTFT, TPOT and E2E in seconds, from --output-details. ITL
    entries follow the first chunk with text, so TTFT + sum(ITL) is the latency to the last token
    and sum(ITL) / (tokens - 1) the TPOT (bench_serving's (latency - TTFT) / (tokens - 1))."""
    errors = line.get("errors") or [""] * len(line.get("ttfts") or [])
    stats: dict[str, list] = {"ok": [], "output_len": [], "ttft_s": [], "tpot_s": [], "e2e_s": []}
    for error, tokens, ttft, itls in zip(errors, line.get("output_lens") or [], line.get("ttfts") or [], line.get("itls") or []):
        decode_s = sum(itls)
        # Answered without a streamed token (a prompt over the context length): TTFT 0, no ITLs, yet bench_serving's
        # "completed" (a one-token answer without text reads the same unless the run has --visible-special-tokens).
        stats["ok"].append(not error and (ttft > 0 or bool(itls)))
        stats["output_len"].append(tokens)
        stats["ttft_s"].append(round(ttft, 6))
        stats["tpot_s"].append(round(decode_s / (tokens - 1), 6) if tokens > 1 else None)
        stats["e2e_s"].append(round(ttft + decode_s, 6))
    return stats


def first_tokens_s(requests: dict) -> list[float | None]:
    """Each request's TTFT, None where it failed or its output of several tokens came in one chunk: TPOT 0 (README)."""
    tpots = requests.get("tpot_s") or [None] * len(requests["ok"])
    return [t if ok and tpot != 0 else None for ok, t, tpot in zip(requests["ok"], requests["ttft_s"], tpots)]


def raw_row(line: dict) -> dict:
    """bench_serving's result line without its per-request lists and server info (inf as "inf", strict JSON)."""
    return {key: str(value) if value in (math.inf, -math.inf) else value for key, value in line.items()
            if key not in DETAIL_KEYS}


def percentile(values: list[float], q: float) -> float | None:
    """numpy's default (linear) percentile, as bench_serving computes its p99."""
    values = sorted(values)
    if not values:
        return None
    position = (len(values) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def workload_metrics(segments: list[dict], goodput_tpot_ms: float) -> dict:
    """Metrics over every request of a workload's runs: throughputs over the runs' summed durations
    (idle gaps and warm-ups excluded), latency percentiles (ms), and goodput: requests per second
    completed with TPOT <= goodput_tpot_ms (one-token requests have no TPOT and count as meeting it)."""
    requests = {key: [v for s in segments for v in s["requests"][key]] for key in
                ("ok", "output_len", "ttft_s", "tpot_s", "e2e_s")}
    ok = [i for i, good in enumerate(requests["ok"]) if good]
    duration = sum(s["bench"].get("duration") or 0.0 for s in segments)
    first = first_tokens_s(requests)
    tpots = [requests["tpot_s"][i] for i in ok if first[i] is not None and requests["tpot_s"][i] is not None]
    good = sum(1 for i in ok if requests["tpot_s"][i] is None or requests["tpot_s"][i] * 1000 <= goodput_tpot_ms)
    metrics = {"completed": len(ok), "requests": len(requests["ok"]), "duration": duration,
               "total_output_tokens": sum(requests["output_len"][i] for i in ok), "goodput_tpot_ms": goodput_tpot_ms,
               "accept_length": next((s["bench"].get("accept_length") for s in reversed(segments)
                                      if s["bench"].get("accept_length") is not None), None)}
    for key, count in (("request_throughput", len(ok)), ("output_throughput", metrics["total_output_tokens"]), ("goodput", good)):
        metrics[key] = count / duration if duration else None
    for name, values in (("ttft", [t for t in first if t is not None]), ("tpot", tpots),
                         ("e2e_latency", [requests["e2e_s"][i] for i in ok])):
        for label, q in (("median", 50), ("p99", 99)):
            metrics[f"{label}_{name}_ms"] = percentile(values, q) * 1000 if values else None
    return metrics
