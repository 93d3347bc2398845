"""deferred_draft_prefill.py and the catch-up ring's prefill tail, on CPU.

Token ids and hidden rows encode (request slot, position) as in test_draft_catchup.py:
token fed at position p by slot r is ``1000 * r + p``, its aux hidden row ``[r, p, 0.5]``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import List, Sequence, Tuple

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

from sglang_dynamic_eagle.deferred_draft_prefill import (
    DEFER_ENV,
    DeferredDraftPrefill,
    RunningRequests,
    StubProposals,
    can_defer,
    decode_at_most_once,
    deferred_prefill_window,
)
from sglang_dynamic_eagle.draft_catchup import MAX_WINDOW, DraftCatchup
from sglang_dynamic_eagle.short_requests import ShortPrefill
from sglang_dynamic_eagle.startup_errors import StartupError

POOL_SIZE = 6
HIDDEN = 3


def _catchup(window: int = 4, ring_size: int = 64) -> DraftCatchup:
    return DraftCatchup(req_pool_size=POOL_SIZE, ring_size=ring_size, max_window=window,
                        hidden_width=HIDDEN, hidden_dtype=torch.float32,
                        device=torch.device("cpu"))


def _extend(segments: Sequence[Tuple[int, int, int]]) -> Tuple[List[int], List[int], List[int],
                                                               torch.Tensor, torch.Tensor]:
    """A prefill batch over (slot, first position, length) segments: slots, extend lengths,
    the lengths it leaves, the fed token ids and the target's aux hidden rows, flattened as
    sglang lays them out."""
    slots, lengths, seq_lens, tokens, hidden = [], [], [], [], []
    for slot, first, length in segments:
        slots.append(slot)
        lengths.append(length)
        seq_lens.append(first + length)
        for position in range(first, first + length):
            tokens.append(1000 * slot + position)
            hidden.append([float(slot), float(position), 0.5])
    return slots, lengths, seq_lens, torch.tensor(tokens, dtype=torch.int32), torch.tensor(hidden)


def _stashed(catchup: DraftCatchup, slots: Sequence[int]) -> Tuple[List[int], List[List[float]]]:
    plan = catchup.plan(slots)
    ring = [entry % catchup.ring_size for entry in plan.ring_entries]
    return catchup._tokens[ring].tolist(), catchup._hidden[ring].tolist()


# ------------------------------------------------------------- the ring's prefill tail


def test_each_request_stashes_its_last_window_positions() -> None:
    catchup = _catchup()
    catchup.record_prefill_tail(*_extend([(2, 0, 7), (4, 3, 2)]), window=3)
    plan = catchup.plan([2, 4])
    assert (plan.rows, plan.lengths, plan.truncated_tokens) == ([0, 1], [3, 2], 0)
    tokens, hidden = _stashed(catchup, [2, 4])
    assert tokens == [2004, 2005, 2006, 4003, 4004]
    assert hidden == [[2.0, 4.0, 0.5], [2.0, 5.0, 0.5], [2.0, 6.0, 0.5],
                      [4.0, 3.0, 0.5], [4.0, 4.0, 0.5]]


def test_plain_steps_after_a_deferred_prefill_extend_the_same_run_of_positions() -> None:
    catchup = _catchup(window=8)
    catchup.record_prefill_tail(*_extend([(1, 0, 10)]), window=2)
    for position in (10, 11):
        catchup.record_plain_step([1], torch.tensor([1000 + position]),
                                  torch.tensor([[1.0, float(position), 0.5]]))
    plan = catchup.plan([1])
    assert plan.lengths == [4]
    assert _stashed(catchup, [1])[0] == [1008, 1009, 1010, 1011]


def test_a_deferred_prefill_replaces_what_the_slot_had_missed_before() -> None:
    catchup = _catchup()
    catchup.record_plain_step([3], torch.tensor([3005]), torch.tensor([[3.0, 5.0, 0.5]]))
    catchup.record_prefill_tail(*_extend([(3, 0, 4)]), window=2)
    assert catchup.plan([3]).lengths == [2]
    assert _stashed(catchup, [3])[0] == [3002, 3003]


def test_the_tail_is_cut_to_the_catchup_window_and_to_what_the_ring_holds() -> None:
    narrow = _catchup(window=2)
    narrow.record_prefill_tail(*_extend([(0, 0, 6)]), window=5)
    assert narrow.plan([0]).lengths == [2]
    small_ring = _catchup(window=8, ring_size=6)
    small_ring.record_prefill_tail(*_extend([(0, 0, 6), (1, 0, 6)]), window=8)
    plan = small_ring.plan([0, 1])
    assert plan.lengths == [3, 3]
    assert _stashed(small_ring, [0, 1])[0] == [3, 4, 5, 1003, 1004, 1005]


# ------------------------------------------------------------- the flag


def test_off_unless_the_environment_sets_a_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEFER_ENV, raising=False)
    assert deferred_prefill_window() == 0
    monkeypatch.setenv(DEFER_ENV, "64")
    assert deferred_prefill_window() == 64


@pytest.mark.parametrize("value", ["-1", "x", "1.5", str(MAX_WINDOW + 1)])
def test_a_bad_window_is_refused_in_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(DEFER_ENV, value)
    with pytest.raises(StartupError) as error:
        deferred_prefill_window()
    message = str(error.value)
    assert DEFER_ENV in message and "\n" not in message


# ------------------------------------------------------------- which batches, and the run


def _prefill_batch(mode: ForwardMode = ForwardMode.EXTEND, input_embeds=None,
                   multimodal_inputs=(None, None)) -> SimpleNamespace:
    slots, lengths, _, tokens, _ = _extend([(2, 0, 3), (5, 4, 2)])
    return SimpleNamespace(
        forward_mode=mode, input_embeds=input_embeds, multimodal_inputs=list(multimodal_inputs),
        req_pool_indices_cpu=torch.tensor(slots), extend_lens=lengths, prefix_lens=[0, 4],
        input_ids=tokens,
        extend_num_tokens=sum(lengths), seq_lens=torch.tensor([3, 6]),
    )


def test_only_text_prefills_are_deferred() -> None:
    assert can_defer(_prefill_batch())
    assert not can_defer(_prefill_batch(mode=ForwardMode.MIXED))
    assert not can_defer(_prefill_batch(input_embeds=torch.zeros(5, 4)))
    assert not can_defer(_prefill_batch(multimodal_inputs=(None, object())))


class FakeTarget:
    """A target extend, which returns hidden states only when asked to capture them."""

    def __init__(self) -> None:
        self.capture_modes: List[CaptureHiddenMode] = []

    def forward_batch_generation(self, batch, capture_hidden_mode=None):
        self.capture_modes.append(capture_hidden_mode)
        captures = capture_hidden_mode != CaptureHiddenMode.NULL
        hidden = _extend([(2, 0, 3), (5, 4, 2)])[4] if captures else None
        return SimpleNamespace(
            logits_output=SimpleNamespace(hidden_states=hidden),
            next_token_ids=torch.tensor([2003, 5006]),
        )


class FakePlainStep:
    def draft_input_stub(self, bonus_tokens: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(stub=True, bonus_tokens=bonus_tokens)


def test_the_run_is_the_target_extend_then_the_stash() -> None:
    catchup = _catchup()
    target = FakeTarget()
    deferred = DeferredDraftPrefill(target, catchup, FakePlainStep(), window=2,
                                    short_prefill=ShortPrefill.SEPARATE_CACHE)
    published: List[torch.Tensor] = []
    batch = _prefill_batch()
    result = deferred.run(batch, published.append, 2)

    assert target.capture_modes == [CaptureHiddenMode.FULL]
    assert [lens.tolist() for lens in published] == [[3, 6]]
    assert result.new_seq_lens.tolist() == [3, 6]
    assert result.next_draft_input.stub
    assert result.next_draft_input.bonus_tokens.tolist() == [2003, 5006]
    assert catchup.plan([2, 5]).lengths == [2, 2]
    assert _stashed(catchup, [2, 5])[0] == [2001, 2002, 5004, 5005]
    assert deferred.report() == {
        "deferred_draft_prefill_window": 2,
        "short_prefill": "separate-cache",
        "deferred_draft_prefill_batches": 1,
        "deferred_draft_prefill_tokens": 5,
        "deferred_draft_prefill_unstashed_batches": 0,
    }


def test_a_run_with_no_window_stashes_nothing_and_forgets_what_the_slots_missed() -> None:
    catchup = _catchup()
    catchup.record_plain_step([2], torch.tensor([2010]), torch.tensor([[2.0, 10.0, 0.5]]))
    target = FakeTarget()
    deferred = DeferredDraftPrefill(target, catchup, FakePlainStep(), window=2,
                                    short_prefill=ShortPrefill.SEPARATE_CACHE)
    deferred.run(_prefill_batch(), None, 0)
    assert target.capture_modes == [CaptureHiddenMode.NULL]
    assert catchup.plan([2, 5]).rows == []
    assert not catchup._prefill_lengths  # so plain steps have no lengths to drop
    assert deferred.report()["deferred_draft_prefill_unstashed_batches"] == 1


def _asking_for(*max_new_tokens) -> SimpleNamespace:
    return SimpleNamespace(reqs=[SimpleNamespace(sampling_params=SimpleNamespace(max_new_tokens=n))
                                 for n in max_new_tokens])


def test_only_a_prefill_whose_requests_all_ask_for_two_tokens_or_fewer_decodes_once() -> None:
    assert decode_at_most_once(_asking_for(2, 1, 0))
    assert not decode_at_most_once(_asking_for(2, 3))
    assert not decode_at_most_once(_asking_for(None))


def test_the_run_needs_no_publish_callback() -> None:
    deferred = DeferredDraftPrefill(FakeTarget(), _catchup(), FakePlainStep(), window=1,
                                    short_prefill=ShortPrefill.SEPARATE_CACHE)
    assert deferred.run(_prefill_batch(), None, 1).new_seq_lens.tolist() == [3, 6]


def test_a_catch_up_right_after_a_deferred_prefill_reads_the_prefill_lengths() -> None:
    """Slot 2's previous request was in the latest plain step at length 40; its new request,
    prefilled deferred over 10 positions, is caught up by the next (speculative) step on a
    backend without a CPU mirror of the lengths."""
    catchup = _catchup()
    catchup.plain_step_lengths.publish([2, 4], torch.tensor([40, 7]))
    catchup.record_plain_step([2, 4], torch.tensor([2039, 4006]),
                              torch.tensor([[2.0, 39.0, 0.5], [4.0, 6.0, 0.5]]))
    catchup.record_prefill_tail(*_extend([(2, 0, 10)]), window=3)
    batch = SimpleNamespace(seq_lens_cpu=None, req_pool_indices_cpu=torch.tensor([2, 4]))
    plan = catchup.plan([2, 4])
    assert catchup._lengths_on_host(batch, plan, torch.tensor([10, 8])) == [10, 7]


def test_a_plain_step_after_a_deferred_prefill_makes_its_lengths_the_newest() -> None:
    catchup = _catchup()
    catchup.record_prefill_tail(*_extend([(2, 0, 10)]), window=3)
    catchup.plain_step_lengths.publish([2], torch.tensor([11]))
    catchup.record_plain_step([2], torch.tensor([2010]), torch.tensor([[2.0, 10.0, 0.5]]))
    batch = SimpleNamespace(seq_lens_cpu=None, req_pool_indices_cpu=torch.tensor([2]))
    assert catchup._lengths_on_host(batch, catchup.plan([2]), torch.tensor([11])) == [11]


def test_running_requests_are_the_latest_decode_step_and_the_prefills_since() -> None:
    def request(finished: bool = False) -> SimpleNamespace:
        return SimpleNamespace(finished=lambda: finished)

    running = RunningRequests()
    retracted, decoding, done = request(), request(), request(finished=True)
    running.prefilled([retracted, decoding])
    assert running.count() == 2
    running.decoded([decoding, done])  # the retracted request left the running batch unfinished
    running.prefilled([decoding, request()])  # a request is counted once
    assert running.count() == 2


def test_stub_proposals_are_the_rows_of_requests_prefilled_without_a_stash() -> None:
    done = {"finished": False}
    short, other = SimpleNamespace(finished=lambda: done["finished"]), SimpleNamespace()
    stubs = StubProposals()
    stubs.speculative_step([other])  # before any such prefill
    stubs.prefilled([short])
    stubs.speculative_step([other, short])
    assert stubs.drafted([2]) == [2]
    assert stubs.drafted([2, 0]) == [2]
    assert stubs.drafted([1, 1]) == [1, 1]  # a result with no step pending: nothing left out
    done["finished"] = True
    stubs.prefilled([])
    stubs.speculative_step([other, short])  # a finished request is forgotten
    assert stubs.drafted([2, 0]) == [2, 0]
