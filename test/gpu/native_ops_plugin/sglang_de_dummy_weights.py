"""Test-only sglang plugin: dummy weights whose outputs depend on the input.

sglang 0.5.17's `--load-format dummy` draws every floating-point parameter from
uniform(-1e-3, 1e-3), RMSNorm weights included, so an 8B-shaped model's logits spread over a
few 1e-6: every token is a near-tie, a comparison with a tie rule passes whatever the
speculative path computes, and attention or KV-cache errors barely move the output. With
SGLANG_DE_TEST_DUMMY_WEIGHT_STD=<std> in a server's environment, matrices are drawn from
normal(0, std) instead (0.02, the usual initialisation, gives logits of about unit spread),
one-dimensional norm weights are 1 and other one-dimensional parameters 0. Like sglang's, the
values depend only on each parameter's shape, so every server with the same flags gets the
same model. Without the variable the plugin does nothing. Installed only on the GPU machine
by test/gpu/run.sh; never part of the product wheel.
"""

import logging
import math
import os

import torch

logger = logging.getLogger(__name__)

STD_ENV = "SGLANG_DE_TEST_DUMMY_WEIGHT_STD"
SEED = 1234


def initialize_spread_dummy_weights(model: torch.nn.Module, std: float) -> None:
    for name, param in model.state_dict().items():
        if not torch.is_floating_point(param):
            continue
        if param.dim() == 1:
            param.fill_(1.0 if "norm" in name else 0.0)
            continue
        generator = torch.Generator(device=param.device)
        generator.manual_seed(SEED)
        param.normal_(0.0, std, generator=generator)


def std_from_env() -> float:
    text = os.environ[STD_ENV]
    try:
        std = float(text)
    except ValueError:
        std = math.nan
    if not (math.isfinite(std) and std > 0):
        raise ValueError(f"{STD_ENV} must be a positive number, got {text!r}")
    return std


def register() -> None:
    if STD_ENV not in os.environ:
        return
    std = std_from_env()
    from sglang.srt.model_loader import loader

    def initialize_dummy_weights(model: torch.nn.Module, *args, **kwargs) -> None:
        initialize_spread_dummy_weights(model, std)

    loader.initialize_dummy_weights = initialize_dummy_weights
    logger.warning("%s=%s: dummy weights drawn from normal(0, %s) (test only)", STD_ENV, std, std)
