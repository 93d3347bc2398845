"""Decode-step traces for replay (opt-in: ``SGLANG_DYNAMIC_EAGLE_TRACE=<file>``).

One JSON object per line, appended as the server runs, joined by step in
``policy.replay.load_trace``:

* ``{"k": "step", "step", "t", "mode", "b", "kv", "q"}`` when a decode step is decided;
* ``{"k": "time", "step", "ms"}`` when its measured time reaches the policy;
* ``{"k": "verify", "step", "tokens", "requests"}`` when a speculative step's verify result is
  processed (tokens include the bonus token);
* ``{"k": "catchup", "t", "tokens", "ms"}`` when a catch-up's GPU time is known.

Without the variable every method is a no-op on a shared disabled instance.
"""

from __future__ import annotations

import json
import os
import time
from typing import Optional, Sequence

TRACE_ENV = "SGLANG_DYNAMIC_EAGLE_TRACE"


class StepTrace:
    def __init__(self, path: Optional[str]) -> None:
        self.enabled = bool(path)
        # Line-buffered: a killed server loses at most the line being written.
        self._file = open(path, "a", buffering=1) if path else None

    @classmethod
    def from_environment(cls) -> "StepTrace":
        return cls(os.environ.get(TRACE_ENV) or None)

    def _write(self, record: dict) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def step(self, observation, mode) -> None:
        if self.enabled:
            self._write({"k": "step", "step": observation.step, "t": round(time.time(), 4),
                         "mode": mode.value, "b": observation.batch_size,
                         "kv": observation.kv_tokens, "q": observation.queued})

    def time(self, step: int, ms: float) -> None:
        if self.enabled:
            self._write({"k": "time", "step": step, "ms": round(ms, 4)})

    def verify(self, step: int, correct_drafts_per_req: Sequence[int]) -> None:
        if self.enabled:
            self._write({"k": "verify", "step": step,
                         "tokens": sum(correct_drafts_per_req) + len(correct_drafts_per_req),
                         "requests": len(correct_drafts_per_req)})

    def catchup(self, tokens: int, ms: float) -> None:
        if self.enabled:
            self._write({"k": "catchup", "t": round(time.time(), 4), "tokens": tokens,
                         "ms": round(ms, 4)})
