"""Test-only sglang plugin: EAGLE3_DYNAMIC's early first token with a slow side stream.

With SGLANG_DE_TEST_SLOW_SIDE_STREAM in a server's environment, every entry into the side stream
of ``engine.early_first_token`` (the draft's prefill, then the stash of its output) first spins
the GPU for ``SPIN_CYCLES`` clock cycles (about 30 ms on an H100), so that any step that does not
wait for the side stream reads the draft's prefill and the next step's inputs before they exist:

* ``slow``: the orderings as shipped. The outputs and the verify counts must not change.
* ``slow-no-barrier``: the scheduler's barrier after a prefill is not handed the side stream's
  end (its fallback waits for the forward stream only). A comparison of outputs or verify counts
  must fail on such a server (negative control).

Without the variable the plugin does nothing. Installed only on the GPU machine; never part of
the product wheel.
"""

import logging
import os
from contextlib import contextmanager

logger = logging.getLogger(__name__)

SLOW_ENV = "SGLANG_DE_TEST_SLOW_SIDE_STREAM"
SLOW = "slow"
NO_BARRIER = "slow-no-barrier"
SPIN_CYCLES = 50_000_000


def register() -> None:
    value = os.environ.get(SLOW_ENV)
    if value is None:
        return
    if value not in (SLOW, NO_BARRIER):
        raise ValueError(f"{SLOW_ENV} must be {SLOW!r} or {NO_BARRIER!r}, got {value!r}")
    from sglang_dynamic_eagle.engine import early_first_token

    use = early_first_token.CudaStreams.use

    @contextmanager
    def use_slowly(self, stream):
        import torch

        with use(self, stream):
            torch.cuda._sleep(SPIN_CYCLES)
            yield

    early_first_token.CudaStreams.use = use_slowly
    if value == NO_BARRIER:
        early_first_token.EarlyFirstToken.war_fastpath_read_done_event = property(
            lambda self: None, lambda self, event: None)
    logger.warning("%s=%s: the early first token's side stream spins first%s (test only)",
                   SLOW_ENV, value, "; no barrier waits for it" if value == NO_BARRIER else "")
