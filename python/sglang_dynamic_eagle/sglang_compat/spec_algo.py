"""The EAGLE3_DYNAMIC algorithm object that sglang dispatches on.

sglang branches on ``spec_algorithm.is_eagle()`` / ``is_eagle3()`` and a few
other methods all over the scheduler, model runner and memory sizing code, so
this class answers every predicate exactly like ``SpeculativeAlgorithm.EAGLE3``
and only changes what EAGLE3_DYNAMIC does differently at server-argument time:

* no cap of 48 running requests (plain mode serves as many requests as a
  server without speculation would);
* the speculative CUDA graphs (target verify, draft, draft extend) are captured
  only up to ``Config.speculative_graph_max_bs`` (and, with flashinfer attention, to what its
  workspace holds: ``flashinfer_workspace``); the plain-decode graphs built by the worker cover
  the full ``--cuda-graph-max-bs-decode``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from sglang_dynamic_eagle.config import load_config
from sglang_dynamic_eagle.policy import ALGORITHM_NAME
from sglang_dynamic_eagle.sglang_compat import flashinfer_workspace

if TYPE_CHECKING:
    import torch
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpecInput

logger = logging.getLogger(__name__)

_EAGLE3 = SpeculativeAlgorithm.EAGLE3
# The chain completed when only the topk 1 is given (EAGLE3 would need steps and draft tokens).
DEFAULT_CHAIN_SHAPE = (3, 1, 4)


class DynamicEagleSpecAlgo(CustomSpecAlgo):
    """Behaves as EAGLE3 for every sglang predicate; see the module docstring."""

    def is_eagle(self) -> bool:
        return True

    def is_eagle3(self) -> bool:
        return True

    def supports_grammar_overlap(self) -> bool:
        # The plain step does not call the scheduler's grammar barrier, so
        # grammar batches must run without overlap (sglang then never passes it).
        return False

    def has_draft_kv(self) -> bool:
        return _EAGLE3.has_draft_kv()

    def carries_draft_hidden_states(self) -> bool:
        return _EAGLE3.carries_draft_hidden_states()

    def need_topk(self) -> bool:
        return _EAGLE3.need_topk()

    def create_future_map(
        self,
        device: torch.device,
        req_to_token_pool,
        needs_cpu_seq_lens: bool = True,
        needs_confidence_relay: bool = False,
    ) -> FutureMap:
        # The unbound enum method builds FutureMap(device, self, ...), so the
        # map keeps pointing at this algorithm object (need_topk() etc.).
        return SpeculativeAlgorithm.create_future_map(
            self, device, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay
        )

    def build_disagg_draft_input(
        self,
        batch: ScheduleBatch,
        server_args: ServerArgs,
        last_tokens_tensor: torch.Tensor,
        future_map: FutureMap,
    ) -> Optional[SpecInput]:
        # PD disaggregation is rejected at startup (launcher.validate_server_args).
        return None

    def handle_server_args(self, server_args: ServerArgs) -> None:
        user_max_running_requests = server_args.max_running_requests
        load_config()  # refuses a bad flag or environment variable in one line
        _complete_chain_drafting(server_args)
        _EAGLE3.handle_server_args(server_args)
        if user_max_running_requests is None:
            server_args.max_running_requests = None
            logger.info(
                "%s: EAGLE's cap of 48 running requests (sglang's \"reset to 48\" warning "
                "above) is undone: max running requests are left to the KV-cache capacity, "
                "as without speculation, because plain mode serves large batches.",
                ALGORITHM_NAME,
            )
        _limit_speculative_graphs(server_args)


def _complete_chain_drafting(server_args: ServerArgs) -> None:
    """Without any of the three draft-shape flags, EAGLE3's own shape (sglang's automatic
    choice: a topk-4 tree of 5 steps and 8 draft tokens for Llama targets, a chain for most
    others). A tree comes whole (``unsupported`` refuses one without its step count or its
    draft-token count); anything else is completed as a chain, for which one of the two is
    enough: its draft tokens are steps + 1 (sglang's EAGLE3 handling sets them from the steps;
    the steps are derived here from draft tokens alone), and with neither it is
    ``DEFAULT_CHAIN_SHAPE``. sglang 0.5.17 itself fails with a TypeError when only the step
    count is given, and an AssertionError when only the draft-token count is.
    """
    given = (
        server_args.speculative_num_steps,
        server_args.speculative_eagle_topk,
        server_args.speculative_num_draft_tokens,
    )
    if given == (None, None, None):
        logger.info("%s: no draft shape given: EAGLE3's default shape.", ALGORITHM_NAME)
        return
    steps, topk, tokens = given
    topk = 1 if topk is None else topk
    if steps is None and tokens is None:
        steps, tokens = DEFAULT_CHAIN_SHAPE[0], DEFAULT_CHAIN_SHAPE[2]
    elif steps is None:
        steps = tokens - 1
    if (steps, topk, tokens) == given:
        return
    (
        server_args.speculative_num_steps,
        server_args.speculative_eagle_topk,
        server_args.speculative_num_draft_tokens,
    ) = (steps, topk, tokens)
    logger.info("%s: speculative steps %d, topk %d, draft tokens %d (completed from the flags given).",
                ALGORITHM_NAME, steps, topk, tokens)


def _limit_speculative_graphs(server_args: ServerArgs) -> None:
    """Restrict the decode graph list to the speculative sizes.

    ``decode.bs`` is what every speculative runner captures; ``decode.max_bs``
    stays at the full size and is what the plain-decode runner covers.
    """
    decode = server_args.cuda_graph_config.decode
    if not decode.bs:
        return
    spec_max_bs = load_config().speculative_graph_max_bs(max(decode.bs))
    spec_max_bs = flashinfer_workspace.size_workspace(server_args, spec_max_bs) or spec_max_bs
    spec_bs = [bs for bs in decode.bs if bs <= spec_max_bs]
    if spec_max_bs not in spec_bs:
        spec_bs.append(spec_max_bs)
    if decode.max_bs is None:
        decode.max_bs = max(decode.bs)
    decode.bs = spec_bs
    logger.info(
        "%s: speculative CUDA graphs up to batch %d, plain-decode graphs up to %d.",
        ALGORITHM_NAME,
        spec_max_bs,
        decode.max_bs,
    )
