"""Sequential streaming requests that time the first token two ways.

token TTFT: until the first streamed chunk that reports at least one completion token.
text TTFT:  until the first chunk whose cumulative "text" is non-empty, which is what
            bench_serving's sglang backend reports as TTFT.
The probe sends what bench_serving sends (greedy, ignore_eos, default skip_special_tokens), so
a gap between the two is a detokenization effect, not a server cost. The first probe request is
the first long-prompt request the server sees ("cold"); the others are "warm".
"""

from __future__ import annotations

import http.client
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass

PROMPT_ID_LOW = 3  # the kit tokenizer's ids 0, 1, 2 are pad, bos, eos
PROMPT_ID_HIGH = 8000  # below the kit tokenizer's 8192 entries and any real model's vocabulary


@dataclass(frozen=True)
class StreamChunk:
    elapsed_s: float
    completion_tokens: int
    has_text: bool
    first_output_id: int | None


@dataclass(frozen=True)
class ProbeTiming:
    token_ttft_ms: float | None
    text_ttft_ms: float | None
    e2e_ms: float
    completion_tokens: int
    chunks: int
    first_output_id: int | None


def probe_prompt_ids(input_len: int, seed: int, request_index: int) -> list[int]:
    """Distinct prompts per request, so no request hits the prefix cache of another."""
    rng = random.Random(f"{seed}-{request_index}")
    return [rng.randrange(PROMPT_ID_LOW, PROMPT_ID_HIGH) for _ in range(input_len)]


def parse_sse_line(line: bytes, elapsed_s: float) -> StreamChunk | None:
    """One `data: {...}` line of sglang's /generate stream; None for blanks and [DONE]."""
    text = line.strip()
    if not text.startswith(b"data:") or text[5:].strip() == b"[DONE]":
        return None
    data = json.loads(text[5:])
    output_ids = data.get("output_ids") or []
    return StreamChunk(elapsed_s, int((data.get("meta_info") or {}).get("completion_tokens", len(output_ids))),
                       bool(data.get("text")), int(output_ids[0]) if output_ids else None)


def summarize_chunks(chunks: list[StreamChunk], e2e_s: float) -> ProbeTiming:
    first_token = next((c for c in chunks if c.completion_tokens >= 1), None)
    first_text = next((c for c in chunks if c.has_text), None)
    return ProbeTiming(
        token_ttft_ms=first_token.elapsed_s * 1000 if first_token else None,
        text_ttft_ms=first_text.elapsed_s * 1000 if first_text else None,
        e2e_ms=e2e_s * 1000, completion_tokens=chunks[-1].completion_tokens if chunks else 0,
        chunks=len(chunks), first_output_id=first_token.first_output_id if first_token else None)


def stream_generate(host: str, port: int, input_ids: list[int], output_len: int,
                    timeout_s: float) -> ProbeTiming:
    body = json.dumps({"input_ids": input_ids, "stream": True, "sampling_params": {
        "temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True}})
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        started = time.perf_counter()
        connection.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"/generate answered {response.status}: {response.read()[:300]!r}")
        chunks = [parse_sse_line(line, time.perf_counter() - started)
                  for line in iter(response.readline, b"")]
        return summarize_chunks([c for c in chunks if c is not None], time.perf_counter() - started)
    finally:
        connection.close()


def summarize_probe(timings: list[ProbeTiming]) -> dict:
    def warm_median(field: str) -> float | None:
        present = [getattr(t, field) for t in timings[1:] if getattr(t, field) is not None]
        return statistics.median(present) if present else None

    return {
        "requests": [asdict(t) for t in timings],
        "cold_token_ttft_ms": timings[0].token_ttft_ms,
        "cold_text_ttft_ms": timings[0].text_ttft_ms,
        "warm_median_token_ttft_ms": warm_median("token_ttft_ms"),
        "warm_median_text_ttft_ms": warm_median("text_ttft_ms"),
        "warm_median_e2e_ms": warm_median("e2e_ms"),
    }


def run_probe(host: str, port: int, input_len: int, output_len: int, requests: int, seed: int,
              timeout_s: float) -> dict:
    return summarize_probe([
        stream_generate(host, port, probe_prompt_ids(input_len, seed, index), output_len, timeout_s)
        for index in range(requests)])
