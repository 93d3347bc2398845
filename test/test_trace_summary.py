"""`sglang-dynamic-eagle trace FILE`: a decode-step trace summarised for an operator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_dynamic_eagle.cli import main
from sglang_dynamic_eagle.observability.trace_summary import render, summary_rows
from sglang_dynamic_eagle.policy.replay import load_trace

TRACES = Path(__file__).parent / "data" / "traces"


def trace_text(steps, host_us=None) -> str:
    """(t, mode, batch, ms, verified tokens) per step as the server writes them; ``host_us(n)``:
    step n's (worker, step call) host microseconds."""
    lines = []
    for n, (t, mode, batch, ms, tokens) in enumerate(steps, start=1):
        lines.append({"k": "step", "step": n, "t": t, "mode": mode, "b": batch, "kv": 900 * batch, "q": 0})
        if host_us is not None:
            lines.append({"k": "host", "step": n, "us": host_us(n)[0], "step_us": host_us(n)[1]})
        if ms is not None:
            lines.append({"k": "time", "step": n, "ms": ms})
        if tokens is not None:
            lines.append({"k": "verify", "step": n, "tokens": tokens, "requests": batch})
    return "\n".join(json.dumps(line) for line in lines) + "\n"


def test_rows_by_window_mode_and_batch_range() -> None:
    steps = ([(0.01 * i, "speculative", 4, 8.0, 12) for i in range(10)]
             + [(10 + 0.01 * i, "speculative", 4, 12.0, 12) for i in range(10)]
             + [(10.5, "plain", 100, 10.0, None), (10.6, "plain", 100, None, None)])
    rows = summary_rows(load_trace(Path('-'), trace_text(steps)), windows=2)
    by_key = {(r["window_s"], r["mode"], r["batch"]): r for r in rows}
    assert by_key[(0, "speculative", "1-8")]["median_ms"] == 8.0
    assert by_key[(0, "speculative", "1-8")]["tokens_per_s"] == 1500  # 12 tokens in 8 ms
    late = by_key[(5, "speculative", "1-8")]
    assert (late["steps"], late["median_ms"], late["tokens_per_s"]) == (10, 12.0, 1000)
    plain = by_key[(5, "plain", "33-128")]
    assert (plain["steps"], plain["timed"], plain["tokens_per_s"]) == (2, 1, 10000)
    assert len(summary_rows(load_trace(Path('-'), trace_text(steps)), windows=1)) == 2  # one window: the two kinds


def test_host_time_by_window_shows_a_host_that_slows() -> None:
    steps = [(0.01 * i, "speculative", 4, 8.0, 12) for i in range(20)]
    text = trace_text(steps, host_us=lambda n: (40.0 if n <= 10 else 90.0, 3000.0 + (n > 10) * 4000))
    rows = summary_rows(load_trace(Path('-'), text), windows=2)
    assert [r["host_us"] for r in rows] == ["40 / 3000", "90 / 7000"]
    assert summary_rows(load_trace(Path('-'), trace_text(steps)))[0]["host_us"] is None  # older traces


def test_predicted_rates_beside_the_measured_ones() -> None:
    """Steps that carry the policy's prediction for the mode that ran ("pp" / "ps") show its
    median beside the measured rate; traces without them show none."""
    text = trace_text([(0.01 * i, "speculative", 4, 8.0, 12) for i in range(5)])
    lines = [json.loads(line) for line in text.splitlines()]
    for n, line in enumerate(line for line in lines if line["k"] == "step"):
        line.update(why="stay", pp=500, ps=1400 + 100 * n)
    rows = summary_rows(load_trace(Path('-'), "\n".join(json.dumps(line) for line in lines)))
    assert [(r["tokens_per_s"], r["predicted"]) for r in rows] == [(1500, 1600)]
    assert summary_rows(load_trace(Path('-'), text))[0]["predicted"] is None
    # Predicted for a larger batch than ran (a queue), or with a mode's cost unknown (0): left out.
    steps = [line for line in lines if line["k"] == "step"]
    steps[3]["pb"], steps[4]["ps"] = 40, 0
    rows = summary_rows(load_trace(Path('-'), "\n".join(json.dumps(line) for line in lines)))
    assert rows[0]["predicted"] == 1500  # the median of 1400, 1500, 1600


def test_prefill_batches_by_prompt_length(tmp_path) -> None:
    """The trace's prefill lines, per prompt-token range: the draft's share apart from the
    target's, within a span too; a trace without them shows no prefill table."""
    path = tmp_path / "trace.jsonl"
    prefills = [{"k": "prefill", "t": 1.0 + i, "tokens": tokens, "target_ms": target, "draft_ms": draft}
                for i, (tokens, target, draft) in enumerate([(290, 10.0, 3.0), (300, 12.0, 3.0),
                                                             (8192, 200.0, 8.0)])]
    path.write_text(trace_text([(0.0, "plain", 2, 5.0, None), (2.0, "plain", 2, 5.0, None),
                                (5.0, "plain", 2, 5.0, None)])
                    + "".join(json.dumps(p) + "\n" for p in prefills))
    text = render(path, replay=False)
    assert "| 257-1024 | 2 | 11.0 | 3.0 | 0.273 |" in text
    assert "| 4097-None" not in text and "| >= 4097 | 1 | 200.0 | 8.0 | 0.04 |" in text
    assert "| 257-1024 | 1 | 12.0 | 3.0 | 0.25 |" in render(path, replay=False, span=(1.5, 2.5))
    assert "Prefill batches" not in render(path, replay=False, span=(3.5, 5.0))
    path.write_text(trace_text([(0.0, "plain", 2, 5.0, None)]))
    assert "Prefill batches" not in render(path, replay=False)


def test_a_span_picks_its_steps_and_keeps_the_traces_clock() -> None:
    """--span A:B: only the steps A to B seconds after the first, windows numbered on the trace's
    clock, so a stretch found in a wide view can be read alone."""
    steps = ([(0.01 * i, "speculative", 4, 8.0, 12) for i in range(10)]
             + [(5.0 + 0.01 * i, "speculative", 4, 12.0, 12) for i in range(10)]
             + [(9.0, "plain", 100, 10.0, None)])
    parsed = load_trace(Path('-'), trace_text(steps))
    rows = summary_rows(parsed, span=(4.0, 6.0))
    assert [(r["window_s"], r["mode"], r["steps"], r["median_ms"]) for r in rows] == [(5.0, "speculative", 10, 12.0)]
    assert len(summary_rows(parsed, windows=2, span=(0.0, 9.0))) == 3  # both ends included
    with pytest.raises(ValueError, match="no decode step from 1 to 2 s"):
        summary_rows(parsed, span=(1.0, 2.0))


def test_a_span_is_replayed_on_the_whole_traces_costs() -> None:
    """A load picked by its span replays as the replay tests replay it (part of the whole
    trace's world): closed loop 32 at acceptance 1.6 of the fixture, by time."""
    from sglang_dynamic_eagle.observability.trace_summary import replay_regrets
    from sglang_dynamic_eagle.policy.replay import load_recorded, oracle_rate, recorded_world, simulate, throughput_policy_for

    path = TRACES / "h200-dummy8b-fa3-traffic-c.jsonl.xz"
    steps, meta = load_recorded(path)
    first, end = meta["segments"]["closed-32~1.6"]
    span = (steps[first].t - steps[0].t - 1e-6, steps[end - 1].t - steps[0].t + 1e-6)
    world = recorded_world(steps, meta).part(first, end)
    expected = 1.0 - simulate(throughput_policy_for(meta), world, 256).rate / oracle_rate(world, 256)
    assert replay_regrets(path, span)["policy"] == pytest.approx(expected)
    assert replay_regrets(path, span)["policy"] != pytest.approx(replay_regrets(path)["policy"])


def test_a_recorded_trace_is_replayed_against_the_best_choice() -> None:
    text = render(TRACES / "h200-dummy8b-fa3-defaults.jsonl.xz", windows=2)
    assert "| 0 | speculative | 9-32 |" in text
    assert "Replayed below the best mode choice per step: policy 0.1%" in text
    assert "never speculate" in text


def test_the_command_line(tmp_path, capsys) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(trace_text([(0.0, "plain", 2, 5.0, None)]))
    assert main(["trace", str(path)]) == 0
    assert "| 0 | plain | 1-8 | 1 | 1 | 5.0 | 400 | - | - |" in capsys.readouterr().out  # no config: no replay
    for argv, message in ((["trace", str(tmp_path / "missing")], "trace: no file"),
                          (["trace", str(path), "--windows", "0"], "--windows 0: give 1 or more"),
                          (["trace", str(path), "--span", "3"], "--span 3: give START:END"),
                          (["trace", str(path), "--span", "5:2"], "--span 5:2: give START:END"),
                          (["trace", str(path), "--span", "a:b"], "--span a:b: give START:END"),
                          (["trace", str(path), "--span", "1:2"], "no decode step from 1 to 2 s")):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err
    (tmp_path / "other.jsonl").write_text('{"k": "config"}\n')
    with pytest.raises(SystemExit):
        main(["trace", str(tmp_path / "other.jsonl")])
    assert "no decode steps in the trace" in capsys.readouterr().err


def test_tokens_per_verified_request_over_all_verifies_and_over_first_ones(tmp_path) -> None:
    """Over all verifies, and over each request's first ones where the verify lines carry them
    (what a request without verifies is priced at), within a span too; older traces: the first."""
    path = tmp_path / "trace.jsonl"
    text = trace_text([(0.0, "speculative", 2, 8.0, 8), (1.0, "speculative", 2, 8.0, 3),
                       (2.0, "speculative", 2, 8.0, 3)])
    path.write_text(text)
    assert "Tokens per verified request: 2.33 over 6 verifies\n" in render(path, replay=False)
    firsts = {1: (2, 8), 2: (1, 1)}  # step 1: both requests new (4.0 each); step 2: one, 1.0
    lines = [json.loads(line) for line in text.splitlines()]
    for line in lines:
        if line["k"] == "verify" and line["step"] in firsts:
            line["first_requests"], line["first_tokens"] = firsts[line["step"]]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert ("Tokens per verified request: 2.33 over 6 verifies; 3.00 over each request's first (3: what a"
            in render(path, replay=False))
    assert "1.50 over 2 verifies; 1.00 over each request's first (1:" in render(path, replay=False, span=(0.5, 1.5))


def test_a_trace_without_timed_plain_steps_is_summarised_and_says_why_it_is_not_replayed(tmp_path, capsys) -> None:
    """A server that only speculated (every load where speculation paid) wrote a trace the
    command could not read: the replay's error ended it. Now the rest prints and the replay
    line says why it is missing."""
    path = tmp_path / "trace.jsonl"
    config = (TRACES / "h100-dummy8b-fa3-closed-acc1.6.json").read_text()
    path.write_text(json.dumps({"k": "config", **json.loads(config)}) + "\n"
                    + trace_text([(0.1 * i, "speculative", 4, 8.0, 10) for i in range(20)]))
    assert main(["trace", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| 0 | speculative | 1-8 | 20 | 20 | 8.0 | 1250 |" in out
    assert "Not replayed: the trace has no timed plain step" in out


def test_catch_ups_and_host_stalls_are_listed(tmp_path) -> None:
    """A speculative step whose host time is 112 ms among 6 ms ones (an H100's first load,
    2026-12-05) is a stall; one at 3x its mode's median is not. Catch-ups: count, tokens,
    median and longest GPU time."""
    path = tmp_path / "trace.jsonl"
    steps = [(0.1 * i, "speculative", 43, 9.0, 120) for i in range(30)]

    def host(stalled_us):
        return lambda n: (300, stalled_us if n == 12 else 6000 + 10 * n)

    lines = [json.dumps({"k": "catchup", "t": 0.5, "tokens": 128, "ms": 44.7}),
             json.dumps({"k": "catchup", "t": 1.5, "tokens": 3, "ms": 0.59}),
             json.dumps({"k": "catchup", "t": 2.5, "tokens": 4, "ms": 0.58})]
    path.write_text(trace_text(steps, host(112000)) + "\n".join(lines) + "\n")
    out = render(path, replay=False)
    assert "Catch-ups: 3, 135 tokens, median 0.59 ms, longest 44.7 ms (128 tokens)" in out
    assert "over 10x its mode's median): 1, the longest 112.0 ms at step 12 (speculative, 43 requests, 1.1 s in)" in out
    path.write_text(trace_text(steps, host(18000)))
    out = render(path, replay=False)
    assert "over 10x its mode's median): none" in out and "Catch-ups" not in out


def test_predicted_tokens_and_step_time_of_speculative_steps_apart(tmp_path) -> None:
    """Closed loop 128 at 1.6 after traffic at 3.0 (an H100, 2026-12-05): the policy predicted
    11,049 tokens/s of speculation against 10,377 measured, and only a cost model replayed by
    hand told that the step time was right and the acceptance not. Step lines that carry the
    prediction's parts ("ys", "pt") say it at once: steps with a queue (predicted at another
    batch) and plain ones are left out."""
    path = tmp_path / "trace.jsonl"
    lines = []
    for n in range(1, 41):
        spec, queued = n % 4 != 0, 5 if n == 7 else 0
        lines += [{"k": "step", "step": n, "t": 0.02 * n, "mode": "speculative" if spec else "plain", "b": 128,
                   "kv": 90000, "q": queued, "why": "stay", "pp": 11100, "ps": 11050,
                   "ys": 500.0 if queued else 219.0, "pt": 19.9 if spec else 11.5},
                  {"k": "time", "step": n, "ms": 19.8 if spec else 11.6}]
        if spec:
            lines.append({"k": "verify", "step": n, "tokens": 203, "requests": 128})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert ("Speculative steps without a queue (29 timed, medians): tokens per step predicted 219.0, verified "
            "203.0 (+7.9%); step time predicted 19.90 ms, measured 19.80 (+0.5%)") in render(path, replay=False)
    path.write_text("".join(json.dumps({k: v for k, v in line.items() if k not in ("ys", "pt")}) + "\n"
                            for line in lines))
    assert "Speculative steps without a queue" not in render(path, replay=False)  # older traces


def test_the_wait_for_the_step_in_flight_weighs_long_steps_by_their_length(tmp_path) -> None:
    """A Poisson arrival lands in a step with probability proportional to its length and waits
    half of it: steps of 10 and 30 ms in equal numbers give (100 + 900) / (2 * 40) = 12.5 ms, not
    half the mean (10). Were they plain at 10 requests and 1,000 tokens/s predicted, 10 ms each:
    5 ms. On the overlap loop the step already chosen adds the mean step: 32.5 and 15 ms. Steps predicted at a larger projected batch ("pb") are left out of both."""
    path = tmp_path / "trace.jsonl"
    lines = []
    for n in range(1, 22):
        step = {"k": "step", "step": n, "t": 0.05 * n, "mode": "speculative", "b": 10, "kv": 9000, "q": 0,
                "pp": 1000}
        if n == 21:
            step.update(q=50, pb=60, pp=2000)
        lines += [step, {"k": "time", "step": n, "ms": 500.0 if n == 21 else (10.0 if n % 2 else 30.0)}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert ("Wait of an arrival for the decode step in flight (20 timed steps): 12.50 ms; 5.00 ms were they "
            "plain (predicted). With the step already chosen (overlap loop): 32.50 ms; 15.00 ms were they "
            "plain") in render(path, replay=False)


def test_gpu_stalls_are_steps_far_over_their_predicted_time(tmp_path) -> None:
    """A fresh H100's first traffic on triton (2026-12-06): decode steps of 9-26 ms were
    interrupted by 68-127 ms compiles of sglang's request-slot kernel, and a GPU test's server
    sharing the GPU doubled two steps of 22 ms. A step at 2x its predicted time or more is
    listed with when it ran; steps at 1.5x (a long KV read the model priced low) are not, nor
    a step predicted at a projected batch ("pb"), whose prediction is for another batch."""
    path = tmp_path / "trace.jsonl"

    def lines(slow_ms):
        rows = []
        for n in range(1, 41):
            step = {"k": "step", "step": n, "t": 0.03 * n, "mode": "speculative", "b": 27, "kv": 23000,
                    "q": 0, "pt": 22.0}
            if n == 40:
                step.update(q=9, pb=36)
            ms = {12: slow_ms, 30: 33.0, 40: 120.0}.get(n, 22.5)
            rows += [step, {"k": "time", "step": n, "ms": ms}]
        return "".join(json.dumps(row) + "\n" for row in rows)

    path.write_text(lines(110.0))
    assert ("GPU stalls (a timed step over 2x its predicted time, 39 steps): 1; the longest 110.0 ms against "
            "22.0 at step 12 (speculative, 27 requests, 0.3 s in)") in render(path, replay=False)
    path.write_text(lines(40.0))
    assert "GPU stalls (a timed step over 2x its predicted time, 39 steps): none" in render(path, replay=False)
