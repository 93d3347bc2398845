"""The parts of step_costs that run without a GPU: which graphs start-up calibration may replay,
the tensor-parallel reducer for one rank, and when the cost table is refreshed."""

from __future__ import annotations

from types import SimpleNamespace

from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

from sglang_dynamic_eagle import step_costs
from sglang_dynamic_eagle.cost_model import MeasuredCosts
from sglang_dynamic_eagle.policy import DecodeMode


class _NotFullBackend:
    """Stands for sglang's breakable or piecewise graph backends: replaying one would fail."""

    def replay_session(self):
        raise AssertionError("a graph that is not a full CUDA graph must not be replayed")

    def replay(self, key, forward_batch):
        raise AssertionError("a graph that is not a full CUDA graph must not be replayed")


def test_calibration_skips_graphs_that_are_not_full_cuda_graphs() -> None:
    runner = SimpleNamespace(backend=_NotFullBackend(), capture_bs=[1, 2, 4])
    table = step_costs.calibrate(
        {DecodeMode.PLAIN: [runner], DecodeMode.SPECULATIVE: []},
        {DecodeMode.PLAIN: [1, 2, 4], DecodeMode.SPECULATIVE: [1]},
    )
    assert table == {DecodeMode.PLAIN: {}, DecodeMode.SPECULATIVE: {}}


def test_only_full_cuda_graph_backends_count_as_replayable() -> None:
    full = SimpleNamespace(backend=object.__new__(FullCudaGraphBackend))
    assert step_costs._replays_whole_graphs(full)
    assert not step_costs._replays_whole_graphs(SimpleNamespace(backend=_NotFullBackend()))


def test_graph_keys_by_batch_size_or_by_tokens_for_ragged_verify() -> None:
    runner = SimpleNamespace(_make_graph_key=lambda size: ("key", size), captured_req_width=4)
    assert step_costs._graph_key(runner, 8) == ("key", 8)
    runner.ragged_verify_mode = True
    assert step_costs._graph_key(runner, 8) == ("key", 32)


def test_one_rank_reduces_to_a_copy() -> None:
    reduce = step_costs.tp_max_reducer(SimpleNamespace(world_size=1))
    values = [1.0, -2.0]
    assert reduce(values) == values and reduce(values) is not values
    assert step_costs.tp_max_reducer(None)([3.0]) == [3.0]


class _NoTimings:
    """A StepTimer stand-in whose steps yield no samples (CUDA events need a GPU)."""

    def step_done(self, mode: DecodeMode, bucket) -> None:
        pass

    def finished(self):
        return iter(())


def _tracker(refresh_steps: int) -> step_costs.DecodeCostTracker:
    measured = MeasuredCosts({DecodeMode.PLAIN: [1, 2], DecodeMode.SPECULATIVE: [1, 2]}, {})
    reductions = []

    def reduce_max(vector):
        reductions.append(list(vector))
        return vector

    tracker = step_costs.DecodeCostTracker(measured, reduce_max, refresh_steps)
    tracker._timer = _NoTimings()
    tracker.reductions = reductions
    return tracker


def test_cost_table_refreshes_every_refresh_steps_or_when_asked() -> None:
    tracker = _tracker(refresh_steps=4)
    refreshed = [tracker.step_done(DecodeMode.PLAIN, 1) for _ in range(8)]
    assert refreshed == [False, False, False, True] * 2
    assert tracker.step_done(DecodeMode.PLAIN, 1, refresh=True)
    assert len(tracker.reductions) == 1 + 2 + 1  # start-up, two periodic, one asked for
