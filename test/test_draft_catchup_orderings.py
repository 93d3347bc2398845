"""The catch-up's per-slot bookkeeping under the orderings a busy scheduler produces (CPU).

sglang 0.5.17 hands a request pool slot out at each prefill and takes it back when a request
finishes, is aborted or is retracted (the KV pool ran out; the request is prefilled again later
with what it had generated). Under overlap scheduling, a request that finished can still be in
the next decode batch. A randomised schedule of prefills (new and retracted requests, into
reused slots), retractions, finishes (some left in one more batch), plain steps and speculative
steps drives ``DraftCatchup`` as the worker does. At every speculative step, each planned row's
catch-up must rebuild exactly the newest positions that request decoded plainly: its own tokens,
its own target hidden states, and its own KV slots.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from sglang_dynamic_eagle.engine.draft_catchup import DraftCatchup

POOL, MAX_LEN, STEPS, SEEDS = 12, 4000, 400, 40
# (catch-up window, ring entries): windows below and above a request's plain stretch, rings
# that wrap within a stretch and one that never does.
SHAPES = ((4, 12), (256, 12), (3, 40), (256, 1000))


def schedule(seed: int, window: int, ring: int, forget_at_prefill: bool = True) -> int:
    """Runs one random schedule; returns the catch-up rows it checked."""
    rng = random.Random(seed)
    catchup = DraftCatchup(req_pool_size=POOL, ring_size=ring, max_window=window, hidden_width=3,
                           hidden_dtype=torch.float64, device=torch.device("cpu"))
    req_to_token = torch.arange(POOL).unsqueeze(1) * 100000 + torch.arange(MAX_LEN).unsqueeze(0)
    worker = SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=req_to_token))
    free = list(range(1, POOL))
    running, waiting, finished_last_step = [], [], []
    next_id, checked = 0, 0
    for _ in range(STEPS):
        event = rng.random()
        if event < 0.15 and free:  # a prefill batch: new requests, or retracted ones again
            slots = []
            for _ in range(min(rng.randint(1, 3), len(free))):
                if waiting and rng.random() < 0.5:
                    request = waiting.pop(0)
                else:
                    next_id += 1
                    request = {"id": next_id, "length": rng.randint(5, 50)}
                request.update(slot=free.pop(rng.randrange(len(free))), plain=[])
                slots.append(request["slot"])
                running.append(request)
            if forget_at_prefill:
                catchup.forget(slots)  # as the worker does for every prefill batch
            continue
        if event < 0.22 and len(running) > 1:  # retraction: the slot is free at once
            request = running.pop(rng.randrange(len(running)))
            free.append(request["slot"])
            waiting.append(request)
            continue
        batch = running + finished_last_step  # overlap: a request that finished runs once more
        free += [request["slot"] for request in finished_last_step]
        finished_last_step = []
        if not batch:
            continue
        slots = [request["slot"] for request in batch]
        if rng.random() < 0.6:  # a plain step stashes each row's token and hidden state
            catchup.record_plain_step(
                slots, torch.tensor([r["id"] * 10000 + r["length"] for r in batch]),
                torch.tensor([[r["id"], r["length"], 0.5] for r in batch], dtype=torch.float64))
            for request in batch:
                request["plain"].append(request["length"])
                request["length"] += 1
        else:  # a speculative step, after catching up
            plan = catchup.plan(slots)
            if plan.rows:
                lengths = torch.tensor([r["length"] for r in batch])
                decode = SimpleNamespace(reqs=batch, seq_lens=lengths, seq_lens_cpu=lengths.clone(),
                                         req_pool_indices=torch.tensor(slots),
                                         req_pool_indices_cpu=torch.tensor(slots), sampling_info=None,
                                         spec_info=None)
                extend, hidden = catchup._extend_batch(worker, decode, plan, torch.tensor(plan.rows))
                start = 0
                for row, n in zip(plan.rows, plan.lengths):
                    request = batch[row]
                    assert 1 <= n <= window
                    positions = list(range(request["length"] - n, request["length"]))
                    assert set(positions) <= set(request["plain"]), (seed, request, positions)
                    assert extend.input_ids[start:start + n].tolist() == [
                        request["id"] * 10000 + p for p in positions], (seed, request, positions)
                    assert hidden[start:start + n, :2].tolist() == [[request["id"], p] for p in positions]
                    assert extend.out_cache_loc[start:start + n].tolist() == [
                        request["slot"] * 100000 + p for p in positions]
                    start += n
                    checked += 1
                catchup.forget([slots[row] for row in plan.rows])
            for request in batch:
                request["plain"] = []
                request["length"] += rng.randint(1, 4)  # accepted drafts and the bonus token
        for request in list(running):
            if rng.random() < 0.05:  # finished: its slot is freed now or after one more batch
                running.remove(request)
                if rng.random() < 0.5:
                    finished_last_step.append(request)
                else:
                    free.append(request["slot"])
    return checked


@pytest.mark.parametrize("window, ring", SHAPES)
def test_catch_up_rebuilds_each_requests_own_newest_plain_positions(window: int, ring: int) -> None:
    checked = sum(schedule(seed, window, ring) for seed in range(SEEDS))
    assert checked > 1000  # the schedules reach the catch-up often


def test_a_slot_not_forgotten_at_prefill_is_caught() -> None:
    """Negative control: without the forget at each prefill, a reused slot's stale stash reaches
    the next request that holds the slot."""
    with pytest.raises(AssertionError):
        for seed in range(SEEDS):
            schedule(seed, 4, 12, forget_at_prefill=False)
