"""The automatic policy against its oracle on recorded and modelled traces (CPU replay), and the
properties it must keep: each decision from the step model, monotone in acceptance and in the
cost ratio, deterministic, no faster flapping than the catch-up cost allows, exploration
within its budget."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Sequence

import numpy as np
import pytest

from sglang_dynamic_eagle.policy import (DecodeMode, StepObservation, ThresholdPolicy,
                                         ThresholdPolicyConfig)
from sglang_dynamic_eagle.policy.replay import (World, _bucket, load_recorded, oracle_rate,
                                                read_trace_text, recorded_world, simulate,
                                                throughput_policy_for)
from sglang_dynamic_eagle.policy import throughput
from sglang_dynamic_eagle.policy.throughput import (EXPLORATION_SHARE, ThroughputPolicyConfig,
                                                    new_throughput_policy)

TRACES = sorted((Path(__file__).parent / "data" / "traces").glob("*.jsonl.xz"))
MAX_REGRET = 0.03
WINDOW = 256
SPEC, PLAIN = DecodeMode.SPECULATIVE, DecodeMode.PLAIN

# The modelled server: the 8B-shaped pair on one H200 (triton, chain 3/1/4), fitted to the
# committed Poisson trace: a plain step 5.2 ms + 0.016 ms per request, a speculative step
# 2.4 ms + 0.31 ms per request over a replay of 5.6 ms; KV read 131 kB (target) and 4 kB
# (draft) per token at 4 TB/s.
BUCKETS = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128]
PLAIN_KV_MS = 131072 / 4e9
SPEC_KV_MS = (131072 + 4 * 4096) / 4e9


def synthetic_world(batches: Iterable[int], kv_per_request: Iterable[float],
                    acceptance: Iterable[float], queued: Iterable[int], *,
                    plain_base_ms: Callable[[int], float], spec_base_ms: Callable[[int], float],
                    plain_per_kv_token_ms: float, spec_per_kv_token_ms: float,
                    max_speculative_batch: int, catchup_per_token_ms: float,
                    catchup_fixed_ms: float = 0.0, buckets: Sequence[int] = ()) -> World:
    """A world from a step model's parameters (for tests of the policy's properties); base
    costs are taken at each step's CUDA-graph bucket (the smallest of ``buckets`` holding it),
    as a graph replays at its bucket's size whatever the batch."""
    b = np.array(list(batches))
    padded = np.array([_bucket(sorted(buckets), x) if buckets and x <= max(buckets) else x
                       for x in b])
    kv = np.array(list(kv_per_request)) * b
    acc = np.array(list(acceptance))
    plain = np.array([plain_base_ms(x) for x in padded]) + plain_per_kv_token_ms * kv
    spec = np.array([spec_base_ms(p) if x <= max_speculative_batch else np.inf
                     for x, p in zip(b, padded)])
    return World(b, kv.astype(int), np.array(list(queued)), plain,
                 spec + spec_per_kv_token_ms * kv, acc * b, catchup_fixed_ms, catchup_per_token_ms)


def plain_base(b: int) -> float:
    return 5.2 + 0.016 * b


def spec_base(b: int) -> float:
    return 8.0 + 0.31 * b


def modelled_world(batches, kv_per_request, acceptance, queued=None) -> World:
    n = len(batches)
    return synthetic_world(
        batches, kv_per_request, acceptance, queued if queued is not None else [0] * n,
        plain_base_ms=plain_base, spec_base_ms=spec_base, plain_per_kv_token_ms=PLAIN_KV_MS,
        spec_per_kv_token_ms=SPEC_KV_MS, max_speculative_batch=128, catchup_per_token_ms=0.0008,
        catchup_fixed_ms=1.5, buckets=BUCKETS)


def modelled_policy(max_acceptance: float = 4.0, kv_scale: float = 1.0, spec_scale: float = 1.0):
    """The policy as the modelled server would build it: replays at 90% of the step (no host
    work), the physical KV priors."""
    calibration = {PLAIN: {b: 0.9 * plain_base(b) for b in BUCKETS},
                   SPEC: {b: 0.9 * spec_scale * spec_base(b) for b in BUCKETS}}
    config = ThroughputPolicyConfig(max_speculative_batch=128, max_running_requests=256,
                                    kv_capacity_tokens=2_000_000, catchup_window=WINDOW)
    return new_throughput_policy(config, {PLAIN: BUCKETS, SPEC: BUCKETS}, calibration,
                                 {PLAIN: kv_scale * PLAIN_KV_MS, SPEC: kv_scale * SPEC_KV_MS},
                                 catchup_prior_fixed_ms=spec_base(1), max_acceptance=max_acceptance)


def random_walk(n: int, seed: int, low: int = 1, high: int = 160, step: int = 3) -> List[int]:
    rng = np.random.default_rng(seed)
    x, out = low, []
    for _ in range(n):
        x = int(np.clip(x + rng.integers(-step, step + 1), low, high))
        out.append(x)
    return out


def modelled_traces():
    """Load shapes users run, at acceptance levels from poor to good."""
    n = 3000
    walk = random_walk(n, seed=1)
    light = random_walk(n, seed=2, high=40, step=2)
    burst = [2] * 600 + [100 + i % 20 for i in range(1200)] + [3] * 1200
    burst_queue = [0] * 600 + [80] * 100 + [0] * 2300
    return {
        "chat-walk-acc3.0": modelled_world(walk, [700] * n, [3.0] * n),
        "chat-walk-acc1.6": modelled_world(walk, [700] * n, [1.6] * n),
        "light-acc2.2": modelled_world(light, [900] * n, [2.2] * n),
        "long-context-acc3.0": modelled_world(walk, [9000] * n, [3.0] * n),
        "short-then-long-acc2.5": modelled_world(walk, [600] * (n // 2) + [12000] * (n - n // 2),
                                                 [2.5] * n),
        "burst-after-light-acc3.0": modelled_world(burst, [800] * n, [3.0] * n, burst_queue),
        "acceptance-shift": modelled_world(light, [900] * n, [4.0] * (n // 2) + [1.3] * (n - n // 2)),
        # Long-document and chat requests sharing the batch: its KV tokens swing by 20x every
        # few dozen steps at the same batch size.
        "mixed-contexts-acc2.5": modelled_world(
            [32] * n, [600 if (i // 40) % 2 else 12000 for i in range(n)], [2.5] * n),
    }


MODELLED = modelled_traces()


def regret(policy, world: World) -> float:
    return 1.0 - simulate(policy, world, WINDOW).rate / oracle_rate(world, WINDOW)


# A server's policy has its prefills' draft times (the catch-up's per-token bound) before it
# decides: the replays give it each trace's first ones, where the trace recorded them.
RECORDED_PREFILLS = 64


def recorded_policy(trace: Path, meta: dict):
    policy = throughput_policy_for(meta)
    lines = [json.loads(line) for line in read_trace_text(trace).splitlines() if '"k":"prefill"' in line]
    for line in lines[:RECORDED_PREFILLS]:
        policy.add_draft_prefill(line["tokens"], line["draft_ms"])
    return policy


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name)
def test_regret_on_recorded_traces(trace: Path) -> None:
    steps, meta = load_recorded(trace)
    world = recorded_world(steps, meta)
    assert regret(recorded_policy(trace, meta), world) <= MAX_REGRET


def recorded_segments():
    for trace in TRACES:
        _, meta = load_recorded(trace)
        for name in meta.get("segments", {}):
            yield pytest.param(trace, name, id=f"{trace.name.split('.jsonl')[0]}:{name}")


def test_a_replay_world_follows_what_was_measured_near_each_step_in_both_modes() -> None:
    """One request's speculative steps at 9k KV tokens, then at 700 (H200, triton: 26 ms and
    7.8 ms): no line holds both (one fit put 20 ms on the short ones), so a world scales each
    mode's fit by its measured ratio over the nearest steps of that mode, for both modes alike;
    one step's own noise moves its cost by a sixteenth at most."""
    from sglang_dynamic_eagle.policy.replay import LOCAL_STEPS, TraceStep

    long_steps = [TraceStep(1, 9200 + i, 0, SPEC, 26.2, 3.0) for i in range(40)]
    short_steps = [TraceStep(1, 700 + i, 0, SPEC, 7.8 if i != 30 else 9.8, 3.0) for i in range(60)]
    # Eight long requests cost less per KV token than one (44 ms at 73.6k, 9.7 ms at 5.6k).
    eights = [TraceStep(8, kv, 0, SPEC, ms, 24.0) for kv, ms in ((73600, 44.0), (5600, 9.7)) for _ in range(30)]
    plain = [TraceStep(b, 700 * b, 0, PLAIN, 5.0 + 0.02 * b) for b in (1, 2, 4, 8, 16) for _ in range(6)]
    world = World.from_trace(long_steps + short_steps + plain + eights, BUCKETS, 128, catchup_per_token_ms=0.001)
    assert world.spec_ms[0] == pytest.approx(26.2, rel=0.1)
    assert world.spec_ms[60:100] == pytest.approx([7.8] * 40, rel=0.1)
    assert abs(world.spec_ms[70] - world.spec_ms[69]) <= 2.0 / LOCAL_STEPS + 1e-6


def test_a_replayed_policy_is_told_the_worlds_acceptance() -> None:
    """Verifies report whole drafts; over verifies they carry the world's fractional mean (1.6 at
    four requests, not the 1.5 that rounding each verify gave)."""
    policy = ThresholdPolicy(ThresholdPolicyConfig(0, 0, 1, 128))
    told = []
    policy.add_verify = lambda drafts: told.extend(drafts)
    simulate(policy, modelled_world([4] * 200, [700] * 200, [1.6] * 200), WINDOW)
    assert 1 + sum(told) / len(told) == pytest.approx(1.6, abs=0.01)


@pytest.mark.parametrize("trace, segment", list(recorded_segments()))
def test_regret_on_each_load_of_a_recorded_trace(trace: Path, segment: str) -> None:
    steps, meta = load_recorded(trace)
    first, end = meta["segments"][segment]
    world = recorded_world(steps, meta).part(first, end)
    assert regret(recorded_policy(trace, meta), world) <= MAX_REGRET


@pytest.mark.parametrize("name", sorted(MODELLED))
def test_regret_on_modelled_traces(name: str) -> None:
    assert regret(modelled_policy(), MODELLED[name]) <= MAX_REGRET


def test_recorded_trace_separates_the_policies() -> None:
    """The bar can fail: speculating always, or never, misses it by far on the recorded trace."""
    steps, meta = load_recorded(TRACES[0].parent / "h200-dummy8b-acc3.0-poisson.jsonl.xz")
    world = recorded_world(steps, meta)
    always = ThresholdPolicy(ThresholdPolicyConfig(0, 0, 1, meta["max_speculative_batch"]))
    never = ThresholdPolicy(ThresholdPolicyConfig(1, 0, 1, meta["max_speculative_batch"]),
                            initial_mode=PLAIN)
    assert regret(always, world) > MAX_REGRET
    assert regret(never, world) > MAX_REGRET


def test_a_batch_size_rule_fails_where_contexts_are_long() -> None:
    """Negative control: fixed batch thresholds (speculate up to 16-24 requests) miss the bar
    once long contexts move the crossover."""
    control = ThresholdPolicy(ThresholdPolicyConfig(24, 16, 4, 128))
    assert regret(control, MODELLED["long-context-acc3.0"]) > MAX_REGRET


class KvBlind:
    """The automatic policy with the KV tokens hidden from it (negative control)."""

    def __init__(self, policy) -> None:
        self.policy = policy

    def decide(self, obs: StepObservation) -> DecodeMode:
        return self.policy.decide(replace(obs, kv_tokens=0))

    def add_step_time(self, step, mode, batch_size, kv_tokens, ms) -> None:
        self.policy.add_step_time(step, mode, batch_size, 0, ms)

    def __getattr__(self, name):
        return getattr(self.policy, name)


def test_a_policy_blind_to_kv_tokens_fails_on_mixed_contexts() -> None:
    assert regret(KvBlind(modelled_policy(kv_scale=0.0)), MODELLED["mixed-contexts-acc2.5"]) \
        > MAX_REGRET


def decisions(policy, world: World) -> List[DecodeMode]:
    modes: List[DecodeMode] = []
    decide = policy.decide

    def recording(obs):
        modes.append(decide(obs))
        return modes[-1]

    policy.decide = recording
    simulate(policy, world, WINDOW)
    return modes


def test_deterministic_so_tensor_parallel_ranks_agree() -> None:
    world = MODELLED["chat-walk-acc3.0"]
    assert decisions(modelled_policy(), world) == decisions(modelled_policy(), world)


def spec_steps(policy, world: World) -> int:
    return simulate(policy, world, WINDOW).speculative_steps


@pytest.mark.parametrize("name", ["chat-walk-acc1.6", "light-acc2.2"])
def test_monotone_in_acceptance(name: str) -> None:
    base = MODELLED[name]
    counts = []
    for scale in (0.8, 1.0, 1.3):
        world = replace(base, spec_tokens=base.spec_tokens * scale)
        counts.append(spec_steps(modelled_policy(), world))
    assert counts == sorted(counts) and counts[0] < counts[-1]


def test_monotone_in_the_cost_ratio() -> None:
    base = MODELLED["chat-walk-acc3.0"]
    counts = []
    for scale in (1.3, 1.0, 0.8):  # speculative steps dearer to cheaper, prior and truth alike
        world = replace(base, spec_ms=base.spec_ms * scale)
        counts.append(spec_steps(modelled_policy(spec_scale=scale), world))
    assert counts == sorted(counts) and counts[0] < counts[-1]


def test_no_flapping_faster_than_the_catchup_cost_allows() -> None:
    """A batch oscillating around the crossover every step: each return to speculation must be
    paid for by accumulated predicted loss at least the catch-up's cost, so switches stay rare."""
    n = 2000
    batches = [12 if i % 2 else 30 for i in range(n)]  # speculation pays at 12, not at 30
    world = modelled_world(batches, [700] * n, [2.4] * n)
    result = simulate(modelled_policy(), world, WINDOW)
    assert result.switches <= n // 20
    assert regret(modelled_policy(), world) <= MAX_REGRET


def test_a_burst_leaves_speculation_before_the_batch_grows() -> None:
    """Two requests speculate; a burst of 100 queues behind them: plain at the very next step,
    because the batch the queue will fill decodes faster plainly."""
    policy = modelled_policy()
    for step in range(1, 200):
        policy.decide(StepObservation(batch_size=2, kv_tokens=1600, step=step))
        policy.add_verify([2, 2])
    assert policy.mode is SPEC
    assert policy.decide(StepObservation(batch_size=2, kv_tokens=1600, queued=100,
                                         step=200)) is PLAIN


def test_requests_that_finish_this_step_decode_plainly() -> None:
    policy = modelled_policy()
    for step in range(1, 50):
        policy.decide(StepObservation(batch_size=4, kv_tokens=3000, step=step))
        policy.add_verify([2] * 4)
    obs = StepObservation(batch_size=4, kv_tokens=3000, remaining=[1, 1, 1, 1], step=50)
    assert policy.decide(obs) is PLAIN


def test_requests_that_accept_poorly_pull_the_batch_to_plain() -> None:
    """Per-request acceptance: the same batch speculates when its requests accept well and not
    when they accept poorly, whatever the server-wide mean."""
    def mode_with(accepted_per_verify: float) -> DecodeMode:
        policy = modelled_policy()
        for step in range(1, 40):
            policy.add_verify([2] * 24)  # server mean 3.0
            policy.decide(StepObservation(batch_size=24, kv_tokens=24 * 700, step=step,
                                          verifies=[20] * 24,
                                          accepted=[int(20 * accepted_per_verify)] * 24))
        return policy.mode

    assert mode_with(3.5) is SPEC
    assert mode_with(1.2) is PLAIN


def test_exploration_stays_within_its_budget() -> None:
    """Plain is right all along (acceptance 1.0, speculation could pay only at full
    acceptance): the speculative probes' extra time stays within the budget's share."""
    n = 6000
    world = modelled_world(random_walk(n, seed=5, high=24, step=1), [800] * n, [1.0] * n)
    policy = modelled_policy()
    result = simulate(policy, world, WINDOW)
    plain_ms = float(world.plain_ms.sum())
    assert policy.probes >= 1  # it does measure
    assert result.ms - plain_ms <= 2 * EXPLORATION_SHARE * plain_ms + 30.0


def test_a_lone_request_that_accepts_nothing_costs_no_more_than_the_share() -> None:
    """One request at a time, no draft ever accepted: probes cost what the budget allows (x1.25
    for the catch-ups). When the long-run acceptance forgot per decode step rather than per
    verify, the prior of full acceptance held 14% of the estimate between probes: 1.4%."""
    n = 20000
    world = modelled_world([1] * n, [800] * n, [1.0] * n)
    policy = modelled_policy()
    result = simulate(policy, world, WINDOW)
    plain_ms = float(world.plain_ms.sum())
    assert policy.probes >= 1
    assert result.ms - plain_ms <= 1.25 * EXPLORATION_SHARE * plain_ms


class FedPolicy:
    """A policy driven as the worker drives it: each decided step ends at its feed's
    ``step_end`` (the decision log's entry), step times come back through the feed."""

    def __init__(self, policy) -> None:
        from sglang_dynamic_eagle.engine.observations import PolicyFeed

        self.policy, self.feed = policy, PolicyFeed(policy)

    def __getattr__(self, name: str):
        return getattr(self.policy, name)

    def decide(self, obs: StepObservation) -> DecodeMode:
        mode = self.policy.decide(obs)
        self.feed.step_end(self.policy.step, 0.0, 0.0)
        return mode

    def add_step_time(self, step: int, mode: DecodeMode, b: int, kv: int, ms: float) -> None:
        self.feed.step_time(step, mode, b, kv, ms)


def test_the_server_report_shows_predictions_and_measurements() -> None:
    policy = FedPolicy(modelled_policy())
    world = MODELLED["light-acc2.2"]
    simulate(policy, world, WINDOW)
    report = policy.feed.report()
    recent = report["recent_decisions"]
    assert recent and {"plain_tok_per_s", "spec_tok_per_s", "predicted_ms", "measured_ms",
                        "reason"} <= set(recent[0])
    assert 0 < report["prediction_error"] < 0.1


def test_a_bucket_without_a_replay_learns_its_cost() -> None:
    """Speculative graphs timed only up to 4 (the rest uncalibrated): steps at 128 cost five
    times the nearest replay; the model must learn that instead of treating them as stalls,
    and the policy must leave speculation there."""
    calibration = {PLAIN: {b: 0.9 * plain_base(b) for b in BUCKETS},
                   SPEC: {b: 0.9 * spec_base(b) for b in BUCKETS if b <= 4}}
    config = ThroughputPolicyConfig(max_speculative_batch=128, max_running_requests=256,
                                    kv_capacity_tokens=2_000_000, catchup_window=WINDOW)
    policy = new_throughput_policy(config, {PLAIN: BUCKETS, SPEC: BUCKETS}, calibration,
                                   {PLAIN: PLAIN_KV_MS, SPEC: SPEC_KV_MS}, spec_base(1), 4.0)
    true_ms = spec_base(128) + SPEC_KV_MS * 128 * 700
    for step in range(1, 50):  # a light start: the fit learns small steps
        policy.decide(StepObservation(batch_size=2, kv_tokens=1400, step=step))
        policy.add_verify([1, 1])
        policy.add_step_time(step, SPEC, 2, 1400, spec_base(2) + SPEC_KV_MS * 1400)
    for step in range(50, 350):
        obs = StepObservation(batch_size=128, kv_tokens=128 * 700, step=step)
        mode = policy.decide(obs)
        policy.add_verify([1] * 128)  # acceptance 2.0
        if mode is SPEC:
            policy.add_step_time(step, SPEC, 128, 128 * 700, true_ms)
        else:
            policy.add_step_time(step, PLAIN, 128, 128 * 700,
                                 plain_base(128) + PLAIN_KV_MS * 128 * 700)
    assert policy.costs[SPEC].predict(128, 128 * 700) == pytest.approx(true_ms, rel=0.1)
    assert policy.mode is PLAIN


@pytest.mark.parametrize("batch", [0, 1, 128, 129, 10_000])
def test_any_batch_decides_without_error(batch: int) -> None:
    """Eager servers (no replay timed at all), a fit extrapolated below zero, empty batches,
    batches beyond every bucket: a mode, never an exception."""
    config = ThroughputPolicyConfig(max_speculative_batch=128, max_running_requests=256,
                                    kv_capacity_tokens=2_000_000, catchup_window=WINDOW)
    policy = new_throughput_policy(config, {PLAIN: BUCKETS, SPEC: BUCKETS}, {},
                                   {PLAIN: PLAIN_KV_MS, SPEC: SPEC_KV_MS}, 0.0, 4.0)
    for step, b in enumerate([64, 128, 64, 128, 64, 128], start=1):
        policy.add_step_time(step, PLAIN, b, 0, 2.0 if b == 64 else 12.0)  # extrapolates < 0 at 1
        policy.add_step_time(step, SPEC, b, 0, 20.0 if b == 64 else 40.0)
    for step in (10, 11, 12):  # the first may switch, the next stay (and weigh a probe)
        obs = StepObservation(batch_size=batch, kv_tokens=batch * 1000, step=step,
                              remaining=[1] * batch if batch <= 128 else ())
        assert policy.decide(obs) in (PLAIN, SPEC)


def test_a_recorded_trace_carries_the_policy_that_recorded_it(tmp_path) -> None:
    """A server's trace begins with its policy's configuration and priors: replaying it needs
    nothing else, and rebuilds the same policy."""
    from sglang_dynamic_eagle.engine.observations import PolicyFeed
    from sglang_dynamic_eagle.observability.trace import policy_config, traced

    path = tmp_path / "trace.jsonl"
    original = modelled_policy()
    policy, feed = traced(original, PolicyFeed(original), str(path))
    for step, b in enumerate([4, 8, 40, 8], start=1):
        mode = policy.decide(StepObservation(batch_size=b, kv_tokens=700 * b, step=step))
        feed.step_time(step, mode, b, 700 * b, 6.0 + 0.1 * b)
    feed.catchup(64, 2.0)
    feed.catchup(128, 2.5)
    feed.catchup(256, 3.5)
    steps, meta = load_recorded(path)
    assert [s.batch for s in steps] == [4, 8, 40, 8]
    assert policy_config(throughput_policy_for(meta)) == policy_config(original)
    assert meta["catchup"]["per_token_ms"] == pytest.approx(1.0 / 128)


def test_a_traced_step_carries_the_decisions_reason_and_predictions(tmp_path) -> None:
    """Each step line of the automatic policy says why it chose and what it predicted of both
    modes (the decision /server_info lists); a policy without predictions writes none."""
    import json

    from sglang_dynamic_eagle.engine.observations import PolicyFeed
    from sglang_dynamic_eagle.observability.trace import traced

    for original, predicts in ((modelled_policy(), True),
                               (ThresholdPolicy(ThresholdPolicyConfig(24, 16, 4, 128)), False)):
        path = tmp_path / f"trace-{predicts}.jsonl"
        policy, _ = traced(original, PolicyFeed(original), str(path))
        written = []
        for step, (b, queued) in enumerate([(4, 0), (8, 0), (40, 20)], start=1):
            policy.decide(StepObservation(batch_size=b, kv_tokens=700 * b, queued=queued, step=step))
            written.append(original.latest if predicts else None)
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        steps = [line for line in lines if line["k"] == "step"]
        if not predicts:
            assert all("why" not in line and "ps" not in line for line in steps)
            continue
        assert [(line["why"], line["pp"], line["ps"]) for line in steps] == [
            (d.reason, round(d.plain_tok_per_s), round(d.spec_tok_per_s)) for d in written]
        assert all(line["ps"] > 0 and line["pp"] > 0 for line in steps)
        # The speculative step's predicted tokens and the chosen mode's predicted milliseconds.
        assert [(line["ys"], line["pt"]) for line in steps] == [
            (round(d.spec_tokens, 1), round(d.predicted_ms, 3)) for d in written]
        assert [line["ps"] for line in steps] == [round(1000 * d.spec_tokens / original.costs[SPEC].predict(
            min(d.projected_batch, original.max_speculative_batch), d.kv_tokens * min(
                d.projected_batch, original.max_speculative_batch) / d.batch)) for d in written]
        assert [line.get("pb") for line in steps] == [None, None, 60]  # the queue's batch
        # Read back as the rate expected of the batch that ran: none where a queue set another.
        assert [s.predicted for s in load_recorded(path)[0]] == [
            line["pp" if line["mode"] == "plain" else "ps"] for line in steps[:2]] + [None]


def test_a_queue_beyond_the_largest_graphs_is_judged_at_those_graphs() -> None:
    """Overload with fa3 (one H200, 2026-12-04): about 120 requests running on graphs up to 128,
    dozens queued, so the batch the load heads for lies above both modes' graphs. Each mode is
    taken at its largest graph's batch; speculation, 1.6x plain's tokens per second there, keeps
    the batch (it had given way to plain as 'cost unknown', 60% of the steps, 21% below the
    replay oracle on that load)."""
    calibration = {PLAIN: {b: 4.7 + 0.03 * b for b in BUCKETS}, SPEC: {b: 8.4 + 0.06 * b for b in BUCKETS}}
    config = ThroughputPolicyConfig(max_speculative_batch=128, max_running_requests=2048,
                                    kv_capacity_tokens=120_000, catchup_window=WINDOW)
    policy = new_throughput_policy(config, {PLAIN: BUCKETS, SPEC: BUCKETS}, calibration,
                                   {PLAIN: PLAIN_KV_MS, SPEC: SPEC_KV_MS}, catchup_prior_fixed_ms=8.4,
                                   max_acceptance=4.0)
    modes = []
    for step in range(1, 201):
        modes.append(policy.decide(StepObservation(batch_size=120, kv_tokens=100_000, queued=60, step=step)))
        policy.add_verify([2] * 120)
    assert policy.projected_batch(StepObservation(batch_size=120, kv_tokens=100_000, queued=60)) > 128
    assert modes.count(SPEC) >= 0.95 * len(modes)
    reasons = policy.report()["decisions_by_reason"]  # /server_info says why it chose
    assert sum(reasons.values()) == len(modes) and "cost unknown" not in reasons


def test_a_replay_world_costs_no_step_below_its_graph_and_kv_lower_bound() -> None:
    """Plain timed at one graph only, where host-bound steps of short contexts ran slower than
    GPU-bound ones of long contexts (a fit's KV slope then comes out negative), while a load
    speculated at other sizes: extrapolated, that fit puts plain steps of long contexts below
    their graph's start-up timing. The world's cost is at least that timing plus the KV at the
    bandwidth prior."""
    from sglang_dynamic_eagle.policy.replay import TraceStep

    plain = [TraceStep(b, kv, 0, PLAIN, ms) for kv, ms in ((8000, 6.0), (16000, 5.8), (32000, 5.4),
                                                         (64000, 4.8)) for b in (5, 6, 7, 8)]
    spec = [TraceStep(b, 1000 * b, 0, SPEC, 8.4 + 0.08 * b, 3.0 * b) for b in (8, 32, 64, 120) for _ in range(8)]
    untimed = [TraceStep(b, 1000 * b, 0, PLAIN) for b in (32, 64, 120)]
    steps = plain + spec + untimed
    calibration = {b: 4.7 + 0.01 * b for b in BUCKETS}
    world = World.from_trace(steps, BUCKETS, 128, catchup_per_token_ms=0.001,
                             priors={PLAIN: (calibration, PLAIN_KV_MS)})
    for i, s in enumerate(untimed, start=len(steps) - len(untimed)):
        assert world.plain_ms[i] >= calibration[s.batch] + PLAIN_KV_MS * s.kv_tokens - 1e-9


@pytest.mark.parametrize("plain_batches", [(1,), (1, 32)])
@pytest.mark.parametrize("min_fit_buckets", [None, 1])
def test_a_mode_timed_at_too_few_sizes_is_costed_by_its_start_up_timings(monkeypatch, min_fit_buckets,
                                                                         plain_batches) -> None:
    """A load that speculated almost throughout (the H100 closed-loop trace, fa3, acceptance 1.6:
    plain timed at one request and at 32 only). Plain steps whose time rises with a narrow spread
    of KV tokens give a fit a KV slope forty times the bandwidth's, and 64 requests at 40k tokens
    tens of milliseconds where the graph took 7. Timed at fewer than ``MIN_FIT_BUCKETS`` buckets,
    a mode is costed at its start-up timings plus the KV at the prior, shifted by the median
    residual (1 ms here); with the rule off (the negative control) the extrapolation comes back."""
    from sglang_dynamic_eagle.policy import replay
    from sglang_dynamic_eagle.policy.replay import TraceStep

    if min_fit_buckets is not None:
        monkeypatch.setattr(replay, "MIN_FIT_BUCKETS", min_fit_buckets)
    calibration = {b: 6.2 + 0.014 * b for b in BUCKETS}
    rng = np.random.default_rng(0)
    plain = [TraceStep(b, kv, 0, PLAIN, calibration[b] + 1.0 + PLAIN_KV_MS * kv + 0.0015 * (kv - 600 * b)
                       + rng.normal(0, 0.01)) for b in plain_batches for kv in range(600 * b, 600 * b + 240, 5)]
    spec = [TraceStep(b, 700 * b, 0, SPEC, 7.8 + 0.06 * b, 1.6 * b) for b in (1, 8, 32, 64) for _ in range(8)]
    untimed = [TraceStep(64, 40000, 0, PLAIN)]
    world = World.from_trace(plain + spec + untimed, BUCKETS, 128, catchup_per_token_ms=0.001,
                             priors={PLAIN: (calibration, PLAIN_KV_MS)})
    expected = calibration[64] + PLAIN_KV_MS * 40000 + 1.0 + 0.0015 * 120  # the median residual: 1.18
    if min_fit_buckets is None:
        assert world.plain_ms[-1] == pytest.approx(expected, abs=0.05)
    else:
        assert world.plain_ms[-1] > 2 * expected


# The same server on fa3 (sglang's default on Hopper; H200, 2026-12-04 start-up calibration):
# a speculative step costs about 1.7x a plain one at every graph size, so the crossover moves
# with acceptance alone (a tie near 1.8 tokens per verify).
def fa3_plain_base(b: int) -> float:
    return 4.7 + 0.03 * b


def fa3_spec_base(b: int) -> float:
    return 8.4 + 0.06 * b


def fa3_world_and_policy(batches, acceptance: float, queued, plain_buckets, spec_buckets,
                         kv_capacity_tokens: int):
    """A world of the fa3-shaped step costs over ``batches`` (graphs up to the buckets' largest)
    and the policy that server would build (replays at 90% of the step, physical KV priors)."""
    n, top = len(batches), max(spec_buckets)
    world = synthetic_world(
        batches, [900] * n, [acceptance] * n, queued, plain_base_ms=fa3_plain_base,
        spec_base_ms=fa3_spec_base, plain_per_kv_token_ms=PLAIN_KV_MS, spec_per_kv_token_ms=SPEC_KV_MS,
        max_speculative_batch=top, catchup_per_token_ms=0.0008, catchup_fixed_ms=1.5, buckets=spec_buckets)
    config = ThroughputPolicyConfig(max_speculative_batch=top, max_running_requests=2048,
                                    kv_capacity_tokens=kv_capacity_tokens, catchup_window=WINDOW)
    policy = new_throughput_policy(
        config, {PLAIN: plain_buckets, SPEC: spec_buckets},
        {PLAIN: {b: 0.9 * fa3_plain_base(b) for b in plain_buckets},
         SPEC: {b: 0.9 * fa3_spec_base(b) for b in spec_buckets}},
        {PLAIN: PLAIN_KV_MS, SPEC: SPEC_KV_MS}, catchup_prior_fixed_ms=fa3_spec_base(1), max_acceptance=4.0)
    return world, policy


@pytest.mark.parametrize("acceptance", [1.3, 1.6, 1.8, 2.2, 3.0])
def test_regret_on_fa3_shaped_traffic_at_several_acceptance_levels(acceptance: float) -> None:
    batches = random_walk(3000, seed=3, high=150, step=4)
    world, policy = fa3_world_and_policy(batches, acceptance, [40 if b > 110 else 0 for b in batches],
                                         BUCKETS, BUCKETS, kv_capacity_tokens=120_000)
    assert regret(policy, world) <= MAX_REGRET


# sglang's decode graph sizes on an H200 without a flag (max 256): the normal list for the plain
# graphs, the speculative list for EAGLE's (server_args._generate_decode_cuda_graph_batch_sizes).
PLAIN_BUCKETS_256 = [1, 2, 4, 8, 12] + list(range(16, 257, 8))
SPEC_BUCKETS_256 = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4))
                    + list(range(72, 257, 8)))


@pytest.mark.parametrize("acceptance", [1.6, 2.2, 3.0])
def test_regret_on_fa3_shaped_overload_with_sglangs_default_graph_sizes(acceptance: float) -> None:
    """Batches up to 300 (above 256 every step is plain), a queue while above 200: the regime of
    an H200 at overload with sglang's default graphs, where the graphs end at 256, not 128."""
    batches = random_walk(3000, seed=5, high=300, step=6)
    world, policy = fa3_world_and_policy(batches, acceptance, [60 if b > 200 else 0 for b in batches],
                                         PLAIN_BUCKETS_256, SPEC_BUCKETS_256, kv_capacity_tokens=400_000)
    assert regret(policy, world) <= MAX_REGRET
    if acceptance == 1.6:  # the world tells the modes apart: speculating wherever a graph exists loses
        always = ThresholdPolicy(ThresholdPolicyConfig(0, 0, 1, 256))
        assert regret(always, world) > MAX_REGRET


def test_speculation_is_never_judged_above_its_largest_timed_graph() -> None:
    """Speculative graphs captured up to 40 of a cap of 48 (a cap that is not a captured size),
    speculation 10x dearer, 100 queued: plain, never speculation as 'cost unknown'."""
    buckets = [1, 2, 4, 8, 16, 24, 32, 40]
    config = ThroughputPolicyConfig(max_speculative_batch=48, max_running_requests=2048,
                                    kv_capacity_tokens=2_000_000, catchup_window=WINDOW)
    policy = new_throughput_policy(config, {PLAIN: BUCKETS, SPEC: buckets},
                                   {PLAIN: {b: plain_base(b) for b in BUCKETS}, SPEC: {b: 10 * spec_base(b) for b in buckets}},
                                   {PLAIN: PLAIN_KV_MS, SPEC: SPEC_KV_MS}, catchup_prior_fixed_ms=8.0, max_acceptance=4.0)
    modes = [policy.decide(StepObservation(batch_size=30, kv_tokens=21_000, queued=100, step=i)) for i in range(1, 60)]
    assert modes.count(SPEC) <= 1
    assert "cost unknown" not in policy.report()["decisions_by_reason"]


def _near_tie_after_a_clear_stretch(monkeypatch=None, cap_probes: Optional[float] = None) -> float:
    """Regret (below the oracle) over 2,000 steps at 16 requests where plain is 4% faster, after
    3,000 steps at acceptance 3.0 where speculation clearly wins and no probe is taken, so the
    exploration budget has saved up to its cap."""
    if cap_probes is not None:
        monkeypatch.setattr(throughput, "EXPLORATION_CAP_PROBES", cap_probes)
    n1, n2 = 3000, 2000
    world = modelled_world([16] * (n1 + n2), [900] * (n1 + n2), [3.0] * n1 + [2.18] * n2)
    policy = modelled_policy()
    simulate(policy, world.part(0, n1), WINDOW)
    tie = world.part(n1, n1 + n2)
    return 1.0 - simulate(policy, tie, WINDOW).rate / oracle_rate(tie, WINDOW)


def test_probes_near_a_tie_stay_within_the_exploration_share(monkeypatch) -> None:
    """Near a tie a probe is predicted to lose little. When the budget held two probes at full
    step time, the balance saved over a clear stretch paid for one probe after another (an H100
    at closed loop 128 and acceptance 1.6: 18 of 21 probes one plain step apart, 0.946x plain,
    2026-12-05); it now holds two of the probes it pays for, and the loss stays near the 1% share
    (0.99%; 2.08% before). A budget that saves up for a burst of 40 breaks the bar."""
    assert _near_tie_after_a_clear_stretch() < throughput.EXPLORATION_SHARE + 0.0025
    assert _near_tie_after_a_clear_stretch(monkeypatch, 40.0) > throughput.EXPLORATION_SHARE + 0.0025


def test_a_catch_up_that_compiled_does_not_hold_plain_decoding_where_speculation_pays() -> None:
    """The flashinfer server of the committed fixture, its catch-ups as they came (2, 8, 16 and
    32 tokens, the last a compile), after a lone request's last token took it to plain: at 64
    requests accepting 3.0 it returns to speculation within a few steps once the draft's
    prefill bounds the catch-up's per-token cost; without that bound (the negative control) the
    return is priced at 47 ms per plain step and it stays plain, as the server did for 512 steps."""
    from test_step_model import FLASHINFER_CATCHUPS, FLASHINFER_DRAFT_PREFILLS

    meta = json.loads((Path(__file__).parent / "data" / "traces" /
                       "h100-dummy8b-flashinfer-closed.json").read_text())
    steps_to_return = {}
    for bounded in (False, True):
        policy = throughput_policy_for(meta)
        for tokens, ms in FLASHINFER_CATCHUPS:
            policy.add_catchup(tokens, ms)
        if bounded:
            for tokens, ms in FLASHINFER_DRAFT_PREFILLS:
                policy.add_draft_prefill(tokens, ms)
        for _ in range(20):
            policy.add_verify([2])
        assert policy.decide(StepObservation(batch_size=1, kv_tokens=600,
                                             remaining=(1,))) is DecodeMode.PLAIN
        steps_to_return[bounded] = None
        for i in range(300):
            obs = StepObservation(batch_size=64, kv_tokens=36000 + 64 * i, remaining=(200,) * 64)
            if policy.decide(obs) is DecodeMode.SPECULATIVE:
                steps_to_return[bounded] = i + 1
                break
    assert steps_to_return[False] is None
    assert steps_to_return[True] is not None and steps_to_return[True] <= 8
