"""`tools/replay_fixtures.py`: the policy on every load of the committed traces, per share."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from sglang_dynamic_eagle.policy import throughput

ROOT = Path(__file__).resolve().parents[1]


def load_tool():
    spec = importlib.util.spec_from_file_location("replay_fixtures", ROOT / "tools" / "replay_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_row_per_load_and_the_share_restored(tmp_path, capsys) -> None:
    fixture = ROOT / "test" / "data" / "traces" / "h200-dummy8b-fa3-traffic-c"
    for suffix in (".json", ".jsonl.xz"):
        (tmp_path / f"{fixture.name}{suffix}").symlink_to(f"{fixture}{suffix}")
    assert load_tool().main(["--traces", str(tmp_path), "--shares", "0.01,0.5"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| h200-dummy8b-fa3-traffic-c:")]
    assert len(rows) == 9 and "| mean of 9 |" in out
    worst = out.splitlines()[-1].split("|")[2:4]
    assert float(worst[0].strip(" %")) < float(worst[1].strip(" %"))  # half the time exploring costs
    assert throughput.EXPLORATION_SHARE == 0.01


def test_a_folder_without_loads_is_refused(tmp_path, capsys) -> None:
    import pytest

    with pytest.raises(SystemExit):
        load_tool().main(["--traces", str(tmp_path)])
    assert "no loads in" in capsys.readouterr().err


def test_whole_replays_each_trace_as_one_load(tmp_path, capsys) -> None:
    fixture = ROOT / "test" / "data" / "traces" / "h200-dummy8b-fa3-traffic-c"
    for suffix in (".json", ".jsonl.xz"):
        (tmp_path / f"{fixture.name}{suffix}").symlink_to(f"{fixture}{suffix}")
    assert load_tool().main(["--traces", str(tmp_path), "--whole"]) == 0
    out = capsys.readouterr().out
    assert [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| h200")] == [
        "h200-dummy8b-fa3-traffic-c:all"]
    assert "| mean of 1 |" in out


def test_step_times_handed_over_every_eighth_step() -> None:
    """``feed_every``: a step's time reaches the policy only at every eighth step, and only for
    the steps ``feedback_lag`` or more before it, as a server hands them over; the default hands
    each one over on its own."""
    from sglang_dynamic_eagle.policy import DecodeMode, StepObservation
    from sglang_dynamic_eagle.policy.replay import World, simulate

    class Recorder:
        def __init__(self):
            self.step, self.told = 0, []

        def decide(self, obs: StepObservation) -> DecodeMode:
            self.step += 1
            return DecodeMode.PLAIN

        def add_step_time(self, step, mode, batch, kv, ms) -> None:
            self.told.append((self.step, step))

    import numpy as np
    n = 24
    world = World(batch=np.full(n, 4), kv_tokens=np.full(n, 800), queued=np.zeros(n, dtype=int),
                  plain_ms=np.full(n, 6.0), spec_ms=np.full(n, 9.0), spec_tokens=np.full(n, 8.0),
                  catchup_fixed_ms=1.0, catchup_per_token_ms=0.0)
    batched, each = Recorder(), Recorder()
    simulate(batched, world, 256, feedback_lag=8, feed_every=8)
    simulate(each, world, 256, feedback_lag=8)
    assert batched.told == [(16, s) for s in range(1, 9)] + [(24, s) for s in range(9, 17)]
    assert each.told == [(i + 9, i + 1) for i in range(n - 8)]


def test_draft_prefills_reach_the_policy_before_each_load(tmp_path, capsys, monkeypatch) -> None:
    """``--draft-prefills N``: the trace's first N prefill lines go to the policy's catch-up
    bound before each load (64 by default, as the replay tests; none at 0)."""
    fixture = ROOT / "test" / "data" / "traces" / "h100-dummy8b-flashinfer-closed"
    for suffix in (".json", ".jsonl.xz"):
        (tmp_path / f"{fixture.name}{suffix}").symlink_to(f"{fixture}{suffix}")
    tool = load_tool()
    fed = []
    original = tool.throughput_policy_for

    def recording(meta):
        policy = original(meta)
        add = policy.add_draft_prefill
        policy.add_draft_prefill = lambda tokens, ms: (fed.append((tokens, ms)), add(tokens, ms))
        return policy

    monkeypatch.setattr(tool, "throughput_policy_for", recording)
    assert tool.main(["--traces", str(tmp_path), "--draft-prefills", "0"]) == 0
    assert fed == []
    assert tool.main(["--traces", str(tmp_path), "--draft-prefills", "5"]) == 0
    assert len(fed) == 5 * 8  # eight loads
    assert all(tokens > 0 and ms > 0 for tokens, ms in fed)
