"""tools/stale_draft_kv.py on the committed tiny pair (CPU): the instrument sees a draft that reads
KV it never wrote, and reports every case against fresh (no acceptance level of the stale cases
is asserted: that is the measurement)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import stale_draft_kv  # noqa: E402

CONTROL = "control: every context row zeroed"


def test_a_draft_whose_whole_context_kv_is_unwritten_accepts_less():
    result = stale_draft_kv.measure(follow_ups=3, answer_tokens=32, new_tokens=32)
    assert result[CONTROL] < 0.9 * result["fresh"]


def test_the_table_reports_each_case_against_fresh(capsys):
    assert stale_draft_kv.main(["--follow-ups", "1", "--answer-tokens", "16", "--new-tokens", "16"]) == 0
    out = capsys.readouterr().out
    assert "| fresh | " in out and "| 1.000 |" in out
    assert "| zeros |" in out and "| another request's |" in out and f"| {CONTROL} |" in out


def test_the_running_request_table_lists_each_case(capsys):
    assert stale_draft_kv.main(["--running", "40", "--follow-ups", "1", "--new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    rows = [line.split(" | ")[0].strip("| ") for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[1:] == ["all rebuilt", "newest 8 rebuilt", "newest 32 rebuilt", "none rebuilt"]
    with pytest.raises(SystemExit):
        stale_draft_kv.main(["--running", "0"])


def test_all_rebuilt_is_a_running_request_whose_draft_kv_is_whole():
    from tiny_pair_training.evaluation import reference_chain_decode

    target, draft = stale_draft_kv.load_pair()
    prompt = stale_draft_kv.json.loads((stale_draft_kv.PAIR / "eval_prompts.json").read_text())["prompts"][0]
    context = stale_draft_kv.greedy(target, prompt["input_ids"], 24)
    whole = reference_chain_decode(target, draft, context, 24, 3, stale_draft_kv.CPU).accepted
    result = stale_draft_kv.measure_running(requests=1, plain_tokens=24, new_tokens=24, rebuilt=())
    assert result["all rebuilt"] == stale_draft_kv.tokens_per_verify([whole])
    assert result["none rebuilt"] < result["all rebuilt"]


def test_the_prompt_window_table_lists_each_case_and_a_prompt_without_draft_kv_accepts_less(capsys):
    assert stale_draft_kv.main(["--prompt-window", "--follow-ups", "2", "--new-tokens", "16"]) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0].strip("| "): float(line.split(" | ")[1])
            for line in out.splitlines() if line.startswith("| ") and "---" not in line and "tokens per" not in line}
    assert list(rows) == ["whole prompt", "newest 32", "newest 16", "newest 8",
                          "newest 16, older rows another request's", "none"]
    assert rows["none"] < rows["whole prompt"]


def test_running_and_prompt_window_together_are_refused(capsys):
    with pytest.raises(SystemExit):
        stale_draft_kv.main(["--running", "8", "--prompt-window"])
    assert "give one of them" in capsys.readouterr().err
