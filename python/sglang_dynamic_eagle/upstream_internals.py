"""Every place this package relies on sglang 0.5.17 internals, in one list.

Each entry says what we use, why, and what upstream change would let us drop
it. ``install_hooks`` registers the two HookRegistry hooks the package needs;
everything else is subclassing or calling.

Checked against sglang 0.5.17 (the pinned version). A version bump must walk
this list.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Tuple

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_dynamic_eagle.policy import DecodeMode

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpstreamReliance:
    target: str
    how: str
    why: str
    drop_when: str


RELIANCES: Tuple[UpstreamReliance, ...] = (
    UpstreamReliance(
        target="sglang.srt.speculative.spec_registry.CustomSpecAlgo",
        how="subclassed (spec_algo.DynamicEagleSpecAlgo): is_eagle/is_eagle3 True, "
        "create_future_map, need_topk, carries_draft_hidden_states delegated to EAGLE3",
        why="Scheduler.init_overlap calls spec_algorithm.create_future_map and FutureMap "
        "calls need_topk; CustomSpecAlgo defines neither (crash at scheduler start), "
        "and EAGLE-3 aux-hidden capture, draft-KV sizing and verify graphs key on is_eagle3()",
        drop_when="CustomSpecAlgo gains these methods or a 'like EAGLE3' base",
    ),
    UpstreamReliance(
        target="SpeculativeAlgorithm.EAGLE3.handle_server_args",
        how="called from DynamicEagleSpecAlgo.handle_server_args, then the 48-request "
        "cap is undone (when the user gave none) and cuda_graph_config.decode.bs is cut "
        "to the speculative sizes while decode.max_bs keeps the full size",
        why="CustomSpecAlgo.handle_server_args is a no-op: without this EAGLE3_DYNAMIC "
        "would get none of EAGLE3's defaults and checks",
        drop_when="sglang exposes per-runner graph batch sizes and a capacity hook",
    ),
    UpstreamReliance(
        target="sglang.srt.server_args.ServerArgs.add_cli_args / from_cli_args",
        how="HookRegistry AFTER hook on add_cli_args adds the three flags; AROUND hook on "
        "from_cli_args exports their values as JSON in SGLANG_DYNAMIC_EAGLE_FLAGS "
        "(flags.install_cli_hooks)",
        why="from_cli_args copies dataclass fields only, so plugin flags cannot be "
        "ServerArgs fields; scheduler processes are started with multiprocessing spawn, "
        "inherit the launcher's environment and call load_plugins() themselves",
        drop_when="sglang lets plugins declare server arguments",
    ),
    UpstreamReliance(
        target="sglang.srt.arg_groups.overrides.resolved_view",
        how="read in flags.validate_server_args to see resolved values (DP attention)",
        why="validation runs inside ServerArgs.__post_init__, before every value is final",
        drop_when="validate_server_args receives resolved arguments",
    ),
    UpstreamReliance(
        target="sglang.srt.model_executor.forward_batch_info.clamp_position",
        how="called once at start-up (plain_decode_graphs._compile_decode_positions_kernel)",
        why="sglang JIT-compiles it on the first DECODE ForwardBatch; a speculative server "
        "never builds one, so the first switch to plain mode stalled 7 s (H200, 2026-11-29)",
        drop_when="sglang compiles its JIT kernels at start-up",
    ),
    UpstreamReliance(
        target="sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2",
        how="subclassed (worker.DynamicEagleWorker); overrides forward_batch_generation, "
        "init_cuda_graphs, war_fastpath_runner, spec_v2_attn_backends, "
        "on_verify_complete_cpu; reads _target_worker, _draft_worker and the draft "
        "worker's cuda_graph_runner / cuda_graph_runner_for_draft_extend / draft_runner",
        why="the product is EAGLE-3 plus a plain mode; the speculative step is reused as is",
        drop_when="never (this is the extension point); re-check the attribute names",
    ),
    UpstreamReliance(
        target="EagleDraftWorker._draft_extend_for_prefill",
        how="called with an EXTEND view of the missed positions (draft_catchup)",
        why="it is exactly the draft extend catch-up needs (shift tokens, LAST capture, "
        "topk seeds); re-implementing it would copy sglang code",
        drop_when="sglang exposes a public draft-extend-over-positions API",
    ),
    UpstreamReliance(
        target="sglang.srt.model_executor.runner.DecodeCudaGraphRunner",
        how="subclassed (plain_decode_graphs.PlainDecodeCudaGraphRunner), built while "
        "model_runner.spec_algorithm is NONE, decode.bs is the plain list and "
        "graph_shared_output is a private buffer; capture_prepare forces FULL hidden capture",
        why="a speculative server captures its target only in TARGET_VERIFY mode "
        "(decode_cuda_graph_runner.py: capture_forward_mode)",
        drop_when="DecodeCudaGraphRunner takes capture mode, width and batch sizes as arguments",
    ),
    UpstreamReliance(
        target="ModelRunner._get_attention_backend / attn_backend / decode_cuda_graph_runner",
        how="a second attention backend instance (init_new_workspace=True, as sglang's "
        "adaptive mode does) and an attribute swap around each plain forward",
        why="ModelRunner dispatches graph replay through the one decode_cuda_graph_runner "
        "attribute, and graph state lives in the backend instance",
        drop_when="ModelRunner supports several decode graph runners keyed by forward mode",
    ),
    UpstreamReliance(
        target="ServerArgs._generate_decode_cuda_graph_batch_sizes",
        how="called with a non-speculative view to get the plain graph batch sizes",
        why="the plain graphs should cover what a server without speculation captures",
        drop_when="the batch-size generator becomes a public function",
    ),
    UpstreamReliance(
        target="Scheduler._forward_isolation (behaviour)",
        how="the plain step rewrites batch.input_ids/out_cache_loc/seq_lens/forward_mode/"
        "spec_info in place",
        why="the scheduler snapshots and restores every ScheduleBatch field around a "
        "spec-v2 forward, as EAGLE's own verify relies on",
        drop_when="n/a (documented spec-v2 contract in 0.5.17)",
    ),
    UpstreamReliance(
        target="eagle_prepare_for_decode KV reserve (behaviour)",
        how="the plain step writes the KV slot at the committed length",
        why="spec v2 reserves at least two verify windows per request before the worker "
        "runs, so that slot always exists",
        drop_when="a per-mode reserve is hooked in (would also shrink plain-mode headroom)",
    ),
    UpstreamReliance(
        target="ModelRunner._preprocess_logits / ModelRunner.sampler",
        how="called in that order by the plain step instead of ModelRunner.sample, with a "
        "copy of the logits taken in between",
        why="logprobs must be those of the logits after penalties, logit bias and grammar "
        "mask but before the sampler's in-place temperature, as EAGLE's verify reports them; "
        "sample() gives no access to that point",
        drop_when="ModelRunner.sample can return spec-v2 shaped logprobs",
    ),
    UpstreamReliance(
        target="sglang.srt.layers.logprob_processor.compute_spec_v2_logprobs",
        how="called with one accepted row per request",
        why="the spec-v2 result processor reads logprobs as [bs, accepted]",
        drop_when="n/a (public helper)",
    ),
    UpstreamReliance(
        target="sglang.srt.managers.scheduler.Scheduler.get_internal_state",
        how="AFTER hook adds the 'dynamic_eagle' counters",
        why="/get_server_info returns this dict; there is no worker-stats extension point",
        drop_when="spec workers can contribute to get_internal_state",
    ),
    UpstreamReliance(
        target="sglang.srt.managers.scheduler_components.metrics_reporter."
        "SchedulerMetricsReporter.report_decode_stats",
        how="AFTER hook logs the counters on the periodic decode log line's schedule and, "
        "with --enable-metrics, updates their Prometheus metrics (prometheus_metrics.py) "
        "with the labels of reporter.metrics_collector",
        why="no extension point for the decode log line or for spec-worker metrics",
        drop_when="spec workers can append to the decode log line",
    ),
    UpstreamReliance(
        target="string comparisons of the algorithm name",
        how="not patched: each one is either irrelevant or rejected at startup "
        "(flags.validate_server_args)",
        why="adaptive_spec_params.py:54 ('EAGLE','EAGLE3') -> --speculative-adaptive "
        "rejected; speculative_hook.py:614 -> --speculative-use-rejection-sampling "
        "rejected; layers/communicator.py:281 != 'EAGLE3' -> "
        "--enable-attn-tp-input-scattered rejected; speculative_hook.py:114 -> a "
        "spurious warning for --speculative-draft-window-size (the window is still "
        "honoured); speculative_hook.py:45 -> Gemma4-draft guard skipped (Gemma4 "
        "drafts are not EAGLE-3 heads); the rest concern other algorithms",
        drop_when="sglang compares with predicates (is_eagle3()) everywhere",
    ),
)

_GET_INTERNAL_STATE = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
_REPORT_DECODE_STATS = (
    "sglang.srt.managers.scheduler_components.metrics_reporter."
    "SchedulerMetricsReporter.report_decode_stats"
)


def _dynamic_worker(scheduler) -> Any:
    from sglang_dynamic_eagle.worker import DynamicEagleWorker

    worker = getattr(scheduler, "draft_worker", None)
    return worker if isinstance(worker, DynamicEagleWorker) else None


def _add_counters_to_internal_state(result, scheduler, *args, **kwargs):
    worker = _dynamic_worker(scheduler)
    if worker is not None:
        result.internal_state["dynamic_eagle"] = worker.report()
    return result


def _log_counters_with_decode_stats(result, reporter, *args, **kwargs):
    worker = _dynamic_worker(reporter.scheduler)
    if (
        worker is not None
        and reporter.is_stats_logging_rank
        and reporter.forward_ct_decode % reporter.decode_log_interval == 0
    ):
        logger.info(worker.counters.log_line())
        if reporter.enable_metrics and reporter.metrics_collector is not None:
            worker.metrics_export.update(
                reporter.metrics_collector.labels,
                worker.report(),
                speculative=worker.mode is DecodeMode.SPECULATIVE,
            )
    return result


def install_hooks() -> None:
    HookRegistry.register(_GET_INTERNAL_STATE, _add_counters_to_internal_state, HookType.AFTER)
    HookRegistry.register(_REPORT_DECODE_STATS, _log_counters_with_decode_stats, HookType.AFTER)
