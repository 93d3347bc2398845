"""tools/dispatch_cost.py: it times every step of a committed trace, by mode and batch range (a
diagnostic: no time is asserted)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import dispatch_cost  # noqa: E402

TRACE = ROOT / "test/data/traces/h200-dummy8b-fa3-defaults.jsonl.xz"


def test_every_step_of_the_trace_is_timed_once_in_its_row():
    from sglang_dynamic_eagle.policy.replay import load_recorded

    steps, _ = load_recorded(TRACE)
    rows = dispatch_cost.time_trace(TRACE)
    assert sum(len(times) for times in rows.values()) == len(steps)
    assert {mode for mode, _ in rows} == {"plain", "speculative"}
    for (mode, (low, high)), times in rows.items():
        assert all(t > 0 for t in times)


def test_the_table_names_each_row(capsys):
    assert dispatch_cost.main([str(TRACE), "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "| speculative | 1-8 |" in out and "| plain | 33-128 |" in out
