"""Diagnostic sglang plugin: when and for how long the scheduler and the EAGLE worker run each
phase of a step, on the host and on the GPU.

With ``SGLANG_PHASE_TIMELINE_DIR`` set, every scheduler process writes one JSON line per call of
the functions in ``PHASES`` to ``<dir>/timeline-<pid>.jsonl``: the phase, the batch's forward
mode, host start and end (``time.perf_counter_ns``) and, for the phases that enqueue GPU work,
the GPU milliseconds between CUDA events recorded at the call's start and end (read with
``Event.query()`` once they complete, never waited for). The first line names the server's
speculative algorithm. Unset, the plugin installs nothing.

The same hooks are installed in every server that loads plugins, so a timeline of EAGLE3 and one
of EAGLE3_DYNAMIC pay the same recording cost (a few microseconds a call). ``summarise.py``
beside this file turns the files into per-prefill intervals.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from typing import Any, Callable, Deque, Optional, Tuple

DIR_ENV = "SGLANG_PHASE_TIMELINE_DIR"
FLUSH_EVERY = 32

# (phase name, dotted target, whether GPU time is recorded)
PHASES: Tuple[Tuple[str, str, bool], ...] = (
    ("recv", "sglang.srt.managers.scheduler.Scheduler.process_input_requests", False),
    ("run_batch", "sglang.srt.managers.scheduler.Scheduler.run_batch", False),
    ("process_result", "sglang.srt.managers.scheduler.Scheduler.process_batch_result", False),
    ("resolve_seq_lens", "sglang.srt.managers.overlap_utils.FutureMap.resolve_seq_lens_cpu", False),
    ("eagle_forward", "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation", True),
    ("target_forward", "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation", True),
    ("draft_prefill", "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill", True),
    ("draft", "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft", True),
    ("verify", "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.verify", True),
    ("draft_extend", "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode", True),
    ("dynamic_forward", "sglang_dynamic_eagle.engine.worker.DynamicEagleWorker.forward_batch_generation", True),
)


class Timeline:
    """One process's records, written as their GPU events complete."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._file = None
        self._pending: Deque[dict] = deque()
        self._unflushed = 0

    def _open(self, algorithm: str) -> None:
        path = os.path.join(self._directory, f"timeline-{os.getpid()}.jsonl")
        self._file = open(path, "a", buffering=1 << 16)
        self._file.write(json.dumps({"algorithm": algorithm}) + "\n")
        self._file.flush()

    def add(self, record: dict, events: Optional[tuple], algorithm: str) -> None:
        if self._file is None:
            self._open(algorithm)
        record["events"] = events
        self._pending.append(record)
        self._write_completed()

    def _write_completed(self) -> None:
        while self._pending:
            events = self._pending[0]["events"]
            if events is not None and not events[1].query():
                break
            record = self._pending.popleft()
            record["gpu_ms"] = round(events[0].elapsed_time(events[1]), 4) if events else None
            del record["events"]
            self._file.write(json.dumps(record) + "\n")
            self._unflushed += 1
        if self._unflushed >= FLUSH_EVERY:  # the server is killed, not stopped: flush often
            self._file.flush()
            self._unflushed = 0


_timeline: Optional[Timeline] = None
_algorithm = "?"


def _batch_facts(args: tuple) -> dict:
    """The forward mode and request count of the call's batch, where it has one."""
    batch = args[1] if len(args) > 1 else None
    mode = getattr(batch, "forward_mode", None)
    reqs = getattr(batch, "reqs", None)
    return {"mode": getattr(mode, "name", None), "reqs": len(reqs) if reqs is not None else None}


def _nothing_done(phase: str, args: tuple) -> bool:
    """Idle loop iterations: no request received."""
    return phase == "recv" and len(args) > 1 and not args[1]


def _around(phase: str, with_gpu: bool) -> Callable:
    import torch

    def hook(original_fn, *args, **kwargs) -> Any:
        global _algorithm
        server_args = getattr(args[0], "server_args", None) if args else None
        if server_args is not None:  # the scheduler's methods
            _algorithm = str(server_args.speculative_algorithm)
        events = None
        if with_gpu:
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record()
        start = time.perf_counter_ns()
        result = original_fn(*args, **kwargs)
        end = time.perf_counter_ns()
        if events is not None:
            events[1].record()
        if not _nothing_done(phase, args):
            _timeline.add({"phase": phase, **_batch_facts(args), "start_ns": start,
                           "end_ns": end}, events, _algorithm)
        return result

    return hook


def register() -> None:
    global _timeline
    directory = os.environ.get(DIR_ENV)
    if not directory:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    os.makedirs(directory, exist_ok=True)
    _timeline = Timeline(directory)
    for phase, target, with_gpu in PHASES:
        HookRegistry.register(target, _around(phase, with_gpu), HookType.AROUND)
