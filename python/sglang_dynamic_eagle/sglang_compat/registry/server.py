"""What the plugin, the launcher's argument handling and the hooks rely on in sglang 0.5.17
(part of ``registry.RELIANCES``; ``registry.engine`` holds the worker's)."""

from __future__ import annotations

from typing import Tuple

from sglang_dynamic_eagle.sglang_compat.registry.reliance import (
    ATTRIBUTE_SWAP, BEHAVIOUR, HOOK, PRIVATE_CALL, SUBCLASS, UpstreamReliance)

SERVER_RELIANCES: Tuple[UpstreamReliance, ...] = (
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
        how="called from DynamicEagleSpecAlgo.handle_server_args, before the changes of the "
        "entry below",
        why="CustomSpecAlgo.handle_server_args is a no-op: without this EAGLE3_DYNAMIC "
        "would get none of EAGLE3's defaults and checks",
        drop_when="sglang exposes per-runner graph batch sizes and a capacity hook",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.EAGLE3.handle_server_args",
        ),
    ),
    UpstreamReliance(
        target="ServerArgs.max_running_requests, speculative_num_steps / speculative_eagle_topk / "
        "speculative_num_draft_tokens, cuda_graph_config.decode.bs / max_bs",
        how="assigned in DynamicEagleSpecAlgo.handle_server_args: the draft shape completed "
        "as a chain when only part of it is given, EAGLE's cap of 48 running requests undone "
        "(when the user gave none), decode.bs cut to the speculative sizes while decode.max_bs "
        "keeps the full size (the plain-decode graphs cover it)",
        why="handle_server_args is the algorithm's one say over the resolved arguments; sglang "
        "0.5.17 fails on a partial chain shape, and every speculative graph runner captures "
        "decode.bs (get_batch_sizes_to_capture)",
        drop_when="sglang exposes per-runner graph batch sizes and a capacity hook",
        kind=ATTRIBUTE_SWAP,
        code=(
            "sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding",
            "sglang.srt.model_executor.runner.base_cuda_graph_runner.get_batch_sizes_to_capture",
        ),
        patched_by=(
            "sglang_dynamic_eagle.sglang_compat.spec_algo.DynamicEagleSpecAlgo.handle_server_args",
            "sglang_dynamic_eagle.sglang_compat.spec_algo._complete_chain_drafting",
            "sglang_dynamic_eagle.sglang_compat.spec_algo._limit_speculative_graphs",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.server_args.ServerArgs.add_cli_args / from_cli_args",
        how="HookRegistry AFTER hook on add_cli_args adds the three flags; AROUND hook on "
        "from_cli_args exports their values as JSON in SGLANG_DYNAMIC_EAGLE_FLAGS "
        "(launcher.after_add_cli_args, launcher.around_from_cli_args)",
        why="from_cli_args copies dataclass fields only, so plugin flags cannot be "
        "ServerArgs fields; scheduler processes are started with multiprocessing spawn, "
        "inherit the launcher's environment and call load_plugins() themselves",
        drop_when="sglang lets plugins declare server arguments",
        kind=HOOK,
        code=(
            "sglang.srt.server_args.ServerArgs.add_cli_args",
            "sglang.srt.server_args.ServerArgs.from_cli_args",
        ),
        patched_by=(
            "sglang_dynamic_eagle.sglang_compat.launcher.after_add_cli_args",
            "sglang_dynamic_eagle.sglang_compat.launcher.around_from_cli_args",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.arg_groups.overrides.resolved_view",
        how="read in unsupported.unsupported_reason to see resolved values (DP attention) and in "
        "flashinfer_workspace.uses_flashinfer (the attention backends sglang chose)",
        why="validation runs inside ServerArgs.__post_init__, before every value is final",
        drop_when="validate_server_args receives resolved arguments",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.arg_groups.overrides.resolved_view",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.speculative.eagle_worker_v2._eagle_prefill_tail_tokens",
        how="HookRegistry AROUND hook (hooks.prefill_tail_tokens.tail_tokens_without_sync): for "
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
        patched_by=(
            "sglang_dynamic_eagle.sglang_compat.hooks.prefill_tail_tokens.tail_tokens_without_sync",
        ),
    ),
    UpstreamReliance(
        target="python -m sglang.launch_server: argument errors reach the top (behaviour)",
        how="launcher.around_from_cli_args, for a command line that selects EAGLE3_DYNAMIC, "
        "installs a sys.excepthook that prints a StartupError as one line (and hands every "
        "other exception to the hook before it), then runs this "
        "package's validation and the NVIDIA GPU check before sglang builds ServerArgs",
        why="prepare_server_args does not catch errors from ServerArgs.__post_init__, so the "
        "interpreter printed a 25-line traceback above the one line that names the fix; and "
        "__post_init__ resolves the device before it calls the algorithm's validation, so on "
        "a machine without a GPU sglang's 'No accelerator' tracebacks came first",
        drop_when="sglang reports argument errors without a traceback",
        kind=BEHAVIOUR,
        code=("sglang.srt.server_args.prepare_server_args",),
        patched_by=("sglang_dynamic_eagle.sglang_compat.startup_errors.install_excepthook",),
    ),
    UpstreamReliance(
        target="LlamaForCausalLMEagle3 reads --speculative-draft-window-size whatever the "
        "algorithm's name (behaviour)",
        how="plugin._validate_server_args logs, after sglang's warning, that the window applies",
        why="handle_speculative_decoding warns that the flag has no effect for any algorithm but "
        "EAGLE3 and DFLASH, yet the draft class sets every layer's sliding window from it (and "
        "the model runner's, through get_attention_sliding_window_size): under EAGLE3_DYNAMIC "
        "the warning is wrong",
        drop_when="sglang's warning asks the draft model, not the algorithm's name",
        kind=BEHAVIOUR,
        code=("sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding",
              "sglang.srt.models.llama_eagle3.LlamaForCausalLMEagle3.get_attention_sliding_window_size"),
        patched_by=("sglang_dynamic_eagle.sglang_compat.plugin._validate_server_args",),
    ),
    UpstreamReliance(
        target="sglang's import order: kernel modules before plugins (behaviour)",
        how="the wheel installs sglang_dynamic_eagle_first_contact.pth at the root of "
        "site-packages; Python runs its line at every start: a substring test of sys.argv, and "
        "for sglang's launcher selecting EAGLE3_DYNAMIC on CUDA, first_contact.check, which exits "
        "with one line when libcuda.so.1 does not load or CUDA_VISIBLE_DEVICES hides every GPU",
        why="sglang imports its kernel and quantization modules before load_plugins, and "
        "without CUDA they print 9-11 warning lines above the launcher's one-line refusal "
        "(12 lines in all for python -m sglang.launch_server on a CPU machine)",
        drop_when="sglang loads plugins (or checks for an accelerator) before importing its "
        "kernel modules",
        kind=BEHAVIOUR,
        code=("sglang.srt.plugins.load_plugins",),
        patched_by=("sglang_dynamic_eagle.sglang_compat.first_contact.check",),
    ),
    UpstreamReliance(
        target="sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run / waiting_queue",
        how="AFTER hook hands the worker the plan's batch_to_run and len(scheduler.waiting_queue) "
        "(hooks.batch_selection.batch_selected); the scheduler calls it once per loop, before "
        "run_batch calls the worker with that batch object (in the overlap loop after "
        "FutureMap.resolve_seq_lens_cpu, which waits for the previous verify on flashinfer); the "
        "worker decides a decode step there and uses the decision when that same batch arrives "
        "(another batch: it decides at the call)",
        why="the policy projects the batch the queue will fill (a burst leaves speculation "
        "before the batch grows), and its decision's host time stays out of the window between "
        "the previous verify and this step's launch, where flashinfer's step waits on the host",
        drop_when="sglang passes scheduling state (queue length) to the speculative worker and "
        "calls it when a batch is chosen",
        kind=HOOK,
        code=(
            "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run",
            "sglang.srt.managers.schedule_batch.NextBatchPlan",
            "sglang.srt.managers.overlap_utils.FutureMap.resolve_seq_lens_cpu",
        ),
        patched_by=("sglang_dynamic_eagle.sglang_compat.hooks.batch_selection.batch_selected",),
    ),
    UpstreamReliance(
        target="the scheduler loops process a step's result after the next batch is chosen "
        "(behaviour)",
        how="not patched: DynamicEagleWorker.batch_selected decides a decode step at the batch's "
        "choice, reading verify results (on_verify_complete_cpu), requests' kv_committed_len and "
        "output ids, which only result processing changes; event_loop_overlap processes the "
        "previous result after run_batch (before it only where is_disable_overlap_for_batch says "
        "so: grammar batches, whose decision then misses that one result), event_loop_normal "
        "processes each result in the iteration that ran it",
        why="the decision is the same at the choice as at the worker's call, so it can leave the "
        "window between flashinfer's wait for the previous verify and the step's launch",
        drop_when="sglang calls the speculative worker when a batch is chosen",
        kind=BEHAVIOUR,
        code=(
            "sglang.srt.managers.scheduler.Scheduler.event_loop_overlap",
            "sglang.srt.managers.scheduler.Scheduler.event_loop_normal",
            "sglang.srt.managers.scheduler.Scheduler.is_disable_overlap_for_batch",
            "sglang.srt.managers.scheduler.Scheduler.run_batch",
        ),
        patched_by=(),
    ),
    UpstreamReliance(
        target="sglang.srt.managers.scheduler.Scheduler.get_internal_state",
        how="AFTER hook adds the worker's report under 'dynamic_eagle' "
        "(hooks.reporting.add_report_to_internal_state)",
        why="/get_server_info returns this dict; there is no worker-stats extension point",
        drop_when="spec workers can contribute to get_internal_state",
        kind=HOOK,
        code=(
            "sglang.srt.managers.scheduler.Scheduler.get_internal_state",
        ),
        patched_by=(
            "sglang_dynamic_eagle.sglang_compat.hooks.reporting.add_report_to_internal_state",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.managers.scheduler_components.metrics_reporter."
        "SchedulerMetricsReporter.report_decode_stats",
        how="AFTER hook logs the counters on the periodic decode log line's schedule and, "
        "with --enable-metrics, updates their Prometheus metrics (observability."
        "prometheus_metrics) "
        "with the labels of reporter.metrics_collector",
        why="no extension point for the decode log line or for spec-worker metrics",
        drop_when="spec workers can append to the decode log line",
        kind=HOOK,
        code=(
            "sglang.srt.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter.report_decode_stats",
        ),
        patched_by=("sglang_dynamic_eagle.sglang_compat.hooks.reporting.report_with_decode_stats",),
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
        target="sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
        how="BEFORE hook checks client-sent input_ids against [0, vocab size) "
        "(hooks.request_guards.check_request_token_ids); the ValueError becomes HTTP 400",
        why="an out-of-vocabulary or negative id kills the scheduler with a CUDA device-side "
        "assert in the embedding, losing every request in flight; sglang 0.5.17 defines "
        "_validate_input_ids_in_vocab but never calls it (and it ignores negative ids)",
        drop_when="sglang validates token ids of token prompts before scheduling them",
        kind=HOOK,
        code=("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",),
        patched_by=(
            "sglang_dynamic_eagle.sglang_compat.hooks.request_guards.check_request_token_ids",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.plugins.hook_registry.HookRegistry (behaviour)",
        how="every hook of the registry is registered in HOOKS and installed by "
        "install_hooks(); missing_hooks() walks each target's wrapper chain for our hook",
        why="apply_hooks logs a failed hook and carries on, so an sglang upgrade would show up as "
        "a confusing argparse error or silently missing counters; the plugin instead refuses to "
        "start with one line naming the hooks that are not in effect",
        drop_when="apply_hooks raises (or reports) failures",
        kind=BEHAVIOUR,
        code=("sglang.srt.plugins.hook_registry.HookRegistry.apply_hooks",),
    ),
    UpstreamReliance(
        target="SGLANG_FLASHINFER_WORKSPACE_SIZE: the size of flashinfer attention's float workspace",
        how="set in the launcher's environment (which scheduler processes inherit) by "
        "flashinfer_workspace.size_workspace when the user has not set it and the largest verify "
        "graph's prefill plan needs more than sglang's 384 MiB; where the user's value or sglang's "
        "fixed 512 MiB for Qwen2/3 and MiMo is too small, the speculative graphs stop at the batch "
        "it holds; the plain graphs' own backend is built at 384 MiB (decode_only_workspace)",
        why="sglang sizes the workspace for stock EAGLE's 48 running requests; at batch 256 and "
        "4 draft tokens flashinfer asked for 602 MB of split-KV partial outputs and the server "
        "stopped in graph capture (H100, Llama-8B shape, 2026-12-05)",
        drop_when="sglang sizes flashinfer's workspace from the graphs it captures",
        kind=BEHAVIOUR,
        code=(
            "sglang.srt.environ.Envs.SGLANG_FLASHINFER_WORKSPACE_SIZE",
            "sglang.srt.layers.attention.flashinfer_backend.FlashInferAttnBackend.__init__",
            "sglang.srt.server_args.ServerArgs.get_model_config",
        ),
    ),
    UpstreamReliance(
        target="FutureMap.stash of the scheduler's future map",
        how="wrapped once per scheduler (engine.early_first_token.EarlyFirstToken.attach): the "
        "stash of a prefill whose draft extend ran on the side stream runs on that stream, "
        "every other stash as before",
        why="the scheduler stashes the draft's output on the forward stream right after the "
        "forward returns; read there it would race the draft extend",
        drop_when="sglang copies a speculative prefill's first token before the draft extend",
        kind=ATTRIBUTE_SWAP,
        code=(
            "sglang.srt.managers.overlap_utils.FutureMap.stash",
            "sglang.srt.managers.overlap_utils.RelayPayload.from_draft_input",
            "sglang.srt.managers.scheduler.Scheduler._relay_forward_payload",
        ),
        patched_by=("sglang_dynamic_eagle.engine.early_first_token.EarlyFirstToken.attach",),
    ),
    UpstreamReliance(
        target="Scheduler.run_batch (overlap) and Scheduler._apply_war_barrier: stream order",
        how="not patched; engine.early_first_token relies on: the copy stream waits for the "
        "forward stream after the stash; after each launch the schedule stream waits for the "
        "event of model_worker.war_fastpath_runner (the worker returns the side stream's end "
        "after an early prefill); each forward first waits for the schedule stream; the "
        "barrier is on with CUDA unless SGLANG_FORCE_COARSE_WAR_BARRIER; the unified memory "
        "pool records its forward-done event on the forward stream (with either it stays off)",
        why="these put the first token's copy after the target extend only, and every later "
        "GPU step after the draft extend and its stash",
        drop_when="sglang copies a speculative prefill's first token before the draft extend",
        kind=BEHAVIOUR,
        code=(
            "sglang.srt.managers.scheduler.Scheduler.run_batch",
            "sglang.srt.managers.scheduler.Scheduler._apply_war_barrier",
            "sglang.srt.managers.scheduler.Scheduler.event_loop_overlap",
            "sglang.srt.environ.Envs.SGLANG_FORCE_COARSE_WAR_BARRIER",
        ),
    ),
)
