"""What the worker relies on in sglang 0.5.17: the speculative worker it extends, the target
runner it routes plain steps through, the batch it rewrites, the draft extend the catch-up
reuses (part of ``registry.RELIANCES``; ``registry.server`` holds the rest)."""

from __future__ import annotations

from typing import Tuple

from sglang_dynamic_eagle.sglang_compat.registry.reliance import UpstreamReliance
from sglang_dynamic_eagle.sglang_compat.registry.reliance import (ATTRIBUTE_SWAP, BEHAVIOUR,
                                                                  PRIVATE_CALL, SUBCLASS)

ENGINE_RELIANCES: Tuple[UpstreamReliance, ...] = (
    UpstreamReliance(
        target="sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2",
        how="subclassed (engine.worker.DynamicEagleWorker, and with the host-sync check "
        "observability.host_syncs.with_host_sync_check of it); overrides "
        "forward_batch_generation, init_cuda_graphs, war_fastpath_runner, "
        "spec_v2_attn_backends, on_verify_complete_cpu; reads _target_worker, _draft_worker, "
        "plan_stream, topk, speculative_num_steps, speculative_num_draft_tokens and the draft "
        "worker's cuda_graph_runner / cuda_graph_runner_for_draft_extend / draft_runner "
        "(engine.startup)",
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
        target="sglang.srt.model_executor.forward_batch_info.clamp_position",
        how="called once at start-up (engine.jit_warmup.warm_sglang_jit_kernels)",
        why="sglang JIT-compiles it on the first DECODE ForwardBatch; a speculative server "
        "never builds one, so the first switch to plain mode stalled 7 s (H200, 2026-11-29)",
        drop_when="sglang compiles its JIT kernels at start-up",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.model_executor.forward_batch_info.clamp_position",
        ),
    ),
    UpstreamReliance(
        target="sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func",
        how="called at start-up with empty ranges and int32 lengths (as alloc_for_spec_decode "
        "passes them) for every power of two up to the running-request cap and both slot-pointer "
        "alignments (engine.jit_warmup)",
        why="its triton kernel takes the batch's power of two as a compile-time constant, so "
        "decode steps (both modes: sglang allocates before the worker decides) compiled it at "
        "each new batch size: steps of 77-127 ms (H100, triton, 2026-12-06)",
        drop_when="sglang compiles the kernel at start-up or stops specialising it on batch size",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func",
            "sglang.srt.mem_cache.allocation.assign_req_to_token_pool",
            "sglang.srt.mem_cache.allocation.alloc_for_spec_decode",
            "sglang.srt.speculative.eagle_utils.eagle_prepare_for_decode",
            "sglang.srt.mem_cache.allocator.token.TokenToKVPoolAllocator.alloc",
        ),
    ),
    UpstreamReliance(
        target="EagleDraftWorker._draft_extend_for_prefill",
        how="called with an EXTEND view of the missed positions (engine.draft_catchup; the "
        "view is the entry below)",
        why="it is exactly the draft extend catch-up needs (shift tokens, LAST capture, "
        "topk seeds); re-implementing it would copy sglang code",
        drop_when="sglang exposes a public draft-extend-over-positions API",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill",
        ),
    ),
    UpstreamReliance(
        target="ScheduleBatch fields of the catch-up's EXTEND view",
        how="a shallow copy of the decode batch (copy.copy) with forward mode, input ids, "
        "request slots, lengths, KV slots, extend lengths and prefix lengths of the missed "
        "positions, no logprobs, grammar, chunking or multimodal inputs, and a copy of its "
        "sampling info",
        why="the draft extend builds its ForwardBatch from a ScheduleBatch; the copy leaves "
        "the decode batch as the speculative step needs it",
        drop_when="sglang exposes a public draft-extend-over-positions API",
        kind=ATTRIBUTE_SWAP,
        code=(
            "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new",
            "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill",
        ),
        patched_by=(
            "sglang_dynamic_eagle.engine.draft_catchup.DraftCatchup._extend_batch",
        ),
    ),
    UpstreamReliance(
        target="EagleDraftInput.topk_p / topk_index / hidden_states of the decode batch",
        how="replaced, out of place, by tensors whose caught-up rows hold the catch-up's "
        "draft seeds (engine.draft_catchup.DraftCatchup.run)",
        why="the speculative step's first draft step proposes from them; after plain steps "
        "they are the plain step's zero stubs",
        drop_when="sglang exposes a public draft-extend-over-positions API",
        kind=ATTRIBUTE_SWAP,
        code=(
            "sglang.srt.speculative.eagle_info.EagleDraftInput",
            "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft",
        ),
        patched_by=("sglang_dynamic_eagle.engine.draft_catchup.DraftCatchup.run",),
    ),
    UpstreamReliance(
        target="EAGLEWorkerV2.forward_batch_generation on_publish (behaviour)",
        how="the worker always passes an on_publish callback to a prefill and marks the "
        "end of the target extend there (observability.prefill_timing)",
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
        how="subclassed (engine.plain_decode_graphs.PlainDecodeCudaGraphRunner), built "
        "under the swap of the entry below; capture_prepare forces FULL hidden capture; "
        "capture_one_shape times each graph right after its capture (replay_ms), while the "
        "attention backend holds the metadata capture prepared for that size (one GPU only: "
        "under tensor parallelism custom all-reduce buffers register when the capture context "
        "closes)",
        why="a speculative server captures its target only in TARGET_VERIFY mode "
        "(decode_cuda_graph_runner.py: capture_forward_mode)",
        drop_when="DecodeCudaGraphRunner takes capture mode, width and batch sizes as arguments",
        kind=SUBCLASS,
        code=(
            "sglang.srt.model_executor.runner.DecodeCudaGraphRunner.capture_prepare",
            "sglang.srt.model_executor.runner.DecodeCudaGraphRunner.capture_one_shape",
        ),
    ),
    UpstreamReliance(
        target="ModelRunner.spec_algorithm / graph_shared_output and "
        "cuda_graph_config.decode.bs while the plain-decode graphs are built",
        how="spec_algorithm NONE, decode.bs the plain batch sizes and graph_shared_output a "
        "private buffer for the plain runner's constructor, all three restored after",
        why="DecodeCudaGraphRunner picks TARGET_VERIFY and the verify width whenever the "
        "runner's algorithm is speculative, and reads its batch sizes and logits buffer from "
        "the model runner and the server arguments",
        drop_when="DecodeCudaGraphRunner takes capture mode, width and batch sizes as arguments",
        kind=ATTRIBUTE_SWAP,
        code=(
            "sglang.srt.model_executor.runner.DecodeCudaGraphRunner.__init__",
            "sglang.srt.model_executor.runner.base_cuda_graph_runner.get_batch_sizes_to_capture",
        ),
        patched_by=("sglang_dynamic_eagle.engine.plain_decode_graphs._as_plain_server",),
    ),
    UpstreamReliance(
        target="ModelRunner._get_attention_backend / attn_backend / decode_cuda_graph_runner",
        how="a second attention backend instance (init_new_workspace=True, as sglang's "
        "adaptive mode does), with the runner's init_new_workspace, which that call sets, "
        "restored after",
        why="graph state lives in the backend instance: the plain graphs need their own",
        drop_when="ModelRunner supports several decode graph runners keyed by forward mode",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.model_executor.model_runner.ModelRunner._get_attention_backend",
            "sglang.srt.model_executor.model_runner_components.attention_backend_setup."
            "get_attention_backend",
        ),
        patched_by=(
            "sglang_dynamic_eagle.engine.plain_decode_graphs.PlainDecodeGraphs."
            "_new_attention_backend",
        ),
    ),
    UpstreamReliance(
        target="ModelRunner.attn_backend / decode_cuda_graph_runner around each plain forward",
        how="set to the plain backend and graph runner for the plain step's target forward, "
        "restored after (engine.plain_decode_graphs.PlainDecodeGraphs.active)",
        why="ModelRunner dispatches decode graph replay through the one "
        "decode_cuda_graph_runner attribute and eager attention through attn_backend",
        drop_when="ModelRunner supports several decode graph runners keyed by forward mode",
        kind=ATTRIBUTE_SWAP,
        code=(
            "sglang.srt.model_executor.model_runner.ModelRunner._forward_raw",
        ),
        patched_by=("sglang_dynamic_eagle.engine.plain_decode_graphs.PlainDecodeGraphs.active",),
    ),
    UpstreamReliance(
        target="ModelRunner.war_fastpath_read_done_event",
        how="set to None before each plain forward (engine.plain_step.PlainDecodeStep.run); "
        "the plain graph's replay publishes a fresh one, an eager forward none",
        why="the scheduler's WAR barrier waits on the event of the runner the last step "
        "read through (war_fastpath_runner); a stale event must not satisfy it",
        drop_when="the WAR barrier keys its event by step",
        kind=ATTRIBUTE_SWAP,
        code=(
            "sglang.srt.managers.scheduler.Scheduler._apply_war_barrier",
            "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.war_fastpath_runner",
        ),
        patched_by=("sglang_dynamic_eagle.engine.plain_step.PlainDecodeStep.run",),
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
        target="ScheduleBatch fields in a plain step (Scheduler._forward_isolation)",
        how="the plain step rewrites batch.input_ids/out_cache_loc/seq_lens/seq_lens_cpu/"
        "seq_lens_sum/forward_mode/spec_info in place (engine.plain_step."
        "turn_into_decode_batch)",
        why="the scheduler snapshots and restores every ScheduleBatch field around a "
        "spec-v2 forward, as EAGLE's own verify relies on",
        drop_when="n/a (documented spec-v2 contract in 0.5.17)",
        kind=ATTRIBUTE_SWAP,
        code=(
            "sglang.srt.managers.scheduler.Scheduler._forward_isolation",
        ),
        patched_by=("sglang_dynamic_eagle.engine.plain_step.turn_into_decode_batch",),
    ),
    UpstreamReliance(
        target="ScheduleBatch.req_pool_indices_cpu (behaviour)",
        how="the plain step, the catch-up and the prefill bookkeeping read a batch's request "
        "slots from it (engine.draft_catchup.batch_req_pool_indices)",
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
        target="ModelRunner._preprocess_logits / ModelRunner.sampler, "
        "sglang.srt.layers.logprob_processor.compute_spec_v2_logprobs",
        how="called in that order by the plain step instead of ModelRunner.sample, with a "
        "copy of the logits taken in between, which replaces the logits output's "
        "next_token_logits after the sampler; then compute_spec_v2_logprobs with one "
        "accepted row per request (engine.plain_step.PlainDecodeStep._sample)",
        why="logprobs must be those of the logits after penalties, logit bias and grammar "
        "mask but before the sampler's in-place temperature, as EAGLE's verify reports them, "
        "in the [bs, accepted] layout the spec-v2 result processor reads; sample() gives no "
        "access to that point",
        drop_when="ModelRunner.sample can return spec-v2 shaped logprobs",
        kind=PRIVATE_CALL,
        code=(
            "sglang.srt.model_executor.model_runner.ModelRunner._preprocess_logits",
            "sglang.srt.layers.logits_processor.LogitsProcessorOutput",
            "sglang.srt.layers.logprob_processor.compute_spec_v2_logprobs",
        ),
        patched_by=("sglang_dynamic_eagle.engine.plain_step.PlainDecodeStep._sample",),
    ),
    UpstreamReliance(
        target="sglang.srt.managers.schedule_batch.Req (kv_committed_len, sampling_params, "
        "output_ids)",
        how="read per request at each decode step (engine.observations.observe): KV tokens of the "
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
        target="graph replay on the runners' backends (engine.step_costs.calibrate)",
        how="runner.backend.replay(runner._make_graph_key(bs), None) inside "
        "runner.backend.replay_session(), for every bucket in runner.capture_bs, timed with CUDA "
        "events: the speculative graphs at start-up on the buffers the capture left, the plain "
        "graphs at their capture (on fa3 a DECODE graph's scheduler metadata is one buffer for "
        "all batch sizes, filled before each replay: a later raw replay faulted on an H200)",
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
        target="EAGLEWorkerV2.ps: ParallelState.tp_rank and dp_rank",
        how="the decode-step trace is written by tensor-parallel rank 0 only, and a "
        "data-parallel replica beyond the first writes <file>.dp<rank> "
        "(engine.startup.trace_file)",
        why="every rank decides alike; one writer per replica keeps each step once in a trace",
        drop_when="never (sglang's own parallel state); re-check the names on upgrade",
        kind=BEHAVIOUR,
        code=(
            "sglang.srt.distributed.parallel_state_wrapper.ParallelState.tp_rank",
            "sglang.srt.distributed.parallel_state_wrapper.ParallelState.dp_rank",
        ),
    ),
    UpstreamReliance(
        target="GroupCoordinator.cpu_group / world_size of the target's tp_group",
        how="torch.distributed.all_reduce(MAX) of the cost vector on the TP group's gloo group "
        "every 8 decode steps and once at start-up (engine.step_costs.tp_max_reducer)",
        why="every rank must decide from the same cost table; a CPU collective needs no GPU "
        "synchronisation on the decode path",
        drop_when="n/a (sglang's own CPU barrier uses the same group)",
        kind=PRIVATE_CALL,
        code=("sglang.srt.distributed.parallel_state.GroupCoordinator",),
    ),
)
