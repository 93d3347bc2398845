"""The phase-timeline diagnostic (tools/phase_timeline): records as the plugin writes them,
and the per-prefill intervals the summary reads from them."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "phase_timeline"))

import sglang_phase_timeline as plugin  # noqa: E402
import summarise  # noqa: E402

MS = 1_000_000


class FakeEvent:
    def __init__(self, done: bool, at_ms: float) -> None:
        self.done, self.at_ms = done, at_ms

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: "FakeEvent") -> float:
        return end.at_ms - self.at_ms


def read_lines(directory: Path) -> list:
    (path,) = directory.glob("timeline-*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_record_waits_for_its_gpu_events_and_keeps_the_order(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(plugin, "FLUSH_EVERY", 1)
    timeline = plugin.Timeline(str(tmp_path))
    pending_end = FakeEvent(False, 5.0)
    timeline.add({"phase": "target_forward"}, (FakeEvent(True, 1.0), pending_end), "EAGLE3")
    timeline.add({"phase": "run_batch"}, None, "EAGLE3")
    assert read_lines(tmp_path) == [{"algorithm": "EAGLE3"}]
    pending_end.done = True
    timeline.add({"phase": "process_result"}, None, "EAGLE3")
    lines = read_lines(tmp_path)
    assert [line.get("phase") for line in lines[1:]] == ["target_forward", "run_batch", "process_result"]
    assert lines[1]["gpu_ms"] == 4.0 and lines[2]["gpu_ms"] is None


def test_idle_iterations_are_not_recorded():
    batch = SimpleNamespace(forward_mode=SimpleNamespace(name="DECODE"), reqs=[1, 2])
    assert plugin._nothing_done("recv", (None, []))
    assert not plugin._nothing_done("recv", (None, [object()]))
    assert not plugin._nothing_done("run_batch", (None, batch))
    assert plugin._batch_facts((None, batch)) == {"mode": "DECODE", "reqs": 2}
    assert plugin._batch_facts((None,)) == {"mode": None, "reqs": None}


def record(phase: str, start_ms: float, end_ms: float, mode=None, reqs=None, gpu_ms=None):
    return summarise.Record(phase, mode, reqs, int(start_ms * MS), int(end_ms * MS), gpu_ms)


def one_request_cycle(offset: float, draft_launch_ms: float) -> list:
    """A request received, its prefill launched, the first decode launched, the prefill's
    result processed, as the scheduler of a 1-request load runs them."""
    prefill_end = offset + 20 + draft_launch_ms
    return [
        record("recv", offset, offset + 0.2),
        record("run_batch", offset + 1, prefill_end, "EXTEND", 1),
        record("target_forward", offset + 1.5, offset + 20, "EXTEND", 1, gpu_ms=19.0),
        record("draft_prefill", offset + 20, prefill_end, "EXTEND", 1, gpu_ms=2.0),
        record("run_batch", prefill_end + 0.5, prefill_end + 3, "DECODE", 1),
        record("resolve_seq_lens", prefill_end + 0.6, prefill_end + 1.1, "DECODE", 1),
        record("process_result", prefill_end + 3.5, prefill_end + 4, "EXTEND", 1),
        record("run_batch", prefill_end + 4.5, prefill_end + 7, "DECODE", 1),
        record("process_result", prefill_end + 7.5, prefill_end + 8, "DECODE", 1),
    ]


def test_prefill_intervals_split_the_time_to_the_first_token():
    records = one_request_cycle(0, 2.0) + one_request_cycle(100, 2.0)
    rows = summarise.prefill_intervals(records)
    assert len(rows) == 2
    row = rows[0]
    assert row["running_reqs"] == 1
    assert math.isclose(row["received → launch"], 0.8)
    assert math.isclose(row["prefill launch (host)"], 21.0)
    assert math.isclose(row["draft prefill launch (host)"], 2.0)
    assert row["target extend (GPU)"] == 19.0 and row["draft prefill (GPU)"] == 2.0
    assert math.isclose(row["prefill end → next launch"], 0.5)
    assert math.isclose(row["its wait for sequence lengths"], 0.5)
    assert math.isclose(row["next launch end → result processed"], 0.5)
    assert math.isclose(row["prefill launch → result processed"], 25.0)


def test_the_summary_shows_a_slower_draft_launch_where_it_is(tmp_path: Path):
    for name, draft_ms in (("EAGLE3", 2.0), ("EAGLE3_DYNAMIC", 4.0)):
        lines = [{"algorithm": name}] + [
            {"phase": r.phase, "mode": r.mode, "reqs": r.reqs, "start_ns": r.start_ns,
             "end_ns": r.end_ns, "gpu_ms": r.gpu_ms}
            for offset in (0, 100, 200) for r in one_request_cycle(offset, draft_ms)]
        (tmp_path / f"timeline-{name}.jsonl").write_text(
            "\n".join(json.dumps(line) for line in lines) + "\n")
    timelines = [summarise.read_timeline(p) for p in sorted(tmp_path.glob("timeline-*.jsonl"))]
    rows = {t.algorithm: summarise.prefill_intervals(t.records) for t in timelines}
    text = summarise.table(rows)
    assert "| draft prefill launch (host) | 2.00 | 2.00 | 4.00 | 4.00 |" in text
    assert "| prefill launch → result processed | 25.00 | 25.00 | 27.00 | 27.00 |" in text


def test_a_missing_interval_does_not_spoil_the_median() -> None:
    assert summarise.median([1.0, float("nan"), 3.0, 2.0]) == 2.0
    assert summarise.percentile([float("nan"), 1.0, 2.0, 3.0, 4.0], 0.8) == 4.0
    assert math.isnan(summarise.median([float("nan")]))


def test_every_phase_names_a_function_of_the_installed_sglang() -> None:
    """The plugin wraps sglang internals; a renamed one must fail here, not on the GPU."""
    from sglang_dynamic_eagle.sglang_compat.registry import resolve

    for phase, target, _ in plugin.PHASES:
        assert callable(resolve(target)), phase
