"""Test-only sglang plugin: a deliberately broken EAGLE3_DYNAMIC plain step (negative controls).

With SGLANG_DE_TEST_BREAK_PLAIN_STEP in a server's environment:

* ``kv-slot``: every plain step writes the target's K/V of its token into the slot of the
  position before (an off-by-one that a batch rewrite can make), so the slot of the new position
  is never written. A lossless comparison must fail on such a server.
* ``greedy``: every plain step's sampler picks the most likely token whatever the request's
  sampling parameters (a plain step that lost the batch's sampling settings); its logprobs are
  computed as before, at the request's temperature, for the tokens it picked. A sampling
  comparison must fail on such a server.

Without the variable the plugin does nothing. Installed only on the GPU machine by
test/gpu/run.sh; never part of the product wheel.
"""

import logging
import os

import torch

logger = logging.getLogger(__name__)

BREAK_ENV = "SGLANG_DE_TEST_BREAK_PLAIN_STEP"
KV_SLOT = "kv-slot"
GREEDY = "greedy"


def register() -> None:
    value = os.environ.get(BREAK_ENV)
    if value is None:
        return
    if value not in (KV_SLOT, GREEDY):
        raise ValueError(f"{BREAK_ENV} must be {KV_SLOT!r} or {GREEDY!r}, got {value!r}")
    from sglang_dynamic_eagle.engine import plain_step

    if value == KV_SLOT:
        turn_into_decode_batch = plain_step.turn_into_decode_batch

        def write_kv_one_slot_early(batch, req_to_token: torch.Tensor) -> None:
            turn_into_decode_batch(batch, req_to_token)
            previous_positions = batch.seq_lens - 2
            batch.out_cache_loc = req_to_token[batch.req_pool_indices, previous_positions].to(torch.int64)

        plain_step.turn_into_decode_batch = write_kv_one_slot_early
        logger.warning("%s=%s: plain steps write their K/V one slot early (test only)", BREAK_ENV, value)
        return

    sample = plain_step.PlainDecodeStep._sample

    def sample_greedily(self, batch, forward_batch, logits_output):
        runner = self._target_worker.model_runner
        sampler = runner.sampler

        def greedy(logits, sampling_info, *args):
            was_greedy = sampling_info.is_all_greedy
            sampling_info.is_all_greedy = True
            try:
                return sampler(logits, sampling_info, *args)
            finally:
                sampling_info.is_all_greedy = was_greedy

        runner.sampler = greedy  # for this step's sampler call only
        try:
            return sample(self, batch, forward_batch, logits_output)
        finally:
            runner.sampler = sampler

    plain_step.PlainDecodeStep._sample = sample_greedily
    logger.warning("%s=%s: plain steps ignore the requests' sampling (test only)", BREAK_ENV, value)
