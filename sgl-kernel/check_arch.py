#!/usr/bin/env python3
"""Check that this machine's GPUs are an architecture sglang-dynamic-eagle supports.

Prints, for every visible CUDA device, its name and compute capability and whether it is
in the supported set, then the installed versions of the kernel packages. Exit status:
0 every device supported, 1 some device unsupported, 2 no CUDA device (or no torch).

    python sgl-kernel/check_arch.py
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import Callable, Dict, List, Optional, Tuple

# compute capability -> what it is
SUPPORTED: Dict[Tuple[int, int], str] = {
    (9, 0): "SM90 Hopper (H100 / H200)",
    (12, 0): "SM120 Blackwell consumer / workstation (RTX 50xx, RTX PRO 6000)",
}

PACKAGES = (
    "sglang",
    "sglang-kernel",
    "sgl-kernel",  # older distribution name of sglang-kernel
    "flashinfer-python",
    "flashinfer-cubin",
    "flashinfer-jit-cache",
    "triton",
    "torch",
    "sglang-dynamic-eagle",
)


def package_versions(
    packages=PACKAGES, version: Callable[[str], str] = metadata.version
) -> Dict[str, Optional[str]]:
    """Installed version of each package, None when it is not installed."""
    found: Dict[str, Optional[str]] = {}
    for name in packages:
        try:
            found[name] = version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def check_devices(torch_module) -> Tuple[int, List[str]]:
    """(exit status, report lines) for the CUDA devices ``torch_module`` sees."""
    lines: List[str] = []
    if not torch_module.cuda.is_available() or torch_module.cuda.device_count() == 0:
        lines.append("no CUDA device visible (torch.cuda.is_available() is False)")
        return 2, lines
    status = 0
    for index in range(torch_module.cuda.device_count()):
        capability = tuple(torch_module.cuda.get_device_capability(index))
        name = torch_module.cuda.get_device_name(index)
        arch = SUPPORTED.get(capability)
        verdict = f"supported: {arch}" if arch else "NOT supported"
        lines.append(
            f"cuda:{index} {name} compute capability {capability[0]}.{capability[1]} -> {verdict}"
        )
        if arch is None:
            status = 1
    if status:
        supported = ", ".join(f"{a}.{b}" for a, b in SUPPORTED)
        lines.append(f"supported compute capabilities: {supported}")
    return status, lines


def main(argv=None, torch_module=None) -> int:
    if torch_module is None:
        try:
            import torch as torch_module
        except ImportError:
            print("torch is not installed")
            return 2
    status, lines = check_devices(torch_module)
    for line in lines:
        print(line)
    print("installed packages:")
    for name, version in package_versions().items():
        print(f"  {name}: {version if version else 'not installed'}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
