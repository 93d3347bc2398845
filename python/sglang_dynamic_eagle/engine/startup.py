"""What the worker builds once sglang has captured its graphs, from the runners sglang built:
sglang's JIT kernels that traffic would otherwise compile (``jit_warmup``), the catch-up stash
(``draft_catchup``), the plain-decode graphs and step (``plain_decode_graphs``,
``plain_step``), and the policy with its priors: every graph bucket's replay timed at start-up
(``step_costs.calibrate``) and the KV bytes a step reads over the device's copy bandwidth, made
identical on every tensor-parallel rank (the slowest rank's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, check_cuda_graph_backend
from sglang.srt.speculative.eagle_utils import get_draft_input_from_target_hidden_dim

from sglang_dynamic_eagle.config import CATCHUP_BUDGET_ENV, Config
from sglang_dynamic_eagle.engine.draft_catchup import (
    MAX_CATCHUP_TOKENS,
    DraftCatchup,
    choose_ring_size,
)
from sglang_dynamic_eagle.engine.jit_warmup import warm_sglang_jit_kernels
from sglang_dynamic_eagle.engine.observations import PolicyFeed
from sglang_dynamic_eagle.engine.plain_decode_graphs import (
    PlainDecodeGraphs,
    plain_decode_batch_sizes,
)
from sglang_dynamic_eagle.engine.plain_step import PlainDecodeStep
from sglang_dynamic_eagle.engine.step_costs import (
    TimingFeed,
    calibrate,
    tp_max_reducer,
)
from sglang_dynamic_eagle.observability.trace import traced
from sglang_dynamic_eagle.policy import (
    DecodeMode,
    DecodePolicy,
    ThresholdPolicy,
    ThresholdPolicyConfig,
)
from sglang_dynamic_eagle.policy.throughput import ThroughputPolicyConfig, new_throughput_policy
from sglang_dynamic_eagle.sglang_compat.startup_errors import refused_if_out_of_memory

logger = logging.getLogger(__name__)
MODES = (DecodeMode.PLAIN, DecodeMode.SPECULATIVE)


@dataclass
class DecodeParts:
    catchup: DraftCatchup
    plain_graphs: PlainDecodeGraphs
    plain_step: PlainDecodeStep
    policy: DecodePolicy
    feed: PolicyFeed
    timings: TimingFeed


def build_decode_parts(worker, config: Config) -> DecodeParts:
    """Everything ``worker`` (an ``EAGLEWorkerV2`` whose graphs are captured) needs besides
    sglang's own speculative step."""
    target_runner = worker._target_worker.model_runner
    warm_sglang_jit_kernels(target_runner, running_request_cap(worker))
    with refused_if_out_of_memory(
            f"the draft catch-up stash ({config.catchup_budget_mib} MiB)",
            f"or set {CATCHUP_BUDGET_ENV} lower (the catch-up then redoes fewer positions)"):
        catchup = new_catchup(worker, config)
    graphs_enabled = not check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED)
    with refused_if_out_of_memory("the plain-decode CUDA graphs",
                                  "or lower --cuda-graph-max-bs-decode"):
        plain_graphs = PlainDecodeGraphs(
            target_runner, plain_decode_batch_sizes(worker.server_args) if graphs_enabled else None)
    plain_step = PlainDecodeStep(worker._target_worker, worker._draft_worker.draft_runner,
                                 worker.topk, plain_graphs, catchup)
    max_speculative_batch = speculative_graph_max_bs(worker, config)
    policy = new_policy(worker, config, max_speculative_batch, plain_graphs, catchup.max_window)
    summary = policy_summary(policy)
    policy, feed = traced(policy, PolicyFeed(policy), trace_file(worker, config))
    timings = TimingFeed(tp_max_reducer(target_runner.tp_group), feed.step_time,
                         catchup_sink=feed.catchup, prefill_sink=feed.draft_prefill)
    logger.info(
        "EAGLE3_DYNAMIC: %s; speculative graphs up to batch %d, plain-decode graphs up "
        "to batch %d; catch-up ring of %d entries (%.0f MiB, at most %d positions per "
        "request).",
        summary, max_speculative_batch, plain_graphs.max_bs,
        catchup.ring_size, catchup.stash_bytes / 2**20, catchup.max_window,
    )
    return DecodeParts(catchup, plain_graphs, plain_step, policy, feed, timings)


def running_request_cap(worker) -> int:
    """The most requests a batch holds: the target runner's cap, else the server argument."""
    return max(1, int(getattr(worker._target_worker.model_runner, "max_running_requests", 0)
                      or worker.server_args.max_running_requests or 1))


def trace_file(worker, config: Config) -> Optional[str]:
    """This process's trace file, if any: tensor-parallel rank 0 writes it (every rank decides
    alike, so one holds the whole trace); a data-parallel replica beyond the first writes
    ``<file>.dp<rank>``."""
    ps = getattr(worker, "ps", None)  # sglang's ParallelState (registry: engine)
    if not config.trace_path or getattr(ps, "tp_rank", 0):
        return None
    dp_rank = getattr(ps, "dp_rank", None) or 0
    return f"{config.trace_path}.dp{dp_rank}" if dp_rank else config.trace_path


def policy_summary(policy: DecodePolicy) -> str:
    report = policy.report()
    if report["policy"] == "throughput":
        return "automatic switching (predicted tokens per second of each mode)"
    return (
        f"fixed thresholds (disable above {report['disable_batch_threshold']}, re-enable "
        f"at <= {report['enable_batch_threshold']}, patience {report['switch_patience']})"
    )


def speculative_graph_runners(worker) -> list:
    """The graph runners of one speculative step, in the order the step runs them."""
    runners = (
        worker._draft_worker.cuda_graph_runner,
        worker._target_worker.model_runner.decode_cuda_graph_runner,
        worker._draft_worker.cuda_graph_runner_for_draft_extend,
    )
    return [r for r in runners if r is not None]


def speculative_graph_max_bs(worker, config: Config) -> int:
    """Largest batch every speculative graph (verify, draft, draft extend) covers."""
    captured = [r.max_bs for r in speculative_graph_runners(worker)]
    if captured:
        return min(captured)
    decode = worker.server_args.cuda_graph_config.decode
    return config.speculative_graph_max_bs(decode.max_bs or max(decode.bs))


def new_catchup(worker, config: Config) -> DraftCatchup:
    target_runner = worker._target_worker.model_runner
    req_pool_size = target_runner.req_to_token_pool.req_to_token.shape[0]
    hidden_width = get_draft_input_from_target_hidden_dim(worker._draft_worker.draft_runner)
    hidden_dtype = target_runner.model_config.dtype
    ring_size = choose_ring_size(
        config.catchup_budget_bytes,
        req_pool_size,
        hidden_width,
        torch.tensor([], dtype=hidden_dtype).element_size(),
    )
    return DraftCatchup(
        req_pool_size=req_pool_size,
        ring_size=ring_size,
        max_window=config.catchup_window,
        hidden_width=hidden_width,
        hidden_dtype=hidden_dtype,
        device=target_runner.device,
    )


def new_policy(worker, config: Config, max_speculative_batch: int,
               plain_graphs: PlainDecodeGraphs, catchup_window: int) -> DecodePolicy:
    """The threshold policy for a numeric ``--speculative-disable-batch-threshold``, else the
    automatic policy on the calibrated priors."""
    if not config.automatic:
        return ThresholdPolicy(ThresholdPolicyConfig(
            disable_batch_threshold=config.disable_batch_threshold,
            enable_batch_threshold=config.enable_batch_threshold,
            switch_patience=config.switch_patience,
            max_speculative_batch=max_speculative_batch,
        ))
    target_runner = worker._target_worker.model_runner
    plain_runner = plain_graphs.graph_runner
    speculative_runners = speculative_graph_runners(worker)
    speculative_sizes = (speculative_runners[0].capture_bs if speculative_runners
                         else worker.server_args.cuda_graph_config.decode.bs)
    buckets = {
        DecodeMode.PLAIN: list(plain_runner.capture_bs if plain_runner is not None
                               else plain_decode_batch_sizes(worker.server_args)),
        DecodeMode.SPECULATIVE: [bs for bs in speculative_sizes if bs <= max_speculative_batch],
    }
    calibration, bytes_per_ms = _priors_of_the_slowest_rank(
        target_runner, buckets,
        {DecodeMode.PLAIN: [plain_runner] if plain_runner is not None else [],
         DecodeMode.SPECULATIVE: speculative_runners},
        {DecodeMode.PLAIN: plain_runner.replay_ms} if plain_runner is not None else None)
    target_bytes = kv_bytes_per_token(target_runner)
    draft_bytes = kv_bytes_per_token(worker._draft_worker.draft_runner)
    # A plain step reads the target's KV once; a speculative step once for the verify and
    # the draft's once per draft step and once for its extend.
    per_kv_token_ms = {
        DecodeMode.PLAIN: target_bytes / bytes_per_ms,
        DecodeMode.SPECULATIVE:
            (target_bytes + (worker.speculative_num_steps + 1) * draft_bytes) / bytes_per_ms,
    }
    spec_one = calibration[DecodeMode.SPECULATIVE].get(min(buckets[DecodeMode.SPECULATIVE]), 0.0)
    policy_config = ThroughputPolicyConfig(
        max_speculative_batch=max_speculative_batch,
        max_running_requests=running_request_cap(worker),
        kv_capacity_tokens=max(1, int(target_runner.max_total_num_tokens)),
        catchup_window=catchup_window,
        catchup_max_tokens=MAX_CATCHUP_TOKENS,
    )
    logger.info("EAGLE3_DYNAMIC: step model priors: calibrated step ms plain %s, speculative "
                "%s; KV bytes per token %d (target) / %d (draft) at %.0f GB/s.",
                calibration[DecodeMode.PLAIN], calibration[DecodeMode.SPECULATIVE],
                target_bytes, draft_bytes, bytes_per_ms / 1e6)
    return new_throughput_policy(
        policy_config, buckets, calibration, per_kv_token_ms,
        catchup_prior_fixed_ms=spec_one,
        max_acceptance=float(min(worker.speculative_num_steps + 1,
                                 worker.speculative_num_draft_tokens)),
    )


def _priors_of_the_slowest_rank(target_runner, buckets: Dict[DecodeMode, List[int]],
                                mode_runners: Dict[DecodeMode, list],
                                recorded: Optional[Dict[DecodeMode, Dict[int, float]]]):
    """(calibrated graph-replay ms per mode and bucket, device copy bytes per ms), the same on
    every rank: the slowest rank's replays and bandwidth; ``recorded``: graph times taken at
    capture (the plain graphs)."""
    calibration = calibrate(mode_runners, buckets, recorded=recorded)
    keys = [(mode, bucket) for mode in MODES for bucket in buckets[mode]]
    bandwidth = memory_bandwidth_gbps(target_runner.device)
    reduced = tp_max_reducer(target_runner.tp_group)(
        [calibration.get(m, {}).get(b, 0.0) for m, b in keys] + [-bandwidth])
    identical: Dict[DecodeMode, Dict[int, float]] = {mode: {} for mode in MODES}
    for (mode, bucket), ms in zip(keys, reduced):
        if ms > 0:
            identical[mode][bucket] = ms
    return identical, -reduced[-1] * 1e6


def memory_bandwidth_gbps(device=None, megabytes: int = 256, repeats: int = 5) -> float:
    """Device-to-device copy bandwidth (GB/s: bytes read plus written over time), measured once
    at start-up; the per-KV-token cost prior is the KV bytes of a token over it."""
    n = megabytes * 2**20
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        dst.copy_(src)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1000 / repeats
    del src, dst
    return 2 * n / seconds / 1e9


def kv_bytes_per_token(model_runner) -> float:
    """Bytes of KV cache one token holds over all layers of ``model_runner``'s pool (0 where
    the pool does not say; the per-KV-token cost is then learnt from timed steps alone)."""
    try:
        pool = model_runner.token_to_kv_pool
        k_bytes, v_bytes = pool.get_kv_size_bytes()
        return float(k_bytes + v_bytes) / float(pool.size + pool.page_size)
    except Exception:  # pools without a KV buffer (mamba, quantised layouts): learn it online
        logger.info("EAGLE3_DYNAMIC: no KV size from %s; the per-KV-token cost starts at 0.",
                    type(model_runner).__name__)
        return 0.0
