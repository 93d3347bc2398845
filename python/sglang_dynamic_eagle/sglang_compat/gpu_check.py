"""EAGLE3_DYNAMIC needs an NVIDIA GPU: the one check, shared by the launcher and ``doctor``.

On a machine without an accelerator sglang's own start-up fails inside
``ServerArgs.__post_init__`` (resolving the device) with two chained tracebacks ending in "No
accelerator ...", before it calls the algorithm's validation. The launcher hook
(``launcher.around_from_cli_args``) runs this package's validation and then this check before sglang
builds ``ServerArgs``, so the user reads one line that says what to do. Only the standard library
at import (torch is imported when the check runs), so ``doctor`` can use it too.
"""

from __future__ import annotations

from typing import Optional

NEEDS = "EAGLE3_DYNAMIC needs an NVIDIA GPU"
RUN_ON_A_GPU = (
    "run it on a machine with an NVIDIA GPU and its driver (nvidia-smi lists the GPUs; "
    "check CUDA_VISIBLE_DEVICES)"
)


def missing_nvidia_gpu(torch_module=None) -> Optional[str]:
    """None when torch sees an NVIDIA GPU; otherwise one line: what was found and what to do."""
    if torch_module is None:
        try:
            import torch as torch_module
        except ImportError:
            return f"{NEEDS}; torch is not installed: install sglang==0.5.17, which brings a CUDA build of torch."
    version = getattr(torch_module, "version", None)
    torch_version = getattr(torch_module, "__version__", "?")
    if getattr(version, "hip", None):
        return (f"{NEEDS}; torch {torch_version} is a ROCm build (AMD GPUs): use an NVIDIA GPU "
                "with a CUDA build of torch.")
    if getattr(version, "cuda", None) is None:
        return (f"{NEEDS}; torch {torch_version} is built without CUDA: install a CUDA build of "
                f"torch and {RUN_ON_A_GPU}.")
    cuda = torch_module.cuda
    if not cuda.is_available() or cuda.device_count() == 0:
        return f"{NEEDS}; found none (torch.cuda.is_available() is False): {RUN_ON_A_GPU}."
    return None
