"""Measuring what decode steps cost on this server, without host synchronisation on the decode path.

* :func:`calibrate`: at start-up, after every CUDA graph is captured, replay each graph a few
  times per batch size and time it with CUDA events. A speculative step is the sum of its three
  graphs (multi-step draft, target verify, draft extend); a plain step is its plain-decode
  graph, timed right after its own capture (``plain_decode_graphs``: a DECODE graph on fa3
  reads scheduler metadata from one buffer shared by all batch sizes, which sglang fills
  before each replay; replayed later without that, a graph reads another size's metadata).
  The replays run on the capture-time buffers (dummy requests, context length 1), so the
  calibration leaves out attention over real contexts and all host work: it is the prior of
  the policy's step model (``policy.step_model.ModeCost``), which timed steps refit.
* :class:`StepTimer`: one CUDA event at the end of every decode step; the time between the ends
  of two consecutive decode steps of one mode, with no other forward between them, is one
  sample of that mode's step cost. It covers everything the GPU stream spends on a step: draft
  steps, verify, draft extend, sampling, the scheduler's per-step kernels and any wait for the
  host. Samples are read with ``Event.query()``, never waited for.
* :class:`GpuIntervals`: start/end event pairs (catch-up forwards), read the same way.
* :class:`TimingFeed`: hands the policy the timed steps, made identical on every
  tensor-parallel rank by :func:`tp_max_reducer` (MAX on the TP group's CPU group).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

from sglang_dynamic_eagle.policy import DecodeMode

logger = logging.getLogger(__name__)

CALIBRATION_REPEATS = 5
# Decode steps between two hand-overs of step timings to the policy (with tensor parallelism,
# two all-reduces): at 5-60 ms a step, several times a second. Each hand-over covers the steps
# [s - 2 * FEED_STEPS, s - FEED_STEPS), whose events completed long ago on every rank.
FEED_STEPS = 8
# Prefill batches whose draft time waits for the policy's next timing feed: more than launch
# between two feeds at any load (one every 8 decode steps), few enough to bound a load of
# prefills that never decodes.
PREFILL_KEEP = 256
Reducer = Callable[[List[float]], List[float]]


def _graph_key(runner, batch_size: int):
    # A ragged-verify target runner keys its graphs by token count, every other by batch size.
    if getattr(runner, "ragged_verify_mode", False):
        return runner._make_graph_key(batch_size * runner.captured_req_width)
    return runner._make_graph_key(batch_size)


def _smallest_captured(runner, batch_size: int) -> Optional[int]:
    fitting = [bs for bs in runner.capture_bs if bs >= batch_size]
    return min(fitting) if fitting else None


def _replay(runner, batch_size: int) -> None:
    with runner.backend.replay_session():
        runner.backend.replay(_graph_key(runner, batch_size), None)


def time_replays(runners: Sequence, sizes: Sequence[int], repeats: int) -> float:
    """Milliseconds of one replay of each runner's graph of the given size, in order: the
    least of ``repeats`` timed rounds after a warm-up round. Other work on the GPU (another
    server capturing its graphs while this one starts) only adds time to a round."""
    for runner, size in zip(runners, sizes):
        _replay(runner, size)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(repeats + 1)]
    events[0].record()
    for event in events[1:]:
        for runner, size in zip(runners, sizes):
            _replay(runner, size)
        event.record()
    events[-1].synchronize()
    return min(a.elapsed_time(b) for a, b in zip(events, events[1:]))


def no_dearer_than_larger(costs: Dict[int, float]) -> Dict[int, float]:
    """Each batch size's cost capped by every larger size's: a graph for more requests does
    all the work of one for fewer, so a size timed dearer than a larger one was slowed by
    something else (other work on the GPU), and the larger size's time bounds it."""
    capped: Dict[int, float] = {}
    ceiling = float("inf")
    for size in sorted(costs, reverse=True):
        ceiling = min(ceiling, costs[size])
        capped[size] = ceiling
    return dict(sorted(capped.items()))


def _time_replays(runners: Sequence, batch_size: int, repeats: int,
                  recorded: Optional[Dict[int, float]] = None) -> Optional[float]:
    """Milliseconds of one replay of every runner's graph for ``batch_size``, in order: the
    time ``recorded`` at capture for the graph that step replays (one runner; the plain graphs,
    ``plain_decode_graphs``), else by replaying the graphs now."""
    sizes = [_smallest_captured(runner, batch_size) for runner in runners]
    if any(size is None for size in sizes):
        return None
    if recorded is not None:
        (size,) = sizes
        return recorded.get(size)
    return time_replays(runners, sizes, repeats)


def replays_whole_graphs(runner) -> bool:
    """Only full CUDA graphs replay without a forward batch: breakable and piecewise graphs run
    eager pieces that read per-batch state, which capture-time buffers do not provide."""
    return isinstance(runner.backend, FullCudaGraphBackend)


def calibrate(
    mode_runners: Dict[DecodeMode, Sequence],
    buckets: Dict[DecodeMode, Sequence[int]],
    repeats: int = CALIBRATION_REPEATS,
    recorded: Optional[Dict[DecodeMode, Dict[int, float]]] = None,
) -> Dict[DecodeMode, Dict[int, float]]:
    """Graph-replay milliseconds per mode and bucket; a mode whose graphs cannot be replayed
    (no graphs, or not full CUDA graphs) is left uncalibrated and measured online only.
    ``recorded``: per mode, graph times taken at capture (graph size -> ms), used instead of
    replaying that mode's graph now."""
    table: Dict[DecodeMode, Dict[int, float]] = {}
    for mode, runners in mode_runners.items():
        table[mode] = {}
        if not runners or not all(replays_whole_graphs(runner) for runner in runners):
            logger.info("EAGLE3_DYNAMIC: no full CUDA graphs to time for %s steps; their costs "
                        "are measured online only.", mode.value)
            continue
        try:
            for bucket in buckets[mode]:
                elapsed = _time_replays(runners, bucket, repeats, (recorded or {}).get(mode))
                if elapsed is not None:
                    table[mode][bucket] = elapsed
            table[mode] = no_dearer_than_larger(table[mode])
            if not table[mode]:
                logger.info("EAGLE3_DYNAMIC: no %s graph was timed; those steps' costs are "
                            "measured online only.", mode.value)
        except Exception:
            logger.exception("EAGLE3_DYNAMIC: %s graph replay timing failed; that mode "
                             "starts uncalibrated and is measured online.", mode.value)
            table[mode] = {}
        torch.cuda.synchronize()
    return table


@dataclass
class _PendingSample:
    step: int
    mode: DecodeMode
    batch_size: int
    kv_tokens: int
    start: torch.cuda.Event
    end: torch.cuda.Event


class StepTimer:
    """Per-mode decode step costs from the events at the end of consecutive decode steps.

    The first step of a run (after a mode change or an interruption) has no earlier end to be
    measured from; the next ``settle_steps`` give no sample either: they carry the switch (graph
    and allocator warm-up, the other mode's last work in flight).
    """

    def __init__(self, settle_steps: int = 1) -> None:
        self._settle_steps = settle_steps
        self._previous: Optional[Tuple[DecodeMode, torch.cuda.Event]] = None
        self._run_length = 0  # consecutive decode steps of the current mode, uninterrupted
        self._pending: Deque[_PendingSample] = deque()

    def step_done(self, step: int, mode: DecodeMode, batch_size: int, kv_tokens: int) -> None:
        """Mark the end of decode step ``step`` whose work has just been enqueued."""
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        previous = self._previous
        same_run = previous is not None and previous[0] is mode
        self._run_length = self._run_length + 1 if same_run else 1
        if same_run and self._run_length > self._settle_steps + 1:
            self._pending.append(
                _PendingSample(step, mode, batch_size, kv_tokens, previous[1], end))
        self._previous = (mode, end)

    def interrupt(self) -> None:
        """Another kind of forward (prefill, idle, catch-up) runs before the next decode step."""
        self._previous = None
        self._run_length = 0

    def finished(self) -> Iterator[Tuple[_PendingSample, float]]:
        """Every sample whose events have completed, with its milliseconds."""
        while self._pending and self._pending[0].end.query():
            sample = self._pending.popleft()
            yield sample, sample.start.elapsed_time(sample.end)


class GpuIntervals:
    """GPU time of bracketed work, summed as the events complete; each interval carries a label
    (a catch-up's: its positions)."""

    def __init__(self) -> None:
        self._pending: Deque[Tuple[torch.cuda.Event, torch.cuda.Event, int]] = deque()
        self.total_ms = 0.0

    def start(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, start: torch.cuda.Event, label: int = 0) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending.append((start, end, label))

    def finished(self) -> List[Tuple[int, float]]:
        """(label, milliseconds) of every interval that has completed since the last call."""
        done: List[Tuple[int, float]] = []
        while self._pending and self._pending[0][1].query():
            start, end, label = self._pending.popleft()
            elapsed = start.elapsed_time(end)
            self.total_ms += elapsed
            done.append((label, elapsed))
        return done


def tp_max_reducer(tp_group) -> Reducer:
    """Element-wise MAX over the tensor-parallel ranks (identity for one rank).

    Runs on the group's CPU (gloo) communicator, so it needs no GPU synchronisation; every
    rank must call it at the same decode step, which the worker guarantees by calling it
    every N decode steps (the decode-step sequence is the same on every rank).
    """
    if tp_group is None or getattr(tp_group, "world_size", 1) <= 1:
        return list
    return cpu_group_max_reducer(tp_group.cpu_group)


def cpu_group_max_reducer(cpu_group) -> Reducer:
    def reduce(values: List[float]) -> List[float]:
        tensor = torch.tensor(values, dtype=torch.float64)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX, group=cpu_group)
        return tensor.tolist()

    return reduce


class TimingFeed:
    """Timed decode steps to the policy, identical on every tensor-parallel rank.

    Every rank decides the same modes for the same batches, so a step's (mode, batch, KV
    tokens) is the same everywhere and only its time differs: every ``FEED_STEPS`` decode steps
    the times of the steps [s - 2F, s - F) are all-reduced with MAX (a TP step lasts as long as
    its slowest rank; a step untimed on every rank stays out) and handed to ``sink``. Catch-ups
    travel the same way, keyed by the decode step that launched them (their token count is the
    same on every rank, their GPU time is not), to ``catchup_sink``; prefills' draft extends,
    keyed by launch order, to ``prefill_sink`` at the second feed after their launch.
    """

    def __init__(self, reduce_max: Reducer, sink: Callable[[int, DecodeMode, int, int, float], None],
                 feed_steps: int = FEED_STEPS,
                 catchup_sink: Optional[Callable[[int, float], None]] = None,
                 prefill_sink: Optional[Callable[[int, float], None]] = None) -> None:
        self._reduce_max = reduce_max
        self._sink = sink
        self._catchup_sink = catchup_sink
        self._prefill_sink = prefill_sink
        self._prefill_tokens: Dict[int, int] = {}  # launch index -> tokens (same on every rank)
        self._prefill_ms: Dict[int, float] = {}  # this rank's completed draft-extend times
        self._prefills = 0  # prefill batches launched
        self._prefills_due = 0  # launched before the previous feed (complete by now)
        self._catchup_tokens: Dict[int, int] = {}  # launching step -> tokens (same on every rank)
        self._catchup_ms: Dict[int, float] = {}  # this rank's completed catch-up times
        self._catchups_in_flight: Deque[int] = deque()
        self._feed_steps = feed_steps
        self._timer = StepTimer()
        self._steps: Dict[int, Tuple[DecodeMode, int, int]] = {}  # the same on every rank
        self._times: Dict[int, float] = {}  # this rank's completed timings
        self._decode_steps = 0

    def interrupt(self) -> None:
        self._timer.interrupt()

    def catchup_launched(self, step: int, tokens: int) -> None:
        """A catch-up of ``tokens`` positions was launched before decode step ``step``."""
        self._catchup_tokens[step] = tokens
        self._catchups_in_flight.append(step)

    def prefill_launched(self, tokens: int) -> int:
        """A prefill batch of ``tokens`` was launched; its key for :meth:`prefill_timed`. Keys
        older than ``PREFILL_KEEP`` launches are dropped (a load of prefills without decode
        steps feeds nothing)."""
        key = self._prefills
        self._prefills += 1
        if self._prefill_sink is not None:
            self._prefill_tokens[key] = tokens
            for table in (self._prefill_tokens, self._prefill_ms):
                table.pop(key - PREFILL_KEEP, None)
        return key

    def prefill_timed(self, key: int, draft_ms: float) -> None:
        """This rank's GPU time of the draft extend of prefill ``key``."""
        if key in self._prefill_tokens:
            self._prefill_ms[key] = draft_ms

    def catchup_timed(self, ms: float) -> None:
        """The GPU time of the oldest catch-up in flight: catch-ups complete in launch order,
        and ``DraftCatchup.catch_up`` is the only place that times one."""
        if self._catchups_in_flight:
            self._catchup_ms[self._catchups_in_flight.popleft()] = ms

    def step_done(self, step: int, mode: DecodeMode, batch_size: int, kv_tokens: int) -> None:
        self._steps[step] = (mode, batch_size, kv_tokens)
        self._timer.step_done(step, mode, batch_size, kv_tokens)
        for sample, ms in self._timer.finished():
            self._times[sample.step] = ms
        self._decode_steps += 1
        if self._decode_steps % self._feed_steps:
            return
        low, high = step - 2 * self._feed_steps, step - self._feed_steps
        window = range(low, high)
        due = [k for k in self._prefill_tokens if k < self._prefills_due]
        reduced = self._reduce_max([self._times.get(s, -1.0) for s in window]
                                   + [self._catchup_ms.get(s, -1.0) for s in window]
                                   + [self._prefill_ms.get(k, -1.0) for k in due])
        for s, ms in zip(window, reduced[: len(window)]):
            if ms > 0 and s in self._steps:
                mode_s, batch_s, kv_s = self._steps[s]
                self._sink(s, mode_s, batch_s, kv_s, ms)
        for s, ms in zip(window, reduced[len(window): 2 * len(window)]):
            if ms > 0 and s in self._catchup_tokens and self._catchup_sink is not None:
                self._catchup_sink(self._catchup_tokens[s], ms)
        for k, ms in zip(due, reduced[2 * len(window):]):
            if ms > 0:
                self._prefill_sink(self._prefill_tokens[k], ms)
            self._prefill_tokens.pop(k)
            self._prefill_ms.pop(k, None)
        self._prefills_due = self._prefills
        for table in (self._steps, self._times, self._catchup_tokens, self._catchup_ms):
            for s in [s for s in table if s < high]:
                del table[s]

