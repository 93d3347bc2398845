"""draft_catchup.py on CPU: window sizing, the ring stash, the plan, the EXTEND view.

``_extend_batch`` and ``run`` get a small dataclass standing in for sglang's
``ScheduleBatch`` and a fake draft worker whose ``req_to_token`` is a CPU tensor.
Token ids, KV slots and hidden rows encode (request slot, position), so every
expected value below is written out by hand:

* token fed at position p by request slot r: ``1000 * r + p``
* target aux hidden row of (r, p): ``[r, p, 0.5]``
* ``req_to_token[r, p] = 100 * r + p``
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, List, Optional, Sequence, Tuple

import pytest
import torch

from sglang.srt.model_executor.forward_batch_info import ForwardMode

from sglang_dynamic_eagle.config import CATCHUP_WINDOW_ENV, MAX_WINDOW, load_config
from sglang_dynamic_eagle.engine import draft_catchup
from sglang_dynamic_eagle.engine.draft_catchup import (
    CatchupPlan,
    DraftCatchup,
    batch_req_pool_indices,
    choose_ring_size,
)
from sglang_dynamic_eagle.sglang_compat.startup_errors import StartupError

CPU = torch.device("cpu")
POOL_SIZE = 6
WINDOW = 4
RING = 64
HIDDEN = 3
MAX_LEN = 32


# ---------------------------------------------------------------- helpers


def _catchup(window: int = WINDOW, ring_size: int = RING) -> DraftCatchup:
    return DraftCatchup(
        req_pool_size=POOL_SIZE,
        ring_size=ring_size,
        max_window=window,
        hidden_width=HIDDEN,
        hidden_dtype=torch.float32,
        device=CPU,
    )


def _token(slot: int, position: int) -> int:
    return 1000 * slot + position


def _hidden_row(slot: int, position: int) -> List[float]:
    return [float(slot), float(position), 0.5]


def _plain_step(catchup: DraftCatchup, entries: Sequence[Tuple[int, int]]) -> None:
    """One plain decode step over (request slot, position) pairs, dtypes as in sglang."""
    slots = [slot for slot, _ in entries]
    positions = [position for _, position in entries]
    catchup.record_plain_step(
        slots,
        torch.tensor([_token(s, p) for s, p in entries], dtype=torch.int32),
        torch.tensor([_hidden_row(s, p) for s, p in entries], dtype=torch.bfloat16),
    )


def _two_request_history(catchup: DraftCatchup) -> None:
    """Slot 5: one plain step, then a prefill (forget). Slot 1: six plain steps
    at positions 20..25 (two more than the window). Slot 3: joins the last two
    steps at positions 10, 11."""
    _plain_step(catchup, [(5, 6)])
    catchup.forget([5])
    for position in range(20, 24):
        _plain_step(catchup, [(1, position)])
    _plain_step(catchup, [(3, 10), (1, 24)])
    _plain_step(catchup, [(3, 11), (1, 25)])


@dataclass
class FakeBatch:
    """The ScheduleBatch attributes that ``_extend_batch`` and ``run`` read."""

    reqs: List[str]
    seq_lens: torch.Tensor
    seq_lens_cpu: Optional[torch.Tensor]
    req_pool_indices: torch.Tensor
    req_pool_indices_cpu: torch.Tensor
    spec_info: Any = None
    sampling_info: Any = None
    forward_mode: ForwardMode = ForwardMode.DECODE
    input_ids: Optional[torch.Tensor] = None
    out_cache_loc: Optional[torch.Tensor] = None
    seq_lens_sum: Optional[int] = None
    return_logprob: bool = True
    has_grammar: bool = True
    extra: List[int] = field(default_factory=lambda: [1, 2, 3])


def _batch(*, with_seq_lens_cpu: bool = True, spec_info: Any = None) -> FakeBatch:
    """Rows: 0 -> slot 5 (len 7), 1 -> slot 3 (len 12), 2 -> slot 1 (len 26)."""
    seq_lens = torch.tensor([7, 12, 26], dtype=torch.int64)
    return FakeBatch(
        reqs=["req5", "req3", "req1"],
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.clone() if with_seq_lens_cpu else None,
        req_pool_indices=torch.tensor([5, 3, 1], dtype=torch.int64),
        req_pool_indices_cpu=torch.tensor([5, 3, 1], dtype=torch.int64),
        spec_info=spec_info,
        sampling_info=SimpleNamespace(temperatures=torch.tensor([1.0, 0.5, 0.7])),
        input_ids=torch.tensor([55, 33, 11]),
        out_cache_loc=torch.tensor([507, 312, 126]),
        seq_lens_sum=45,
    )


def _req_to_token() -> torch.Tensor:
    slots = torch.arange(POOL_SIZE, dtype=torch.int32).unsqueeze(1)
    positions = torch.arange(MAX_LEN, dtype=torch.int32).unsqueeze(0)
    return 100 * slots + positions


def _fake_draft_worker() -> SimpleNamespace:
    return SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=_req_to_token()))


def _extend(
    catchup: DraftCatchup, batch: FakeBatch, plan: CatchupPlan
) -> Tuple[Any, torch.Tensor]:
    rows = torch.tensor(plan.rows, dtype=torch.int64)
    return catchup._extend_batch(_fake_draft_worker(), batch, plan, rows)


# ---------------------------------------------------------------- ring size and window


@pytest.mark.parametrize(
    "budget, expected",
    [
        # per entry: 4 * 2 hidden bytes + 8 token bytes = 16 bytes
        (16 * 700, 700),
        (16 * 700 + 15, 700),
        (16 * 5, 10),  # never fewer entries than request slots
        (0, 10),
    ],
)
def test_choose_ring_size(budget: int, expected: int) -> None:
    assert choose_ring_size(budget, req_pool_size=10, hidden_width=4, elem_bytes=2) == expected


def test_max_window_is_256() -> None:
    assert MAX_WINDOW == 256


def test_max_window_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CATCHUP_WINDOW_ENV, raising=False)
    assert load_config().catchup_window == MAX_WINDOW
    monkeypatch.setenv(CATCHUP_WINDOW_ENV, "1")
    assert load_config().catchup_window == 1


@pytest.mark.parametrize("value", ["0", "257", "-1", "many"])
def test_bad_max_window_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(CATCHUP_WINDOW_ENV, value)
    with pytest.raises(StartupError, match=CATCHUP_WINDOW_ENV):
        load_config()


def test_stash_holds_ring_size_entries() -> None:
    catchup = DraftCatchup(req_pool_size=10, ring_size=700, max_window=256, hidden_width=4,
                           hidden_dtype=torch.bfloat16, device=CPU)
    # tokens: 700 * 8 bytes; hidden: 700 * 4 * 2 bytes
    assert catchup.stash_bytes == 700 * 16
    assert catchup.ring_size == 700 and catchup.max_window == 256


# ---------------------------------------------------------------- CatchupPlan


def test_plan_num_tokens_is_the_sum_of_lengths() -> None:
    assert CatchupPlan(rows=[0, 3], lengths=[5, 2], truncated_tokens=9).num_tokens == 7
    assert CatchupPlan(rows=[], lengths=[], truncated_tokens=0).num_tokens == 0


# ---------------------------------------------------------------- ring and plan


def test_fresh_stash_plans_nothing() -> None:
    assert _catchup().plan([0, 1, 2]) == CatchupPlan(rows=[], lengths=[], truncated_tokens=0)


def test_plain_steps_write_one_ring_entry_per_request_in_batch_order() -> None:
    catchup = _catchup()
    _two_request_history(catchup)
    # entries: (5, 6); (1, 20..23); (3, 10), (1, 24); (3, 11), (1, 25)
    assert catchup._tokens[:9].tolist() == [5006, 1020, 1021, 1022, 1023, 3010, 1024, 3011, 1025]
    assert catchup._hidden[:9, 1].tolist() == [6.0, 20.0, 21.0, 22.0, 23.0, 10.0, 24.0, 11.0, 25.0]
    assert catchup._tokens.dtype == torch.int64
    assert catchup._hidden.dtype == torch.float32


def test_the_ring_wraps_around() -> None:
    catchup = _catchup(ring_size=6)
    _two_request_history(catchup)
    # nine entries in a ring of six: entries 6, 7, 8 overwrote 0, 1, 2.
    assert catchup._tokens.tolist() == [1024, 3011, 1025, 1022, 1023, 3010]


def test_record_plain_step_takes_int64_token_ids() -> None:
    catchup = _catchup()
    catchup.record_plain_step(
        [2, 0],
        torch.tensor([2009, 4], dtype=torch.int64),
        torch.tensor([_hidden_row(2, 9), _hidden_row(0, 4)], dtype=torch.float32),
    )
    assert catchup._tokens[:2].tolist() == [2009, 4]
    assert catchup._hidden[0].tolist() == [2.0, 9.0, 0.5]
    assert catchup.plan([0, 1, 2]) == CatchupPlan(rows=[0, 2], lengths=[1, 1], truncated_tokens=0,
                                                  ring_entries=[1, 0])


def test_plan_rows_lengths_and_truncation() -> None:
    catchup = _catchup()
    _two_request_history(catchup)
    # row 0 (slot 5) was forgotten; row 1 (slot 3) missed 2; row 2 (slot 1)
    # missed 6 > window 4: length 4, 2 truncated.
    plan = catchup.plan([5, 3, 1])
    assert plan == CatchupPlan(rows=[1, 2], lengths=[2, 4], truncated_tokens=2,
                               ring_entries=[5, 7, 3, 4, 6, 8])
    assert plan.num_tokens == 6


def test_positions_the_ring_overwrote_are_truncated() -> None:
    """A ring of six holds entries 3..8: slot 1 keeps positions 22..25 (its last four), slot 3
    both of its positions; a small ring and a long window cut the same way."""
    catchup = _catchup(window=MAX_WINDOW, ring_size=6)
    _two_request_history(catchup)
    plan = catchup.plan([5, 3, 1])
    assert plan == CatchupPlan(rows=[1, 2], lengths=[2, 4], truncated_tokens=2,
                               ring_entries=[5, 7, 3, 4, 6, 8])


def test_a_row_with_nothing_left_in_the_ring_is_truncated_and_forgotten() -> None:
    catchup = _catchup(window=MAX_WINDOW, ring_size=POOL_SIZE)
    _plain_step(catchup, [(2, 7)])
    for position in range(POOL_SIZE):
        _plain_step(catchup, [(4, 30 + position)])
    plan = catchup.plan([2, 4])
    assert plan == CatchupPlan(rows=[1], lengths=[POOL_SIZE], truncated_tokens=1,
                               ring_entries=list(range(1, POOL_SIZE + 1)))
    assert catchup.plan([2]) == CatchupPlan(rows=[], lengths=[], truncated_tokens=0)


def test_plan_follows_batch_row_order() -> None:
    catchup = _catchup()
    _two_request_history(catchup)
    assert catchup.plan([1, 0, 3]) == CatchupPlan(rows=[0, 2], lengths=[4, 2], truncated_tokens=2,
                                                  ring_entries=[3, 4, 6, 8, 5, 7])


def test_missed_exactly_window_is_not_truncated() -> None:
    catchup = _catchup()
    for position in range(4):
        _plain_step(catchup, [(2, position)])
    assert catchup.plan([2]) == CatchupPlan(rows=[0], lengths=[4], truncated_tokens=0,
                                            ring_entries=[0, 1, 2, 3])


def test_forget_clears_only_the_given_slots() -> None:
    catchup = _catchup()
    _two_request_history(catchup)
    catchup.forget([1, 4])
    assert catchup.plan([5, 3, 1]) == CatchupPlan(rows=[1], lengths=[2], truncated_tokens=0,
                                                  ring_entries=[5, 7])


def test_missed_count_restarts_after_forget() -> None:
    catchup = _catchup()
    _two_request_history(catchup)
    catchup.forget([1])
    _plain_step(catchup, [(1, 26)])
    assert catchup.plan([1]) == CatchupPlan(rows=[0], lengths=[1], truncated_tokens=0,
                                            ring_entries=[9])


# ---------------------------------------------------------------- _extend_batch


def test_extend_batch_gathers_missed_positions_from_the_ring() -> None:
    catchup = _catchup()
    _two_request_history(catchup)
    batch = _batch()
    plan = catchup.plan([5, 3, 1])
    sub, hidden = _extend(catchup, batch, plan)

    # slot 3: seq len 12, 2 missed -> positions 10, 11.
    # slot 1: seq len 26, 6 missed, window 4 -> positions 22..25 only.
    assert sub.input_ids.tolist() == [3010, 3011, 1022, 1023, 1024, 1025]
    assert sub.input_ids.dtype == torch.int64
    assert sub.out_cache_loc.tolist() == [310, 311, 122, 123, 124, 125]
    assert sub.out_cache_loc.dtype == torch.int64
    assert hidden.tolist() == [
        [3.0, 10.0, 0.5],
        [3.0, 11.0, 0.5],
        [1.0, 22.0, 0.5],
        [1.0, 23.0, 0.5],
        [1.0, 24.0, 0.5],
        [1.0, 25.0, 0.5],
    ]


def test_extend_batch_shape_fields() -> None:
    catchup = _catchup()
    _two_request_history(catchup)
    sub, _ = _extend(catchup, _batch(), catchup.plan([5, 3, 1]))

    assert sub.reqs == ["req3", "req1"]
    assert sub.req_pool_indices.tolist() == [3, 1]
    assert sub.req_pool_indices_cpu.tolist() == [3, 1]
    assert sub.seq_lens.tolist() == [12, 26]
    assert sub.seq_lens.dtype == torch.int64
    assert sub.orig_seq_lens.tolist() == [12, 26]
    assert sub.orig_seq_lens.dtype == torch.int32
    assert sub.seq_lens_cpu.tolist() == [12, 26]
    assert sub.seq_lens_sum == 38
    assert sub.extend_lens == [2, 4]
    assert sub.prefix_lens == [10, 22]
    assert sub.extend_num_tokens == 6
    assert sub.extend_logprob_start_lens == [0, 0]
    assert sub.multimodal_inputs == [None, None]


def test_extend_batch_mode_and_cleared_fields() -> None:
    catchup = _catchup()
    _two_request_history(catchup)
    sub, _ = _extend(catchup, _batch(spec_info="draft-input"), catchup.plan([5, 3, 1]))

    assert sub.forward_mode == ForwardMode.EXTEND
    assert sub.global_forward_mode == ForwardMode.EXTEND
    assert sub.is_extend_in_batch is True
    assert sub.spec_info is None
    assert sub.return_logprob is False
    assert sub.has_grammar is False
    for name in (
        "extend_input_logprob_token_ids",
        "top_logprobs_nums",
        "token_ids_logprobs",
        "input_embeds",
        "chunked_req",
        "chunked_req_next_prompt_token",
    ):
        assert getattr(sub, name) is None, name


def test_extend_batch_leaves_the_decode_batch_untouched() -> None:
    catchup = _catchup()
    _two_request_history(catchup)
    batch = _batch(spec_info="draft-input")
    sampling_info = batch.sampling_info
    sub, _ = _extend(catchup, batch, catchup.plan([5, 3, 1]))

    assert sub is not batch
    assert batch.forward_mode == ForwardMode.DECODE
    assert batch.spec_info == "draft-input"
    assert batch.reqs == ["req5", "req3", "req1"]
    assert batch.seq_lens.tolist() == [7, 12, 26]
    assert batch.seq_lens_cpu.tolist() == [7, 12, 26]
    assert batch.seq_lens_sum == 45
    assert batch.req_pool_indices.tolist() == [5, 3, 1]
    assert batch.input_ids.tolist() == [55, 33, 11]
    assert batch.out_cache_loc.tolist() == [507, 312, 126]
    assert batch.return_logprob is True
    assert batch.has_grammar is True
    assert batch.sampling_info is sampling_info
    # sampling_info is a shallow copy, so a later filter of the sub-batch's
    # copy cannot rebind the decode batch's fields.
    assert sub.sampling_info is not sampling_info
    assert sub.sampling_info.temperatures is sampling_info.temperatures


def test_extend_batch_without_cpu_seq_lens() -> None:
    catchup = _catchup()
    _two_request_history(catchup)
    sub, _ = _extend(catchup, _batch(with_seq_lens_cpu=False), catchup.plan([5, 3, 1]))
    assert sub.seq_lens_cpu.tolist() == [12, 26]
    assert sub.seq_lens_sum == 38
    assert sub.prefix_lens == [10, 22]


def test_extend_batch_reads_the_lengths_the_plain_step_published() -> None:
    catchup = _catchup()
    _two_request_history(catchup)
    # Published lengths deliberately differ from the batch's GPU ones (they are equal on a
    # server): the sub-batch must take the published ones, not read the GPU tensor.
    catchup.plain_step_lengths.publish([1, 3, 5], torch.tensor([27, 13, 8]))
    sub, _ = _extend(catchup, _batch(with_seq_lens_cpu=False), catchup.plan([5, 3, 1]))
    assert sub.seq_lens_cpu.tolist() == [13, 27]
    assert sub.prefix_lens == [11, 23]


def test_extend_batch_reads_the_gpu_lengths_for_a_row_the_plain_step_did_not_have() -> None:
    catchup = _catchup()
    _two_request_history(catchup)
    catchup.plain_step_lengths.publish([3], torch.tensor([13]))
    sub, _ = _extend(catchup, _batch(with_seq_lens_cpu=False), catchup.plan([5, 3, 1]))
    assert sub.seq_lens_cpu.tolist() == [12, 26]


def test_a_cpu_mirror_of_the_lengths_wins_over_published_ones() -> None:
    catchup = _catchup()
    _two_request_history(catchup)
    catchup.plain_step_lengths.publish([1, 3, 5], torch.tensor([27, 13, 8]))
    sub, _ = _extend(catchup, _batch(), catchup.plan([5, 3, 1]))
    assert sub.seq_lens_cpu.tolist() == [12, 26]


def test_extend_batch_without_sampling_info() -> None:
    catchup = _catchup()
    _two_request_history(catchup)
    batch = _batch()
    batch.sampling_info = None
    sub, _ = _extend(catchup, batch, catchup.plan([5, 3, 1]))
    assert sub.sampling_info is None


def test_extend_batch_single_row_in_the_middle() -> None:
    catchup = _catchup()
    _plain_step(catchup, [(3, 11)])  # slot 3 committed 11, one plain step -> len 12
    sub, hidden = _extend(catchup, _batch(), catchup.plan([5, 3, 1]))
    assert sub.reqs == ["req3"]
    assert sub.input_ids.tolist() == [3011]
    assert sub.out_cache_loc.tolist() == [311]
    assert sub.prefix_lens == [11]
    assert sub.extend_lens == [1]
    assert hidden.tolist() == [[3.0, 11.0, 0.5]]


# ---------------------------------------------------------------- run


class FakeDraftWorker:
    """Records the ``_draft_extend_for_prefill`` call and returns fixed seeds."""

    def __init__(self) -> None:
        self.req_to_token_pool = SimpleNamespace(req_to_token=_req_to_token())
        self.calls: List[Tuple[Any, torch.Tensor, torch.Tensor]] = []

    def _draft_extend_for_prefill(
        self, batch: Any, hidden: torch.Tensor, next_tokens: torch.Tensor
    ) -> SimpleNamespace:
        self.calls.append((batch, hidden, next_tokens))
        return SimpleNamespace(
            topk_p=torch.tensor([[0.25], [0.75]], dtype=torch.float64),
            topk_index=torch.tensor([[42], [43]], dtype=torch.int32),
            hidden_states=torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64),
        )


def _draft_input() -> SimpleNamespace:
    return SimpleNamespace(
        bonus_tokens=torch.tensor([500, 300, 100], dtype=torch.int32),
        topk_p=torch.zeros((3, 1), dtype=torch.float32),
        topk_index=torch.zeros((3, 1), dtype=torch.int64),
        hidden_states=torch.zeros((3, 2), dtype=torch.bfloat16),
    )


def test_run_refreshes_the_caught_up_rows_and_forgets_them() -> None:
    catchup = _catchup()
    _two_request_history(catchup)
    draft_input = _draft_input()
    batch = _batch(spec_info=draft_input)
    worker = FakeDraftWorker()

    catchup.run(worker, batch, catchup.plan([5, 3, 1]))

    assert len(worker.calls) == 1
    sub, hidden, next_tokens = worker.calls[0]
    assert sub.extend_lens == [2, 4]
    assert sub.input_ids.tolist() == [3010, 3011, 1022, 1023, 1024, 1025]
    assert hidden[:, 1].tolist() == [10.0, 11.0, 22.0, 23.0, 24.0, 25.0]
    assert next_tokens.tolist() == [300, 100]  # bonus tokens of rows 1 and 2

    assert draft_input.topk_p.tolist() == [[0.0], [0.25], [0.75]]
    assert draft_input.topk_index.tolist() == [[0], [42], [43]]
    assert draft_input.hidden_states.tolist() == [[0.0, 0.0], [1.0, 2.0], [3.0, 4.0]]
    assert draft_input.topk_p.dtype == torch.float32
    assert draft_input.topk_index.dtype == torch.int64
    assert draft_input.hidden_states.dtype == torch.bfloat16

    assert batch.spec_info is draft_input
    assert batch.forward_mode == ForwardMode.DECODE
    assert catchup.plan([5, 3, 1]) == CatchupPlan(rows=[], lengths=[], truncated_tokens=0)


def test_slots_come_from_the_batch_as_formed_not_from_finished_requests() -> None:
    """With overlap turned off for a batch (grammar batches) a request that finished in the
    previous step is still in the batch, its req_pool_idx already None: the plain step and the
    catch-up read the slots the batch was formed with."""
    catchup = _catchup()
    batch = _batch()
    batch.reqs = [SimpleNamespace(req_pool_idx=5), SimpleNamespace(req_pool_idx=None),
                  SimpleNamespace(req_pool_idx=1)]
    slots = batch_req_pool_indices(batch)
    assert slots == [5, 3, 1]
    catchup.record_plain_step(slots, batch.input_ids, torch.zeros(3, HIDDEN))
    assert catchup.plan(batch_req_pool_indices(batch)).rows == [0, 1, 2]


class _NoGpuTime:
    def start(self) -> None:
        return None

    def stop(self, start, label: int = 0) -> None:
        pass


def test_catch_up_plans_a_batch_holding_a_finished_request() -> None:
    """The speculative path of the same case: catch_up plans from the batch's slots (the
    finished request's row included, as its step still computes it) instead of failing on
    its req_pool_idx of None."""
    catchup = _catchup()
    batch = _batch(spec_info=SimpleNamespace())
    catchup.record_plain_step([5, 3, 1], batch.input_ids, torch.zeros(3, HIDDEN))
    batch.reqs = [SimpleNamespace(req_pool_idx=5), SimpleNamespace(req_pool_idx=None),
                  SimpleNamespace(req_pool_idx=1)]
    catchup.gpu_time = _NoGpuTime()
    ran: List[CatchupPlan] = []
    catchup.run = lambda draft_worker, batch, plan: ran.append(plan)
    draft_worker = SimpleNamespace(draft_runner=SimpleNamespace(tp_group=None),
                                   draft_tp_context=lambda group: contextlib.nullcontext())
    plan = catchup.catch_up(draft_worker, batch, plan_stream=None)
    assert plan is not None and plan.rows == [0, 1, 2] and ran == [plan]


def test_extend_batch_gathers_across_the_ring_wrap() -> None:
    catchup = _catchup(window=MAX_WINDOW, ring_size=6)  # entries 6, 7, 8 overwrote 0, 1, 2
    _two_request_history(catchup)
    sub, hidden = _extend(catchup, _batch(), catchup.plan([5, 3, 1]))
    assert sub.input_ids.tolist() == [3010, 3011, 1022, 1023, 1024, 1025]
    assert hidden[:, 1].tolist() == [10.0, 11.0, 22.0, 23.0, 24.0, 25.0]


def test_a_catch_up_rebuilds_at_most_max_catchup_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three rows and a cap of 5 positions: each keeps its newest 5 // 3 = 1."""
    monkeypatch.setattr(draft_catchup, "MAX_CATCHUP_TOKENS", 5)
    catchup = _catchup()
    _two_request_history(catchup)
    _plain_step(catchup, [(0, 40), (3, 12), (1, 26)])
    plan = catchup.plan([0, 3, 1])
    assert plan == CatchupPlan(rows=[0, 1, 2], lengths=[1, 1, 1], truncated_tokens=0 + 2 + 6,
                               ring_entries=[9, 10, 11])
