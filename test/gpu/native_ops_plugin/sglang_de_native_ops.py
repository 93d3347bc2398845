"""Test-only sglang plugin: serve a model in float32 on CUDA.

sglang 0.5.17's CUDA kernels behind its custom ops do not all take float32 (sgl_kernel's
`rmsnorm` fails with "failed to dispatch data type Float", device run of 2026-11-29), so a
float32 Llama server dies while loading. With SGLANG_DE_TEST_NATIVE_OPS=1 in a server's
environment, every `MultiPlatformOp` (RMSNorm, SiluAndMul, rotary embedding, ...) that has a
pure-torch `forward_native` dispatches to it instead. Speculative and plain servers then run
the same float32 arithmetic, which is what the GPU tests' token-for-token comparisons need.
Without the variable the plugin does nothing. Installed only on the GPU machine by
test/gpu/run.sh; never part of the product wheel.
"""

import logging
import os
from typing import Callable

logger = logging.getLogger(__name__)

ENABLE_ENV = "SGLANG_DE_TEST_NATIVE_OPS"


def register() -> None:
    if os.environ.get(ENABLE_ENV) != "1":
        return
    from sglang.srt.layers.utils.multi_platform import MultiPlatformOp

    platform_dispatch = MultiPlatformOp.dispatch_forward

    def dispatch_native(self: MultiPlatformOp) -> Callable:
        if type(self).forward_native is MultiPlatformOp.forward_native:
            return platform_dispatch(self)
        return self.forward_native

    MultiPlatformOp.dispatch_forward = dispatch_native
    logger.warning("%s=1: sglang custom ops run their pure-torch forward_native (test only)", ENABLE_ENV)
