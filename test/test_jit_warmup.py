"""engine/jit_warmup.py on CPU: the start-up calls of sglang's request-slot kernel cover every
variant (power of two, argument dtypes, slot-pointer alignment) a speculative decode step can
meet, write nothing, and a failure does not stop the server."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import List, Set, Tuple

import pytest
import torch

from sglang_dynamic_eagle.engine import jit_warmup

REQUESTS = 48  # the request pool; the table has one row more
Key = Tuple[int, torch.dtype, bool]


def next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def variant(count: int, lengths: torch.Tensor, slots: torch.Tensor) -> Key:
    """What triton compiles a new variant for: the compile-time power of two, the dtype of the
    length tensors, whether the slot pointer is 16-byte aligned."""
    return next_power_of_2(count), lengths.dtype, slots.data_ptr() % 16 == 0


def met_under_traffic(requests: int) -> Set[Key]:
    """The variants a speculative decode step can meet (``alloc_for_spec_decode``: int32
    lengths, 1..requests requests, the slots a view at any offset into the int64 free list)."""
    free_list = torch.arange(1, 64, dtype=torch.int64)
    return {variant(count, torch.zeros(count, dtype=torch.int32), free_list[offset:offset + 1])
            for count in range(1, requests + 1) for offset in (0, 1)}


def recorded_warm_up(warm=jit_warmup.warm_request_slot_kernel) -> Tuple[Set[Key], torch.Tensor, int]:
    table = torch.arange((REQUESTS + 1) * 16, dtype=torch.int32).reshape(REQUESTS + 1, 16)
    before = table.clone()
    seen: List[Key] = []

    def assign(rows, req_to_token, start, end, slots, count):
        assert rows.shape[0] == start.shape[0] == end.shape[0] == count
        for i in range(count):  # the kernel: req_to_token[row, start:end] = next slots
            row, first, last = int(rows[i]), int(start[i]), int(end[i])
            req_to_token[row, first:last] = slots[:last - first].to(req_to_token.dtype)
        seen.append(variant(count, start, slots))

    calls = warm(table, REQUESTS, assign)
    assert torch.equal(table, before), "the warm-up wrote into the request table"
    return set(seen), table, calls


def runner(rows: int) -> SimpleNamespace:
    return SimpleNamespace(device=torch.device("cpu"), req_to_token_pool=SimpleNamespace(
        req_to_token=torch.zeros(rows, 16, dtype=torch.int32)))


def test_powers_of_two_cover_every_request_count() -> None:
    for limit in (1, 2, 3, 48, 64, 257):
        sizes = jit_warmup.powers_of_two_up_to(limit)
        assert {next_power_of_2(n) for n in range(1, limit + 1)} == set(sizes)


def test_the_warm_up_covers_every_variant_traffic_meets_and_writes_nothing() -> None:
    warmed, _, calls = recorded_warm_up()
    needed = met_under_traffic(REQUESTS)
    assert needed <= warmed, sorted(needed - warmed, key=str)
    assert calls == len(warmed) == 2 * len(jit_warmup.powers_of_two_up_to(REQUESTS))


def test_the_request_cap_bounds_the_warm_up() -> None:
    """sglang sizes the table beyond the running-request cap when no cap is given; the warm-up
    stops at the cap (no batch is larger), and at the table when the cap is larger."""
    table = torch.zeros(4097, 8, dtype=torch.int32)
    sizes = []
    jit_warmup.warm_request_slot_kernel(table, 48, lambda *args: sizes.append(args[-1]))
    assert sorted(set(sizes)) == [1, 2, 4, 8, 16, 32, 64]
    sizes.clear()
    jit_warmup.warm_request_slot_kernel(table[:9], 48, lambda *args: sizes.append(args[-1]))
    assert sorted(set(sizes)) == [1, 2, 4, 8]


def test_a_warm_up_of_aligned_slots_only_misses_variants() -> None:
    """Negative control: aligned slot pointers alone (the obvious warm-up) leave half the
    variants to compile under traffic."""
    def aligned_only(table, requests, assign):
        slots = torch.zeros(2, dtype=torch.int64)
        for count in jit_warmup.powers_of_two_up_to(requests):
            lengths = torch.zeros(count, dtype=torch.int32)
            assign(torch.zeros(count, dtype=torch.int64), table, lengths, lengths, slots[:1], count)
        return 0

    warmed, _, _ = recorded_warm_up(aligned_only)
    missed = met_under_traffic(REQUESTS) - warmed
    assert missed and all(not aligned for _, _, aligned in missed)


def test_a_failed_warm_up_is_logged_and_serving_goes_on(monkeypatch, caplog) -> None:
    """Each kernel's failure is logged on its own; the other is still compiled."""
    from sglang.srt.mem_cache import allocation
    from sglang.srt.model_executor import forward_batch_info

    def broken(*args):
        raise RuntimeError("no GPU here")

    positions = []
    monkeypatch.setattr(allocation, "assign_req_to_token_pool_func", broken)
    monkeypatch.setattr(forward_batch_info, "clamp_position", positions.append)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    with caplog.at_level(logging.INFO, logger=jit_warmup.__name__):
        jit_warmup.warm_sglang_jit_kernels(runner(REQUESTS + 1), REQUESTS)
    assert "no GPU here" in caplog.text and "could not pre-compile sglang's request-slot kernel" in caplog.text
    assert len(positions) == 1 and "pre-compiled sglang's DECODE-position kernel" in caplog.text


def test_the_start_up_warm_up_calls_sglangs_functions(monkeypatch, caplog) -> None:
    from sglang.srt.mem_cache import allocation
    from sglang.srt.model_executor import forward_batch_info

    calls, positions = [], []
    monkeypatch.setattr(allocation, "assign_req_to_token_pool_func", lambda *args: calls.append(args[-1]))
    monkeypatch.setattr(forward_batch_info, "clamp_position", positions.append)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    with caplog.at_level(logging.INFO, logger=jit_warmup.__name__):
        jit_warmup.warm_sglang_jit_kernels(runner(4097), REQUESTS)
    assert sorted(set(calls)) == [1, 2, 4, 8, 16, 32, 64] and len(calls) == 14
    assert "pre-compiled 14 variants of sglang's request-slot kernel" in caplog.text
    [seq_lens] = positions  # DECODE positions: one int64 sequence length on the runner's device
    assert seq_lens.dtype == torch.int64 and seq_lens.device == torch.device("cpu")


def test_a_warm_up_that_writes_is_caught() -> None:
    """Negative control of the no-write check: a range of one slot writes into the table."""
    def writes(table, requests, assign):
        slots = torch.full((2,), 7, dtype=torch.int64)
        assign(torch.zeros(1, dtype=torch.int64), table, torch.zeros(1, dtype=torch.int32),
               torch.ones(1, dtype=torch.int32), slots[:1], 1)
        return 1

    with pytest.raises(AssertionError, match="wrote into the request table"):
        recorded_warm_up(writes)
