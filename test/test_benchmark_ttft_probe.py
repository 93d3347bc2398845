"""The TTFT probe's stream parsing and summary (benchmark/sweeplib/ttft_probe.py)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib import ttft_probe  # noqa: E402


def sse(data: dict) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n"


def test_probe_separates_token_and_text_ttft():
    stream = [
        (0.020, sse({"text": "", "output_ids": [50000], "meta_info": {"completion_tokens": 1}})),
        (0.021, b"\n"),
        (0.030, sse({"text": "", "output_ids": [50000, 100, 100, 100], "meta_info": {"completion_tokens": 4}})),
        (0.690, sse({"text": "\ufffd" * 5, "output_ids": [50000] + [100] * 4, "meta_info": {"completion_tokens": 5}})),
        (0.691, b"data: [DONE]\n"),
    ]
    chunks = [c for c in (ttft_probe.parse_sse_line(line, t) for t, line in stream) if c is not None]
    timing = ttft_probe.summarize_chunks(chunks, e2e_s=0.692)
    assert timing.token_ttft_ms == pytest.approx(20.0)
    assert timing.text_ttft_ms == pytest.approx(690.0)
    assert timing.first_output_id == 50000
    assert timing.completion_tokens == 5 and timing.chunks == 3


def test_probe_summary_splits_cold_and_warm():
    timings = [ttft_probe.ProbeTiming(token_ttft_ms=t, text_ttft_ms=x, e2e_ms=e, completion_tokens=256,
                                      chunks=86, first_output_id=1)
               for t, x, e in ((900.0, 1500.0, 1600.0), (20.0, 690.0, 700.0), (24.0, 680.0, 705.0))]
    summary = ttft_probe.summarize_probe(timings)
    assert summary["cold_token_ttft_ms"] == 900.0
    assert summary["warm_median_token_ttft_ms"] == statistics.median([20.0, 24.0])
    assert summary["warm_median_text_ttft_ms"] == statistics.median([690.0, 680.0])
    assert len(summary["requests"]) == 3


def test_probe_prompts_differ_between_requests():
    first, second = (ttft_probe.probe_prompt_ids(512, 1, i) for i in (0, 1))
    assert len(first) == 512 and first != second
    assert min(first + second) >= ttft_probe.PROMPT_ID_LOW and max(first + second) < ttft_probe.PROMPT_ID_HIGH
