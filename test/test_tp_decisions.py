"""Tensor-parallel agreement of the automatic policy, on CPU: three gloo ranks, no CUDA.

Every rank times its own decode steps (here: rank-specific simulated timings), so each rank's
``MeasuredCosts`` differ. The worker makes the decisions agree by building the cost table
from the element-wise MAX of all ranks' vectors (``DecodeCostTracker`` with
``tp_max_reducer``). ``DecodeCostTracker`` times steps with CUDA events, so the rank loop
below reproduces its decision path without them: one sample per decode step after the
first two steps of a run of one mode (``StepTimer`` with one settle step), a table rebuilt
every ``TABLE_REFRESH_STEPS`` steps from the reduced vector. A negative control builds each
rank's table from its own vector and must disagree.
"""

from __future__ import annotations

import datetime
import os
import queue
import random
import socket
import time
import traceback
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from sglang_dynamic_eagle.auto_policy import CostPolicy, CostPolicyConfig
from sglang_dynamic_eagle.cost_model import MeasuredCosts
from sglang_dynamic_eagle.policy import DecodeMode, StepObservation
from sglang_dynamic_eagle.step_costs import (
    TABLE_REFRESH_STEPS,
    cpu_group_max_reducer,
    tp_max_reducer,
)

WORLD_SIZE = 3
HOST = "127.0.0.1"
DEADLINE_S = 90.0  # a hang fails the test instead of blocking the suite
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=45)

PLAIN_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64)
SPEC_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48)
MAX_SPECULATIVE_BATCH = 48
ACCEPTANCE = 2.8  # the same on every rank (it comes from verify results)
SWITCH_PATIENCE = 4
# Batch sizes: 1 -> 40 -> 1, each size held for two steps, three times.
RAMP = [bs for bs in [*range(1, 41), *range(40, 0, -1)] for _ in range(2)]
BATCH_SIZES = RAMP * 3

Reducer = Callable[[list[float]], list[float]]


def base_cost(mode: DecodeMode, bucket: int) -> float:
    if mode is DecodeMode.PLAIN:
        return 6.0 + 0.15 * bucket
    return 7.0 + 0.6 * bucket


def rank_cost(rank: int, mode: DecodeMode, bucket: int) -> float:
    """Rank 0 is fast; rank 2's speculative steps are 60% slower. At acceptance 2.8 speculation
    pays up to the largest batch on rank 0 alone, only up to about 12 on rank 2."""
    factor = 1 + (0.3 if mode is DecodeMode.SPECULATIVE else 0.05) * rank
    return base_cost(mode, bucket) * factor


def simulate(rank: int, reduce_max: Reducer) -> dict[str, object]:
    """One rank's decode loop; returns its decisions, its own and the final reduced vector."""
    buckets = {DecodeMode.PLAIN: PLAIN_BUCKETS, DecodeMode.SPECULATIVE: SPEC_BUCKETS}
    # Calibration: identical on every rank (the worker all-reduces it at start-up).
    calibration = {
        mode: {b: 0.6 * base_cost(mode, b) for b in buckets[mode]} for mode in buckets
    }
    measured = MeasuredCosts(buckets, calibration)
    policy = CostPolicy(
        CostPolicyConfig(
            switch_patience=SWITCH_PATIENCE,
            max_speculative_batch=MAX_SPECULATIVE_BATCH,
            max_acceptance=4.0,
        )
    )
    rng = random.Random(1000 + rank)
    vector = reduce_max(measured.to_vector())
    table = measured.table(vector)
    modes: list[str] = []
    previous, run_length = None, 0
    for step, batch_size in enumerate(BATCH_SIZES, start=1):
        mode = policy.decide(StepObservation(batch_size, table, ACCEPTANCE))
        modes.append(mode.value)
        if mode is DecodeMode.SPECULATIVE and previous is DecodeMode.PLAIN:
            measured.add_catchup(30.0 * (1 + 0.2 * rank) * rng.uniform(0.9, 1.1))
        run_length = run_length + 1 if mode is previous else 1
        previous = mode
        bucket = measured.bucket_of(mode, batch_size)
        if run_length > 2 and bucket is not None:
            noise = 1 + rng.uniform(-0.03, 0.03)
            measured.add_step(mode, bucket, rank_cost(rank, mode, bucket) * noise)
        if step % TABLE_REFRESH_STEPS == 0:
            vector = reduce_max(measured.to_vector())
            table = measured.table(vector)
    return {"modes": modes, "local_vector": measured.to_vector(), "table_vector": vector}


def _rank_main(rank: int, port: int, results) -> None:
    """A spawned rank: join the gloo group, run both variants, report through ``results``."""
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's pair sockets on the loopback only
        # The store as init_method=f"tcp://{HOST}:{port}" builds it, but rank 0's server
        # listens on a socket bound to the loopback (init_method would listen on all
        # interfaces).
        listener = None
        if rank == 0:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((HOST, port))
            listener.listen(WORLD_SIZE * 4)
        store = dist.TCPStore(
            HOST,
            port,
            WORLD_SIZE,
            is_master=rank == 0,
            timeout=COLLECTIVE_TIMEOUT,
            **({"master_listen_fd": listener.fileno()} if listener is not None else {}),
        )
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=WORLD_SIZE, timeout=COLLECTIVE_TIMEOUT
        )
        group = dist.group.WORLD
        # tp_max_reducer, as the worker calls it, hands a multi-rank group to the CPU reducer.
        tp_group = SimpleNamespace(world_size=WORLD_SIZE, cpu_group=group)
        probe = tp_max_reducer(tp_group)([float(rank), -float(rank), 0.5 * rank])
        agreed = simulate(rank, cpu_group_max_reducer(group))
        local = simulate(rank, list)  # negative control: no all-reduce
        dist.barrier()
        dist.destroy_process_group()
        results.put((rank, "ok", {"agreed": agreed, "local": local, "probe": probe}))
    except BaseException:  # report anything, a failed import included, to the parent
        results.put((rank, "error", traceback.format_exc()))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def rank_results() -> dict[int, dict[str, object]]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    processes = [
        ctx.Process(target=_rank_main, args=(rank, port, results), daemon=True)
        for rank in range(WORLD_SIZE)
    ]
    for process in processes:
        process.start()
    collected: dict[int, dict[str, object]] = {}
    errors: list[str] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(collected) + len(errors) < WORLD_SIZE:
            remaining = deadline - time.monotonic()
            try:
                rank, status, payload = results.get(timeout=max(remaining, 0.1))
            except queue.Empty:
                pytest.fail(
                    f"ranks {sorted(set(range(WORLD_SIZE)) - set(collected))} did not report "
                    f"within {DEADLINE_S:.0f} s (errors so far: {errors})"
                )
            if status == "ok":
                collected[rank] = payload
            else:
                errors.append(f"rank {rank}:\n{payload}")
                break  # the other ranks now hang in a collective until its timeout
        if errors:
            pytest.fail("\n".join(errors))
        for process in processes:
            process.join(timeout=max(deadline - time.monotonic(), 1.0))
            assert not process.is_alive(), f"rank process {process.pid} did not exit"
            assert process.exitcode == 0, f"rank process {process.pid} exit code {process.exitcode}"
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
                if process.is_alive():
                    process.kill()
        results.close()
    return collected


def test_ranks_with_reduced_tables_decide_identically(rank_results) -> None:
    agreed = [rank_results[rank]["agreed"] for rank in range(WORLD_SIZE)]
    modes = [result["modes"] for result in agreed]
    assert len(modes[0]) == len(BATCH_SIZES)
    for rank in range(1, WORLD_SIZE):
        diverging = [i for i, (a, b) in enumerate(zip(modes[0], modes[rank])) if a != b]
        assert not diverging, f"rank {rank} differs from rank 0 at steps {diverging[:10]}"
    # The run exercised both modes, with switches both ways.
    assert set(modes[0]) == {DecodeMode.SPECULATIVE.value, DecodeMode.PLAIN.value}
    switches = sum(a != b for a, b in zip(modes[0], modes[0][1:]))
    assert switches >= 4
    # The same final table everywhere, built from timings that were not the same.
    table_vectors = [result["table_vector"] for result in agreed]
    assert all(vector == table_vectors[0] for vector in table_vectors)
    local_vectors = [result["local_vector"] for result in agreed]
    assert len({tuple(vector) for vector in local_vectors}) == WORLD_SIZE
    assert table_vectors[0] == [max(column) for column in zip(*local_vectors)]


def test_reduced_table_follows_the_slowest_rank(rank_results) -> None:
    # Speculation stops at small batches: the slow rank's costs decide, not rank 0's.
    modes = rank_results[0]["agreed"]["modes"]
    at_batch = {}
    for batch_size, mode in zip(BATCH_SIZES, modes):
        at_batch.setdefault(batch_size, []).append(mode)
    plain_share = {bs: ms.count("plain") / len(ms) for bs, ms in at_batch.items()}
    assert all(plain_share[bs] >= 0.5 for bs in range(25, 41)), plain_share
    assert all(plain_share[bs] <= 0.5 for bs in range(1, 5)), plain_share


def test_without_allreduce_ranks_disagree(rank_results) -> None:
    # Negative control: the same run with each rank's own table must not agree, or the test
    # above could not fail.
    local = [rank_results[rank]["local"]["modes"] for rank in range(WORLD_SIZE)]
    assert any(modes != local[0] for modes in local[1:])
    # The fast rank speculates at batch sizes where the slow rank decodes plainly.
    fast = sum(m == "speculative" for bs, m in zip(BATCH_SIZES, local[0]) if bs > 24)
    slow = sum(m == "speculative" for bs, m in zip(BATCH_SIZES, local[2]) if bs > 24)
    assert fast > slow + 10, (fast, slow)
    # Local tables are not the same either.
    vectors = [tuple(rank_results[rank]["local"]["table_vector"]) for rank in range(WORLD_SIZE)]
    assert len(set(vectors)) == WORLD_SIZE


def test_tp_max_reducer_over_ranks(rank_results) -> None:
    for rank in range(WORLD_SIZE):
        assert rank_results[rank]["probe"] == [2.0, 0.0, 1.0]


@pytest.mark.parametrize("tp_group", [None, SimpleNamespace(world_size=1, cpu_group=None)])
def test_tp_max_reducer_single_rank_is_identity(tp_group) -> None:
    reduce_max = tp_max_reducer(tp_group)
    values = [3.0, 1.0, 2.0]
    assert reduce_max(values) == values
    assert reduce_max(values) is not values


def test_simulation_agrees_with_in_process_max() -> None:
    # The same three ranks in lockstep in one process, with a MAX over their vectors: a check
    # of the simulation itself, independent of torch.distributed.
    import threading

    barrier = threading.Barrier(WORLD_SIZE)
    slots: list[list[float]] = [[] for _ in range(WORLD_SIZE)]
    outputs: dict[int, dict[str, object]] = {}

    def reducer(rank: int) -> Reducer:
        def reduce(values: list[float]) -> list[float]:
            slots[rank] = list(values)
            barrier.wait(timeout=10)
            reduced = [max(column) for column in zip(*slots)]
            barrier.wait(timeout=10)
            return reduced

        return reduce

    threads = [
        threading.Thread(target=lambda r=r: outputs.__setitem__(r, simulate(r, reducer(r))))
        for r in range(WORLD_SIZE)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outputs) == list(range(WORLD_SIZE))
    modes = [outputs[r]["modes"] for r in range(WORLD_SIZE)]
    assert modes[1] == modes[0] and modes[2] == modes[0]
