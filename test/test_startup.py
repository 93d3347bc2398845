"""engine/startup.py on CPU: what the worker builds once sglang's graphs are captured, from
stand-in runners (graph runners with their batch sizes, the target's pools) and with the GPU
measurements (graph replays, copy bandwidth, KV bytes) replaced by fixed numbers."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import List, Optional

import pytest
import torch

from sglang_dynamic_eagle.config import Config
from sglang_dynamic_eagle.engine import startup, step_costs
from sglang_dynamic_eagle.engine.observations import PolicyFeed
from sglang_dynamic_eagle.observability.trace import TracedFeed, TracedPolicy
from sglang_dynamic_eagle.policy import DecodeMode, ThresholdPolicy
from sglang_dynamic_eagle.policy.throughput import ThroughputPolicy
from sglang_dynamic_eagle.sglang_compat.startup_errors import StartupError

PLAIN, SPEC = DecodeMode.PLAIN, DecodeMode.SPECULATIVE
PLAIN_BS = [1, 2, 4, 8, 16, 32, 64]
SPEC_BS = [1, 2, 4, 8, 16, 32]
REQUEST_SLOTS, HIDDEN_WIDTH = 8, 12
GBPS = 1000.0  # the stand-in copy bandwidth: 1e9 bytes per ms
KV_BYTES = {"target": 2000.0, "draft": 500.0}


def graph_runner(capture_bs: List[int]) -> SimpleNamespace:
    return SimpleNamespace(capture_bs=list(capture_bs), max_bs=max(capture_bs))


def fake_worker(spec_max: Optional[List[int]] = (32, 32, 16)) -> SimpleNamespace:
    """An EAGLEWorkerV2 as startup reads it; ``spec_max``: the largest batch of the draft,
    verify and draft-extend graph runners (None: no speculative graphs captured)."""
    runners = ([graph_runner([bs for bs in SPEC_BS if bs <= top]) for top in spec_max]
               if spec_max else [None, None, None])
    target_runner = SimpleNamespace(
        name="target", req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros(REQUEST_SLOTS, 4)),
        model_config=SimpleNamespace(dtype=torch.bfloat16), device=torch.device("cpu"),
        tp_group=None, decode_cuda_graph_runner=runners[1], max_running_requests=64,
        max_total_num_tokens=100_000)
    draft_worker = SimpleNamespace(draft_runner=SimpleNamespace(name="draft"),
                                   cuda_graph_runner=runners[0],
                                   cuda_graph_runner_for_draft_extend=runners[2])
    decode = SimpleNamespace(bs=list(SPEC_BS), max_bs=64)
    return SimpleNamespace(
        _target_worker=SimpleNamespace(model_runner=target_runner), _draft_worker=draft_worker,
        server_args=SimpleNamespace(cuda_graph_config=SimpleNamespace(decode=decode),
                                    max_running_requests=None, disable_cuda_graph_padding=False),
        topk=1, speculative_num_steps=3, speculative_num_draft_tokens=4)


@pytest.fixture
def measured(monkeypatch) -> List:
    """Fixed GPU measurements; returns the calibrations asked for (mode runners, buckets)."""
    monkeypatch.setattr(startup, "warm_sglang_jit_kernels", lambda runner, cap: None)
    asked: List = []

    def calibrate(mode_runners, buckets, recorded=None):
        asked.append((mode_runners, buckets))
        calibrate.recorded = recorded
        return {PLAIN: {bs: 10.0 + bs for bs in buckets[PLAIN]},
                SPEC: {bs: 12.0 + 3 * bs for bs in buckets[SPEC]}}

    calibrate.recorded = None
    monkeypatch.setattr(startup, "calibrate", calibrate)
    monkeypatch.setattr(startup, "memory_bandwidth_gbps", lambda device: GBPS)
    monkeypatch.setattr(startup, "kv_bytes_per_token", lambda runner: KV_BYTES[runner.name])
    monkeypatch.setattr(startup, "get_draft_input_from_target_hidden_dim", lambda runner: HIDDEN_WIDTH)
    return asked


def plain_graphs(capture_bs: Optional[List[int]] = PLAIN_BS) -> SimpleNamespace:
    runner = graph_runner(capture_bs) if capture_bs else None
    if runner is not None:
        runner.replay_ms = {bs: 1.0 for bs in capture_bs}  # timed at capture
    return SimpleNamespace(graph_runner=runner, max_bs=runner.max_bs if runner else 0)


def test_the_speculative_limit_is_the_smallest_captured_graph() -> None:
    assert startup.speculative_graph_max_bs(fake_worker(), Config()) == 16
    # Without captured graphs: the flags' rule over the decode graphs' full size.
    assert startup.speculative_graph_max_bs(fake_worker(None), Config()) == 64
    assert startup.speculative_graph_max_bs(fake_worker(None), Config(24, 16, 4)) == 48


def test_the_catch_up_follows_the_configuration(measured) -> None:
    config = Config(catchup_budget_mib=1, catchup_window=16)
    catchup = startup.new_catchup(fake_worker(), config)
    # per entry: 12 hidden values of 2 bytes and an 8-byte token
    assert catchup.ring_size == 2**20 // (HIDDEN_WIDTH * 2 + 8)
    assert catchup.max_window == 16 and catchup.stash_bytes == catchup.ring_size * 32


def test_fixed_thresholds_make_the_threshold_policy(measured) -> None:
    policy = startup.new_policy(fake_worker(), Config(24, 16, 2), 48, plain_graphs(), 16)
    assert isinstance(policy, ThresholdPolicy) and measured == []
    assert policy.max_speculative_batch == 48
    assert startup.policy_summary(policy) == (
        "fixed thresholds (disable above 24, re-enable at <= 16, patience 2)")


def test_the_automatic_policy_starts_from_the_calibrated_priors(measured) -> None:
    worker = fake_worker()
    policy = startup.new_policy(worker, Config(), 16, plain_graphs(), catchup_window=16)
    assert isinstance(policy, ThroughputPolicy)
    [(mode_runners, buckets)] = measured
    assert buckets == {PLAIN: PLAIN_BS, SPEC: [1, 2, 4, 8, 16]}
    assert mode_runners[SPEC] == startup.speculative_graph_runners(worker)
    # The plain graphs' times come from their capture, not from a replay after it.
    assert startup.calibrate.recorded == {PLAIN: {bs: 1.0 for bs in PLAIN_BS}}
    plain_cost, spec_cost = policy.costs[PLAIN], policy.costs[SPEC]
    assert plain_cost.calibration == {bs: 10.0 + bs for bs in PLAIN_BS}
    assert spec_cost.calibration == {bs: 12.0 + 3 * bs for bs in [1, 2, 4, 8, 16]}
    # KV bytes over 1e9 bytes per ms; a speculative step reads the draft's KV 3 + 1 times.
    assert plain_cost.prior_per_kv_token_ms == pytest.approx(2000.0 / 1e9)
    assert spec_cost.prior_per_kv_token_ms == pytest.approx((2000.0 + 4 * 500.0) / 1e9)
    assert policy.config.max_speculative_batch == 16 and policy.config.catchup_window == 16
    assert policy.config.max_running_requests == 64
    assert startup.policy_summary(policy).startswith("automatic switching")


def test_buckets_without_plain_graphs_are_a_plain_servers(measured, monkeypatch) -> None:
    monkeypatch.setattr(startup, "plain_decode_batch_sizes", lambda server_args: [1, 2, 4])
    startup.new_policy(fake_worker(), Config(), 16, plain_graphs(None), catchup_window=16)
    [(mode_runners, buckets)] = measured
    assert buckets[PLAIN] == [1, 2, 4] and mode_runners[PLAIN] == []


@pytest.mark.parametrize("trace", [False, True], ids=["untraced", "traced"])
def test_build_decode_parts(measured, monkeypatch, tmp_path, trace: bool) -> None:
    built = {}
    monkeypatch.setattr(startup, "check_cuda_graph_backend", lambda phase, backend: False)
    monkeypatch.setattr(startup, "plain_decode_batch_sizes", lambda server_args: PLAIN_BS)
    monkeypatch.setattr(startup, "PlainDecodeGraphs",
                        lambda runner, capture_bs: built.setdefault("graphs", plain_graphs(capture_bs)))
    monkeypatch.setattr(startup, "PlainDecodeStep",
                        lambda *args: built.setdefault("step", SimpleNamespace(args=args)))
    monkeypatch.setattr(startup, "warm_sglang_jit_kernels",
                        lambda runner, cap: built.setdefault("warmed", (runner, cap)))
    worker = fake_worker()
    config = Config(trace_path=str(tmp_path / "trace.jsonl") if trace else None)
    parts = startup.build_decode_parts(worker, config)
    assert built["warmed"] == (worker._target_worker.model_runner, 64)  # sglang's JIT kernels, once
    assert parts.plain_graphs is built["graphs"] and parts.plain_step is built["step"]
    assert built["graphs"].graph_runner.capture_bs == PLAIN_BS
    assert built["step"].args == (worker._target_worker, worker._draft_worker.draft_runner, 1,
                                  built["graphs"], parts.catchup)
    if trace:
        assert isinstance(parts.policy, TracedPolicy) and isinstance(parts.feed, TracedFeed)
        assert isinstance(parts.policy.policy, ThroughputPolicy)
        assert (tmp_path / "trace.jsonl").exists()
    else:
        assert isinstance(parts.policy, ThroughputPolicy) and type(parts.feed) is PolicyFeed
    assert parts.feed.report()["crossover_batch"] >= 0  # what /server_info reads, traced or not


def test_one_trace_writer_per_replica() -> None:
    """Tensor-parallel ranks decide alike: rank 0 alone writes the trace; data-parallel replicas
    write files of their own."""
    from sglang.srt.distributed.parallel_state_wrapper import ParallelState

    traced_config = Config(trace_path="/tmp/t.jsonl")
    worker = lambda **ranks: SimpleNamespace(ps=ParallelState.trivial(**ranks))  # noqa: E731
    assert startup.trace_file(worker(), traced_config) == "/tmp/t.jsonl"
    assert startup.trace_file(worker(tp_rank=1, tp_size=2), traced_config) is None
    assert startup.trace_file(worker(dp_rank=2, dp_size=3), traced_config) == "/tmp/t.jsonl.dp2"
    assert startup.trace_file(worker(), Config()) is None
    assert startup.trace_file(SimpleNamespace(), traced_config) == "/tmp/t.jsonl"  # no parallel state


@pytest.mark.parametrize("trace", [False, True], ids=["untraced", "traced"])
def test_the_worker_takes_every_part_once_its_graphs_are_captured(monkeypatch, tmp_path, trace) -> None:
    """...and a traced server's prefill batches go to its trace, one line each."""
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    from sglang_dynamic_eagle.engine import worker as worker_module
    from sglang_dynamic_eagle.observability.prefill_timing import PrefillTimer
    from sglang_dynamic_eagle.observability.trace import StepTrace

    path = tmp_path / "trace.jsonl"
    feed = TracedFeed(PolicyFeed(object()), StepTrace(str(path))) if trace else object()
    timings = step_costs.TimingFeed(list, lambda *args: None, prefill_sink=lambda *args: None)
    parts = startup.DecodeParts(*(object() for _ in range(4)), feed, timings)
    monkeypatch.setattr(EAGLEWorkerV2, "init_cuda_graphs", lambda self: None)
    monkeypatch.setattr(worker_module, "build_decode_parts", lambda worker, config: parts)
    worker = object.__new__(worker_module.DynamicEagleWorker)
    worker.config = Config()
    worker.prefill_timer = PrefillTimer()
    worker.init_cuda_graphs()
    assert (worker._catchup, worker._plain_graphs, worker._plain_step, worker._policy,
            worker._feed, worker._timings) == (parts.catchup, parts.plain_graphs,
                                               parts.plain_step, parts.policy, parts.feed,
                                               parts.timings)
    assert (worker.prefill_timer.sink is not None) is trace
    assert worker.prefill_timer.key_sink == timings.prefill_timed  # every server's catch-up bound
    if trace:
        worker.prefill_timer.sink(290, 13.4, 3.6)
        line = json.loads(path.read_text().splitlines()[-1])
        assert (line["k"], line["tokens"], line["target_ms"], line["draft_ms"]) == ("prefill", 290, 13.4, 3.6)


@pytest.mark.parametrize("part, names", [
    ("DraftCatchup", ("the draft catch-up stash (1024 MiB)", "SGLANG_DYNAMIC_EAGLE_CATCHUP_MIB")),
    ("PlainDecodeGraphs", ("the plain-decode CUDA graphs", "--cuda-graph-max-bs-decode")),
])
def test_out_of_gpu_memory_at_start_up_is_one_line_naming_the_fix(measured, monkeypatch, part,
                                                                   names) -> None:
    """What the worker allocates after sglang's memory plan (the catch-up stash, the plain
    graphs) running out of memory is refused in one line naming the flags that make room."""
    monkeypatch.setattr(startup, "check_cuda_graph_backend", lambda phase, backend: False)
    monkeypatch.setattr(startup, "plain_decode_batch_sizes", lambda server_args: PLAIN_BS)
    monkeypatch.setattr(startup, "PlainDecodeGraphs", lambda runner, capture_bs: plain_graphs(capture_bs))

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1024.00 MiB.\nSee the allocator docs.")

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (747 * 2**20, 80 * 2**30))

    monkeypatch.setattr(startup, part, out_of_memory)
    with pytest.raises(StartupError) as refused:
        startup.build_decode_parts(fake_worker(), Config())
    message = str(refused.value)
    assert "\n" not in message and "--mem-fraction-static" in message and "Tried to allocate 1024" in message
    assert all(name in message for name in names) and "747 MiB free" in message, message
    assert refused.value.__cause__ is None and refused.value.__suppress_context__


def test_other_start_up_errors_pass_through(measured, monkeypatch) -> None:
    """Negative control: only running out of memory is turned into the refusal."""
    def broken(*args, **kwargs):
        raise RuntimeError("not a memory error")

    monkeypatch.setattr(startup, "DraftCatchup", broken)
    with pytest.raises(RuntimeError, match="not a memory error"):
        startup.build_decode_parts(fake_worker(), Config())
