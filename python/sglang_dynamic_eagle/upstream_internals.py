"""Every place this package relies on sglang 0.5.17 internals, and every hook it installs.

``RELIANCES`` is data: what we use (``target``), of which kind (a HookRegistry hook, a subclass,
a call of a private function, or a behaviour we depend on), how, why, and what upstream change
would let us drop it; ``code`` names the dotted paths that must exist in the installed sglang
(``test/test_upstream_internals.py`` resolves every one of them). ``HOOKS`` lists every
HookRegistry hook, and :func:`install_hooks` installs all of them (from ``plugin.register``);
:func:`check_hooks_in_effect` refuses to start, with one line, if sglang did not apply one.

Checked against sglang 0.5.17 (the pinned version). A version bump must walk this list.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, List, Tuple

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_dynamic_eagle import flags, prefill_tail_tokens, reporting_hooks, request_guards

HOOK = "hook"
SUBCLASS = "subclass"
PRIVATE_CALL = "private call"
BEHAVIOUR = "behaviour"
KINDS = (HOOK, SUBCLASS, PRIVATE_CALL, BEHAVIOUR)
SUPPORTED_SGLANG = "0.5.17"


@dataclass(frozen=True)
class UpstreamReliance:
    target: str
    how: str
    why: str
    drop_when: str
    kind: str
    code: Tuple[str, ...] = ()
    upstream: str = ""  # an upstream issue or PR, where one exists


RELIANCES: Tuple[UpstreamReliance, ...] = (
    UpstreamReliance(
        target="sglang.srt.speculative.spec_registry.CustomSpecAlgo",
        how="subclassed (spec_algo.DynamicEagleSpecAlgo): is_eagle/is_eagle3 True, "
        "create_future_map, need_topk, carries_draft_hidden_states delegated to EAGLE3",
        why="Scheduler.init_overlap calls spec_algorithm.create_future_map and FutureMap "
        "calls need_topk; CustomSpecAlgo defines neither (crash at scheduler start), "
        "and EAGLE-3 aux-hidden capture, draft-KV sizing and verify graphs key on is_eagle3()",
        drop_when="CustomSpecAlgo gains these methods or a 'like EAGLE3' base",
        kind=SUBCLASS,
        code=(
            "sglang.srt.speculative.spec_registry.CustomSpecAlgo",
            "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_future_map",
        ),
    ),
    UpstreamReliance(
        target="SpeculativeAlgorithm.EAGLE3.handle_server_args",
        how="called from DynamicEagleSpecAlgo.handle_server_args, then the 48-request "
        "cap is undone (when the user gave none) and cuda_graph_config.decode.bs is cut "
        "to the speculative sizes while decode.max_bs keeps the full size",
        why="CustomSpecAlgo.handle_server_args is a no-op: without this EAGLE3_DYNAMIC "
        "would get none of EAGLE3's defaults and checks",
        drop_when="sglang exposes per-runner graph batch sizes and a capacity hook",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.EAGLE3.handle_server_args",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.server_args.ServerArgs.add_cli_args / from_cli_args",
        how="HookRegistry AFTER hook on add_cli_args adds the three flags; AROUND hook on "
        "from_cli_args exports their values as JSON in SGLANG_DYNAMIC_EAGLE_FLAGS "
        "(flags.after_add_cli_args, flags.around_from_cli_args)",
        why="from_cli_args copies dataclass fields only, so plugin flags cannot be "
        "ServerArgs fields; scheduler processes are started with multiprocessing spawn, "
        "inherit the launcher's environment and call load_plugins() themselves",
        drop_when="sglang lets plugins declare server arguments",
        kind=HOOK,
        code=(
            "sglang.srt.server_args.ServerArgs.add_cli_args",
            "sglang.srt.server_args.ServerArgs.from_cli_args",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.arg_groups.overrides.resolved_view",
        how="read in unsupported.unsupported_reason to see resolved values (DP attention)",
        why="validation runs inside ServerArgs.__post_init__, before every value is final",
        drop_when="validate_server_args receives resolved arguments",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.arg_groups.overrides.resolved_view",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.model_executor.forward_batch_info.clamp_position",
        how="called once at start-up (plain_decode_graphs._compile_decode_positions_kernel)",
        why="sglang JIT-compiles it on the first DECODE ForwardBatch; a speculative server "
        "never builds one, so the first switch to plain mode stalled 7 s (H200, 2026-11-29)",
        drop_when="sglang compiles its JIT kernels at start-up",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.model_executor.forward_batch_info.clamp_position",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2",
        how="subclassed (worker.DynamicEagleWorker); overrides forward_batch_generation, "
        "init_cuda_graphs, war_fastpath_runner, spec_v2_attn_backends, "
        "on_verify_complete_cpu; reads _target_worker, _draft_worker and the draft "
        "worker's cuda_graph_runner / cuda_graph_runner_for_draft_extend / draft_runner",
        why="the product is EAGLE-3 plus a plain mode; the speculative step is reused as is",
        drop_when="never (this is the extension point); re-check the attribute names",
        kind=SUBCLASS,
        code=(
            "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation",
            "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.init_cuda_graphs",
            "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.war_fastpath_runner",
            "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.spec_v2_attn_backends",
            "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.on_verify_complete_cpu",
        ),
    ),
    UpstreamReliance(
        target="EagleDraftWorker._draft_extend_for_prefill",
        how="called with an EXTEND view of the missed positions (draft_catchup)",
        why="it is exactly the draft extend catch-up needs (shift tokens, LAST capture, "
        "topk seeds); re-implementing it would copy sglang code",
        drop_when="sglang exposes a public draft-extend-over-positions API",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.models.llama_eagle3.LlamaDecoderLayer",
        how="subclassed (draft_prefill.LastPositionDraftLayer) and swapped in as the class "
        "of a one-layer LlamaForCausalLMEagle3 draft's layer; its forward restates "
        "sglang's input-layer forward and LlamaAttention.forward (forward_prepare_native, "
        "attn, o_proj) with the Q projection, o_proj, the post-attention norm and the MLP "
        "on the last row of each request; the Q projection runs sglang's unquantized GEMM "
        "(UnquantizedLinearMethod.apply) on the q rows of QKVParallelLinear's [q; k; v] weight",
        why="sglang runs the draft's Q projection and MLP over every prompt token in a "
        "prefill, and only the last row of each request is read (LogitsProcessor pruning, "
        "LAST hidden capture)",
        drop_when="sglang prunes draft-extend rows before the MLP (or lets a model skip "
        "rows nobody reads); a source fingerprint of every function listed here refuses "
        "the swap if one of them changes",
        kind=SUBCLASS,
        code=(
            "sglang.srt.models.llama_eagle3.LlamaDecoderLayer.forward",
            "sglang.srt.models.llama_eagle3.LlamaModel.forward",
            "sglang.srt.models.llama_eagle3.LlamaForCausalLMEagle3",
            "sglang.srt.models.llama.LlamaAttention.forward",
            "sglang.srt.models.llama.LlamaAttention.forward_prepare_native",
            "sglang.srt.layers.logits_processor.LogitsProcessor._get_pruned_states",
            "sglang.srt.layers.linear.ColumnParallelLinear.forward",
            "sglang.srt.layers.linear.QKVParallelLinear.weight_loader",
            "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.speculative.eagle_worker_v2._eagle_prefill_tail_tokens",
        how="HookRegistry AROUND hook (prefill_tail_tokens.tail_tokens_without_sync): for "
        "EAGLE3_DYNAMIC batches the chunked request's next prompt token is copied from "
        "pinned memory asynchronously; other algorithms call the original",
        why="the original assigns a Python int into a CUDA tensor, a blocking copy that holds "
        "the scheduler until the target prefill ends, so every prefill batch's first tokens "
        "reach clients one prefill late when the next batch holds a chunked request",
        drop_when="sglang writes the token without a host sync",
        kind=HOOK,
        upstream="to file: docs/upstream/eagle-prefill-tail-token-sync.md",
        code=(
            "sglang.srt.speculative.eagle_worker_v2._eagle_prefill_tail_tokens",
            "sglang.srt.speculative.eagle_utils._eagle_prefill_tail_tokens",
        ),
    ),
    UpstreamReliance(
        target="python -m sglang.launch_server: argument errors reach the top (behaviour)",
        how="flags.around_from_cli_args, for a command line that selects EAGLE3_DYNAMIC, "
        "installs a sys.excepthook that prints a StartupError as one line, then runs this "
        "package's validation and the NVIDIA GPU check before sglang builds ServerArgs",
        why="prepare_server_args does not catch errors from ServerArgs.__post_init__, so the "
        "interpreter printed a 25-line traceback above the one line that names the fix; and "
        "__post_init__ resolves the device before it calls the algorithm's validation, so on "
        "a machine without a GPU sglang's 'No accelerator' tracebacks came first",
        drop_when="sglang reports argument errors without a traceback",
        kind=BEHAVIOUR,
        code=("sglang.srt.server_args.prepare_server_args",),
    ),
    UpstreamReliance(
        target="EAGLEWorkerV2.forward_batch_generation on_publish (behaviour)",
        how="the worker always passes an on_publish callback to a prefill and marks the "
        "end of the target extend there (prefill_timing)",
        why="sglang calls on_publish between the target extend and the draft extend, the "
        "one point between the two inside its prefill",
        drop_when="sglang times the stages of a speculative prefill itself",
        kind=BEHAVIOUR,
        code=(
            "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.model_executor.runner.DecodeCudaGraphRunner",
        how="subclassed (plain_decode_graphs.PlainDecodeCudaGraphRunner), built while "
        "model_runner.spec_algorithm is NONE, decode.bs is the plain list and "
        "graph_shared_output is a private buffer; capture_prepare forces FULL hidden capture",
        why="a speculative server captures its target only in TARGET_VERIFY mode "
        "(decode_cuda_graph_runner.py: capture_forward_mode)",
        drop_when="DecodeCudaGraphRunner takes capture mode, width and batch sizes as arguments",
        kind=SUBCLASS,
        code=(
            "sglang.srt.model_executor.runner.DecodeCudaGraphRunner.capture_prepare",
        ),
    ),
    UpstreamReliance(
        target="ModelRunner._get_attention_backend / attn_backend / decode_cuda_graph_runner",
        how="a second attention backend instance (init_new_workspace=True, as sglang's "
        "adaptive mode does) and an attribute swap around each plain forward",
        why="ModelRunner dispatches graph replay through the one decode_cuda_graph_runner "
        "attribute, and graph state lives in the backend instance",
        drop_when="ModelRunner supports several decode graph runners keyed by forward mode",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.model_executor.model_runner.ModelRunner._get_attention_backend",
        ),
    ),
    UpstreamReliance(
        target="ServerArgs._generate_decode_cuda_graph_batch_sizes",
        how="called with a non-speculative view to get the plain graph batch sizes",
        why="the plain graphs should cover what a server without speculation captures",
        drop_when="the batch-size generator becomes a public function",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.server_args.ServerArgs._generate_decode_cuda_graph_batch_sizes",
        ),
    ),
    UpstreamReliance(
        target="Scheduler._forward_isolation (behaviour)",
        how="the plain step rewrites batch.input_ids/out_cache_loc/seq_lens/forward_mode/"
        "spec_info in place",
        why="the scheduler snapshots and restores every ScheduleBatch field around a "
        "spec-v2 forward, as EAGLE's own verify relies on",
        drop_when="n/a (documented spec-v2 contract in 0.5.17)",
        kind=BEHAVIOUR,
        code=(
            "sglang.srt.managers.scheduler.Scheduler._forward_isolation",
        ),
    ),
    UpstreamReliance(
        target="ScheduleBatch.req_pool_indices_cpu (behaviour)",
        how="the plain step, the catch-up and the prefill bookkeeping read a batch's request "
        "slots from it (draft_catchup.batch_req_pool_indices)",
        why="it is the host copy of the slots the batch was formed with, kept through "
        "filter_batch and merge_batch; req.req_pool_idx is already None for a request that "
        "finished in the previous step when that step's results were processed after this "
        "batch was formed (the overlap loop with overlap turned off for the batch: grammar "
        "batches)",
        drop_when="n/a (a ScheduleBatch field in 0.5.17)",
        kind=BEHAVIOUR,
        code=(
            "sglang.srt.managers.schedule_batch.ScheduleBatch.filter_batch",
            "sglang.srt.managers.schedule_batch.ScheduleBatch.merge_batch",
        ),
    ),
    UpstreamReliance(
        target="eagle_prepare_for_decode KV reserve (behaviour)",
        how="the plain step writes the KV slot at the committed length",
        why="spec v2 reserves at least two verify windows per request before the worker "
        "runs, so that slot always exists",
        drop_when="a per-mode reserve is hooked in (would also shrink plain-mode headroom)",
        kind=BEHAVIOUR,
        code=(
            "sglang.srt.speculative.eagle_utils.eagle_prepare_for_decode",
        ),
    ),
    UpstreamReliance(
        target="ModelRunner._preprocess_logits / ModelRunner.sampler",
        how="called in that order by the plain step instead of ModelRunner.sample, with a "
        "copy of the logits taken in between",
        why="logprobs must be those of the logits after penalties, logit bias and grammar "
        "mask but before the sampler's in-place temperature, as EAGLE's verify reports them; "
        "sample() gives no access to that point",
        drop_when="ModelRunner.sample can return spec-v2 shaped logprobs",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.model_executor.model_runner.ModelRunner._preprocess_logits",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.layers.logprob_processor.compute_spec_v2_logprobs",
        how="called with one accepted row per request",
        why="the spec-v2 result processor reads logprobs as [bs, accepted]",
        drop_when="n/a (public helper)",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.layers.logprob_processor.compute_spec_v2_logprobs",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run / waiting_queue",
        how="AFTER hook stores len(scheduler.waiting_queue) on the worker "
        "(reporting_hooks.record_queue_length); the scheduler calls it once per loop, before "
        "the batch it returns runs",
        why="the policy projects the batch the queue will fill (a burst leaves speculation "
        "before the batch grows); the worker sees only the batch it is given",
        drop_when="sglang passes scheduling state (queue length) to the speculative worker",
        kind=HOOK,
        code=(
            "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.managers.schedule_batch.Req (kv_committed_len, sampling_params, "
        "output_ids)",
        how="read per request at each decode step (observations.observe): KV tokens of the "
        "batch and tokens each request may still emit; requests are keys of a weak mapping "
        "holding their speculative acceptance",
        why="the step model's cost grows with the KV tokens read, a step yields no more than "
        "a request still needs; Req.spec_verify_ct counts plain steps as verifies too",
        drop_when="never (public fields of the request); re-check the names on upgrade",
        kind=BEHAVIOUR,
        code=(
            "sglang.srt.managers.schedule_batch.Req.effective_kv_committed_len",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.managers.scheduler.Scheduler.get_internal_state",
        how="AFTER hook adds the worker's report under 'dynamic_eagle' "
        "(reporting_hooks.add_report_to_internal_state)",
        why="/get_server_info returns this dict; there is no worker-stats extension point",
        drop_when="spec workers can contribute to get_internal_state",
        kind=HOOK,
        code=(
            "sglang.srt.managers.scheduler.Scheduler.get_internal_state",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.managers.scheduler_components.metrics_reporter."
        "SchedulerMetricsReporter.report_decode_stats",
        how="AFTER hook logs the counters on the periodic decode log line's schedule and, "
        "with --enable-metrics, updates their Prometheus metrics (prometheus_metrics.py) "
        "with the labels of reporter.metrics_collector",
        why="no extension point for the decode log line or for spec-worker metrics",
        drop_when="spec workers can append to the decode log line",
        kind=HOOK,
        code=(
            "sglang.srt.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter.report_decode_stats",
        ),
    ),
    UpstreamReliance(
        target="string comparisons of the algorithm name",
        how="not patched: each one is either irrelevant or rejected at startup "
        "(the table in unsupported.py)",
        why="adaptive_spec_params.py:54 ('EAGLE','EAGLE3') -> --speculative-adaptive "
        "rejected; speculative_hook.py:614 -> --speculative-use-rejection-sampling "
        "rejected; layers/communicator.py:281 != 'EAGLE3' -> "
        "--enable-attn-tp-input-scattered rejected; speculative_hook.py:114 -> a "
        "spurious warning for --speculative-draft-window-size (the window is still "
        "honoured); speculative_hook.py:45 -> Gemma4-draft guard skipped (Gemma4 "
        "drafts are not EAGLE-3 heads); the rest concern other algorithms",
        drop_when="sglang compares with predicates (is_eagle3()) everywhere",
        kind=BEHAVIOUR,
        code=(),
    ),
    UpstreamReliance(
        target="graph replay on the runners' backends (step_costs.calibrate)",
        how="runner.backend.replay(runner._make_graph_key(bs), None) inside "
        "runner.backend.replay_session(), for every bucket in runner.capture_bs, timed with CUDA "
        "events at start-up, on the buffers the capture left",
        why="the automatic policy needs every bucket's cost before it has served that batch "
        "size; sglang has no API to time a captured graph",
        drop_when="sglang records per-graph replay times (or exposes a graph benchmark)",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend.FullCudaGraphBackend.replay",
            "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend.FullCudaGraphBackend.replay_session",
            "sglang.srt.model_executor.runner.DecodeCudaGraphRunner._make_graph_key",
        ),
    ),
    UpstreamReliance(
        target="GroupCoordinator.cpu_group / world_size of the target's tp_group; world_size of "
        "the draft runner's",
        how="torch.distributed.all_reduce(MAX) of the cost vector on the TP group's gloo group "
        "every 16 decode steps and once at start-up (step_costs.tp_max_reducer); the draft "
        "prefill's layer choice is off when the draft's group has more than one rank",
        why="every rank must decide from the same cost table; a CPU collective needs no GPU "
        "synchronisation on the decode path",
        drop_when="n/a (sglang's own CPU barrier uses the same group)",
        kind=PRIVATE_CALL,
        code=("sglang.srt.distributed.parallel_state.GroupCoordinator",),
    ),
    UpstreamReliance(
        target="sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
        how="BEFORE hook checks client-sent input_ids against [0, vocab size) "
        "(request_guards.check_request_token_ids); the ValueError becomes HTTP 400",
        why="an out-of-vocabulary or negative id kills the scheduler with a CUDA device-side "
        "assert in the embedding, losing every request in flight; sglang 0.5.17 defines "
        "_validate_input_ids_in_vocab but never calls it (and it ignores negative ids)",
        drop_when="sglang validates token ids of token prompts before scheduling them",
        kind=HOOK,
        code=("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",),
    ),
    UpstreamReliance(
        target="sglang.srt.plugins.hook_registry.HookRegistry (behaviour)",
        how="every hook above is registered in HOOKS and installed by install_hooks(); "
        "missing_hooks() walks each target's wrapper chain for our hook",
        why="apply_hooks logs a failed hook and carries on, so an sglang upgrade would show up as "
        "a confusing argparse error or silently missing counters; the plugin instead refuses to "
        "start with one line naming the hooks that are not in effect",
        drop_when="apply_hooks raises (or reports) failures",
        kind=BEHAVIOUR,
        code=("sglang.srt.plugins.hook_registry.HookRegistry.apply_hooks",),
    ),
)


@dataclass(frozen=True)
class HookSpec:
    target: str
    hook: Callable
    hook_type: HookType


HOOKS: Tuple[HookSpec, ...] = (
    HookSpec("sglang.srt.server_args.ServerArgs.add_cli_args", flags.after_add_cli_args,
             HookType.AFTER),
    HookSpec("sglang.srt.server_args.ServerArgs.from_cli_args", flags.around_from_cli_args,
             HookType.AROUND),
    HookSpec("sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run",
             reporting_hooks.record_queue_length, HookType.AFTER),
    HookSpec("sglang.srt.managers.scheduler.Scheduler.get_internal_state",
             reporting_hooks.add_report_to_internal_state, HookType.AFTER),
    HookSpec("sglang.srt.managers.scheduler_components.metrics_reporter."
             "SchedulerMetricsReporter.report_decode_stats",
             reporting_hooks.report_with_decode_stats, HookType.AFTER),
    HookSpec("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
             request_guards.check_request_token_ids, HookType.BEFORE),
    HookSpec("sglang.srt.speculative.eagle_worker_v2._eagle_prefill_tail_tokens",
             prefill_tail_tokens.tail_tokens_without_sync, HookType.AROUND),
)

_installed = False


def install_hooks() -> None:
    """Register every hook in ``HOOKS`` with sglang's HookRegistry (idempotent); sglang's
    ``load_plugins()`` applies them right after the plugins ran."""
    global _installed
    if _installed:
        return
    for spec in HOOKS:
        HookRegistry.register(spec.target, spec.hook, spec.hook_type)
    _installed = True


def resolve(dotted: str) -> Any:
    """The object at a dotted path: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"no importable module in {dotted!r}")


def _wraps_hook(obj: Any, hook: Callable) -> bool:
    """Whether ``hook`` is in a closure along ``obj``'s ``__wrapped__`` chain."""
    obj = getattr(obj, "__func__", obj)
    while obj is not None:
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook:
                    return True
            except ValueError:  # an empty cell
                continue
        obj = getattr(obj, "__wrapped__", None)
    return False


def missing_hooks() -> List[str]:
    """Targets in ``HOOKS`` on which our hook is not in effect."""
    missing = []
    for spec in HOOKS:
        try:
            in_effect = _wraps_hook(resolve(spec.target), spec.hook)
        except Exception:  # any failure to find the target means the hook is not in effect
            in_effect = False
        if not in_effect:
            missing.append(spec.target)
    return missing


def check_hooks_in_effect() -> None:
    """Raise a one-line RuntimeError naming every hook sglang did not apply."""
    missing = missing_hooks()
    if missing:
        import sglang

        raise RuntimeError(
            f"sglang-dynamic-eagle: hooks not in effect on {', '.join(missing)}; this package "
            f"supports sglang=={SUPPORTED_SGLANG} (installed: {sglang.__version__}); sglang's "
            "HookRegistry logged why above (\"Failed to apply hooks\"), unless another plugin "
            "wrapped the target without functools.wraps."
        )
