"""tools/dispatch_cost.py: it times every step of a committed trace, by mode and batch range (a
diagnostic: no time is asserted)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import dispatch_cost  # noqa: E402

TRACE = ROOT / "test/data/traces/h200-dummy8b-fa3-defaults.jsonl.xz"


def test_every_step_of_the_trace_is_timed_once_in_its_mode_and_batch_row():
    from sglang_dynamic_eagle.policy.replay import load_recorded

    steps, _ = load_recorded(TRACE)
    rows = dispatch_cost.time_trace(TRACE)
    for mode in ("plain", "speculative"):
        for low, high in dispatch_cost.RANGES:
            expected = sum(1 for s in steps if s.mode.value == mode and low <= s.batch <= high)
            assert len(rows.get((mode, (low, high)), [])) == expected
    assert all(0 < chosen + before <= t for times in rows.values() for t, chosen, before in times)


def test_the_parts_hold_the_decision_then_the_launch_and_not_the_steps_results(monkeypatch):
    # The view of the batch is made at the batch's choice, a speculative step's requests are
    # noted after it and before the launch, the decision log's entry follows the launch: each
    # made to last 0.3 ms on a clock that only they move (the rest of the work takes no time
    # on it, so the parts are exact however fast this machine is).
    from types import SimpleNamespace

    clock = [0.0]

    def lasting(work=lambda *args: None):
        def timed(*args):
            clock[0] += 3e-4
            return work(*args)
        return timed

    view = dispatch_cost.observe
    monkeypatch.setattr(dispatch_cost, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(dispatch_cost, "observe", lasting(view))
    monkeypatch.setattr(dispatch_cost.RequestAcceptance, "launched", lasting())
    monkeypatch.setattr(dispatch_cost.PolicyFeed, "step_end", lasting())
    rows = dispatch_cost.time_trace(TRACE)
    assert rows
    for (mode, _), times in rows.items():
        for t, chosen, before in times:
            assert chosen == pytest.approx(300) and t - chosen - before == pytest.approx(300)
            assert before == pytest.approx(300 if mode == "speculative" else 0)


def test_each_row_shows_the_fastest_pass_and_its_parts(monkeypatch, capsys):
    passes = iter([{("speculative", (1, 8)): [(50.0, 20.0, 2.0), (60.0, 30.0, 3.0), (70.0, 40.0, 4.0)]},
                   {("speculative", (1, 8)): [(40.0, 10.0, 5.0), (44.0, 12.0, 6.0), (90.0, 14.0, 7.0)]}])
    monkeypatch.setattr(dispatch_cost, "time_trace", lambda *args: next(passes))
    assert dispatch_cost.main([str(TRACE), "--repeat", "2"]) == 0
    assert "| speculative | 1-8 | 3 | 44 | 44 | 12 | 6 |" in capsys.readouterr().out


def test_verify_results_reach_the_records_as_accepted_drafts(monkeypatch):
    # A trace step's verified tokens include each request's bonus token: the records get drafts.
    fed = []
    monkeypatch.setattr(dispatch_cost.PolicyFeed, "verified", lambda self, step, drafts: fed.append(list(drafts)))
    dispatch_cost.time_trace(TRACE)
    assert fed and min(min(d) for d in fed if d) >= 0
    assert 1.5 < sum(map(sum, fed)) / sum(map(len, fed)) < 2.5  # acceptance 3.0: about 2 drafts each


def test_the_table_names_each_row(capsys):
    assert dispatch_cost.main([str(TRACE), "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "| speculative | 1-8 |" in out and "| plain | 33-128 |" in out and "at the batch's choice" in out
    with pytest.raises(SystemExit):
        dispatch_cost.main([str(TRACE), "--repeat", "0"])


def test_cuda_passes_every_step_through_the_timing_feed(monkeypatch):
    from sglang_dynamic_eagle.engine import step_costs

    done = []

    class Feed:  # the worker's TimingFeed, recording what it is handed
        def __init__(self, reduce_max, sink):
            assert reduce_max([1.0]) == [1.0]

        def step_done(self, step, mode, batch_size, kv_tokens):
            done.append(step)

    monkeypatch.setattr(step_costs, "TimingFeed", Feed)
    rows = dispatch_cost.time_trace(TRACE, cuda=True)
    assert done == list(range(1, sum(map(len, rows.values())) + 1))


def test_cuda_without_a_gpu_is_refused_in_one_line(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        dispatch_cost.main([str(TRACE), "--repeat", "1", "--cuda"])
    assert "--cuda: no CUDA GPU here; run without --cuda" in capsys.readouterr().err
