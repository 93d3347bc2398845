"""Plain-decode CUDA graphs for the target model inside a speculative server.

In a speculative server sglang captures the target only in TARGET_VERIFY mode
(``num_draft_tokens`` query tokens per request). Plain mode needs real DECODE
graphs (one token per request) up to the server's ``--cuda-graph-max-bs-decode``, with
their own attention-backend instance so the verify graphs' buffers stay
untouched, and with the EAGLE-3 auxiliary hidden states captured as output
(draft-KV catch-up needs them).
"""

from __future__ import annotations

import contextlib
import logging
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Union

import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput
from sglang.srt.model_executor.runner import DecodeCudaGraphRunner
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.utils.common import get_available_gpu_memory

from sglang_dynamic_eagle.engine.step_costs import (
    CALIBRATION_REPEATS,
    replays_whole_graphs,
    time_replays,
)
from sglang_dynamic_eagle.sglang_compat.flashinfer_workspace import decode_only_workspace

if TYPE_CHECKING:
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def plain_decode_batch_sizes(server_args: ServerArgs) -> List[int]:
    """The batch sizes a server without speculation would capture."""
    decode = server_args.cuda_graph_config.decode
    max_bs = decode.max_bs or max(decode.bs)
    non_speculative_view = SimpleNamespace(
        disable_cuda_graph_padding=server_args.disable_cuda_graph_padding,
        speculative_algorithm=None,
    )
    return ServerArgs._generate_decode_cuda_graph_batch_sizes(
        non_speculative_view, max_bs
    )


@contextlib.contextmanager
def _as_plain_server(model_runner: ModelRunner, capture_bs: List[int]) -> Iterator[None]:
    """Make the runner look like a non-speculative server while graphs are built.

    ``DecodeCudaGraphRunner`` picks TARGET_VERIFY and the verify width whenever
    ``model_runner.spec_algorithm`` is speculative, and reads the batch sizes
    and the shared logits buffer from the runner; all three are swapped back
    afterwards.
    """
    decode = model_runner.server_args.cuda_graph_config.decode
    saved = (model_runner.spec_algorithm, decode.bs, model_runner.graph_shared_output)
    model_runner.spec_algorithm = SpeculativeAlgorithm.NONE
    decode.bs = list(capture_bs)
    model_runner.graph_shared_output = GraphSharedOutput(
        device=model_runner.device, max_rows=max(capture_bs)
    )
    try:
        yield
    finally:
        model_runner.spec_algorithm, decode.bs, model_runner.graph_shared_output = saved


class PlainDecodeCudaGraphRunner(DecodeCudaGraphRunner):
    """DECODE graphs, one token per request, returning the aux hidden states.

    Each graph is timed right after its capture (``replay_ms``: batch size -> milliseconds of
    one replay), while the attention backend still holds the metadata that capture prepared
    for it: sglang prepares that metadata before every replay, and on fa3 a DECODE graph's
    scheduler metadata lives in one buffer shared by all batch sizes (sized and laid out per
    batch size), so a graph replayed later without the preparation reads the last captured
    size's metadata (an illegal memory access, measured on an H200 on 2026-12-05).
    """

    def __init__(
        self, model_runner: ModelRunner, *, attn_backend, capture_bs: List[int]
    ) -> None:
        self.replay_ms: Dict[int, float] = {}
        self._timing_failed = False
        with _as_plain_server(model_runner, capture_bs):
            super().__init__(model_runner, attn_backend=attn_backend)

    def capture_prepare(self, size: int, stream_idx=None, num_tokens=None):
        self.capture_hidden_mode = max(self.capture_hidden_mode, CaptureHiddenMode.FULL)
        return super().capture_prepare(size, stream_idx=stream_idx, num_tokens=num_tokens)

    def capture_one_shape(self, size: int, forward, stream_idx=None, variant_label=None):
        super().capture_one_shape(size, forward, stream_idx, variant_label)
        if self._times_at_capture(stream_idx, variant_label):
            try:
                self.replay_ms[size] = time_replays([self], [size], CALIBRATION_REPEATS)
            except Exception:  # a prior, not a reason to stop the server
                logger.exception("EAGLE3_DYNAMIC: timing the plain graph of batch %d failed; "
                                 "plain steps are measured online.", size)
                self.replay_ms.clear()
                self._timing_failed = True

    def _times_at_capture(self, stream_idx, variant_label) -> bool:
        """One graph per size, a full CUDA graph, one GPU: time it. LoRA variants and per-stream
        copies would need their own keys; with tensor parallelism a graph's custom all-reduce
        buffers are registered only when sglang's capture context closes, so a replay inside it
        would read unregistered peers (such servers measure plain steps online only)."""
        tp_group = getattr(self.model_runner, "tp_group", None)
        return (not self._timing_failed and stream_idx is None and variant_label is None
                and replays_whole_graphs(self)
                and getattr(tp_group, "world_size", 1) <= 1)


class PlainDecodeGraphs:
    """The plain-decode attention backend and graph runner, and the swap into them."""

    def __init__(self, model_runner: ModelRunner, capture_bs: Optional[List[int]]) -> None:
        self.model_runner = model_runner
        self.attn_backend = self._new_attention_backend()
        self.graph_runner: Optional[PlainDecodeCudaGraphRunner] = None
        self.capture_seconds = 0.0
        self.capture_gib = 0.0
        if capture_bs:
            self._capture(capture_bs)

    @property
    def max_bs(self) -> int:
        return self.graph_runner.max_bs if self.graph_runner is not None else 0

    def report(self) -> Dict[str, Union[int, float]]:
        return {
            "max_plain_graph_batch": self.max_bs,
            "plain_graph_capture_s": round(self.capture_seconds, 2),
            "plain_graph_memory_gib": round(self.capture_gib, 3),
        }

    def _new_attention_backend(self):
        runner = self.model_runner
        saved_flag = runner.init_new_workspace
        try:
            with decode_only_workspace():
                return runner._get_attention_backend(init_new_workspace=True)
        finally:
            runner.init_new_workspace = saved_flag

    def _capture(self, capture_bs: List[int]) -> None:
        runner = self.model_runner
        free_before = get_available_gpu_memory(runner.device, runner.gpu_id)
        tic = time.perf_counter()
        self.graph_runner = PlainDecodeCudaGraphRunner(
            runner, attn_backend=self.attn_backend, capture_bs=capture_bs
        )
        self.capture_seconds = time.perf_counter() - tic
        self.capture_gib = free_before - get_available_gpu_memory(
            runner.device, runner.gpu_id
        )
        logger.info(
            "EAGLE3_DYNAMIC: captured plain-decode graphs for %d batch sizes (max %d) "
            "in %.1f s using %.2f GiB.",
            len(self.graph_runner.capture_bs),
            self.graph_runner.max_bs,
            self.capture_seconds,
            self.capture_gib,
        )

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Route the target's next forward through the plain backend and graphs."""
        runner = self.model_runner
        saved = (runner.attn_backend, runner.decode_cuda_graph_runner)
        runner.attn_backend = self.attn_backend
        runner.decode_cuda_graph_runner = self.graph_runner
        try:
            yield
        finally:
            runner.attn_backend, runner.decode_cuda_graph_runner = saved
