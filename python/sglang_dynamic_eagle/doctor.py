"""`sglang-dynamic-eagle doctor`: can this machine run EAGLE3_DYNAMIC, and with which flags?

For every visible CUDA device: its compute capability and whether this package supports it;
which sgl_kernel build sglang loads for it and whether that shared object carries machine code
(SASS) for it, read from the CUDA fat binaries inside the file; what this package was run with
on that architecture; the flags to use there. Then flashinfer's JIT cache and the installed
versions of the packages that matter. Exit status: 0 every device is supported and has machine
code, 1 some device is not, 2 no NVIDIA GPU (or no torch): then the first line is the one the
launcher refuses EAGLE3_DYNAMIC with on such a machine (``gpu_check``).
"""

from __future__ import annotations

import importlib.util
import os
import struct
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from sglang_dynamic_eagle.sglang_compat.gpu_check import missing_nvidia_gpu

Capability = Tuple[int, int]

SUPPORTED: Dict[Capability, str] = {
    (9, 0): "SM90 Hopper (H100 / H200)",
    (12, 0): "SM120 Blackwell consumer / workstation (RTX 50xx, RTX PRO 6000)",
}
RUN_ON: Dict[Capability, str] = {
    (9, 0): "run on H200 and H100 with sglang's defaults (fa3 attention, prefill CUDA graphs), "
    "on H200 also with triton attention; flashinfer attention lossless, not benchmarked",
    (12, 0): "not run yet",
}
FLAGS: Dict[Capability, Tuple[str, ...]] = {
    (9, 0): (
        "none: sglang's own choices (fa3 attention, flashinfer sampling, prefill CUDA graphs) "
        "are the ones run",
    ),
    (12, 0): (
        "--attention-backend triton or flashinfer (FA3 is a Hopper kernel)",
        "--disable-custom-all-reduce with several GPUs on PCIe (no NVLink)",
    ),
}
PACKAGES = (
    "sglang", "sglang-kernel", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache",
    "triton", "torch", "sglang-dynamic-eagle",
)
FATBIN_MAGIC = 0xBA55ED50
_FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
_ENTRY_HEADER = struct.Struct("<HHII")  # kind, version, header size, padded payload size
_ENTRY_ARCH_WORD = 7  # the SM version, as 10 * major + minor, is the 8th 32-bit word
KIND_PTX, KIND_ELF = 1, 2


@dataclass
class FatbinArchitectures:
    sass: Set[int] = field(default_factory=set)  # machine code, e.g. 90 for sm_90
    ptx: Set[int] = field(default_factory=set)  # PTX the driver can compile at load

    def covers(self, capability: Capability) -> bool:
        return 10 * capability[0] + capability[1] in self.sass


def fatbin_architectures(data: bytes) -> FatbinArchitectures:
    """The SM versions of the machine code and PTX in every CUDA fat binary in ``data``."""
    found = FatbinArchitectures()
    magic = struct.pack("<I", FATBIN_MAGIC)
    start = data.find(magic)
    while start != -1 and start + _FATBIN_HEADER.size <= len(data):
        _, _, header_size, size = _FATBIN_HEADER.unpack_from(data, start)
        position, end = start + header_size, min(len(data), start + header_size + size)
        while position + 4 * (_ENTRY_ARCH_WORD + 1) <= end:
            kind, _, entry_header_size, payload_size = _ENTRY_HEADER.unpack_from(data, position)
            if kind not in (KIND_PTX, KIND_ELF) or entry_header_size == 0:
                break
            arch = struct.unpack_from("<I", data, position + 4 * _ENTRY_ARCH_WORD)[0]
            (found.sass if kind == KIND_ELF else found.ptx).add(arch)
            position += entry_header_size + payload_size
        start = data.find(magic, start + 1)
    return found


def sgl_kernel_build(capability: Capability) -> str:
    """The build sgl_kernel loads its common ops from (sgl_kernel/load_utils.py): ``sm90`` on
    capability 9.0, ``sm100`` on every other."""
    return "sm90" if capability == (9, 0) else "sm100"


def find_sgl_kernel() -> Optional[Path]:
    spec = importlib.util.find_spec("sgl_kernel")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def kernel_line(capability: Capability, package_dir: Optional[Path]) -> Tuple[bool, str]:
    """(machine code present, report line) for the sgl_kernel build of ``capability``."""
    if package_dir is None:
        return False, "sgl_kernel is not installed"
    library = package_dir / sgl_kernel_build(capability) / "common_ops.abi3.so"
    if not library.exists():
        return False, f"{library} is missing (sgl_kernel loads it on this GPU)"
    archs = fatbin_architectures(library.read_bytes())
    listed = ", ".join(f"sm_{a}" for a in sorted(archs.sass)) or "none"
    sm = f"sm_{capability[0]}{capability[1]}"
    verdict = "has machine code for" if archs.covers(capability) else "has NO machine code for"
    return archs.covers(capability), f"{library} {verdict} {sm} (machine code: {listed})"


def _cache_line(name: str, cache: Path, when_empty: str) -> str:
    files = [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []
    if not files:
        return f"{name} JIT cache: {cache} is empty; {when_empty}"
    size = sum(p.stat().st_size for p in files)
    return f"{name} JIT cache: {cache}, {len(files)} files, {size / 2**20:.0f} MiB"


def flashinfer_cache_line(home: Path) -> str:
    return _cache_line("flashinfer", home / ".cache" / "flashinfer",
                       "the first server start with flashinfer kernels compiles them (minutes)")


def triton_cache_line(home: Path, environ: Optional[Dict[str, str]] = None) -> str:
    """Where triton keeps compiled kernels (TRITON_CACHE_DIR, else TRITON_HOME's or the home
    folder's .triton/cache): the server compiles sglang's request-slot kernel for every power of
    two up to its request cap at start-up (engine/jit_warmup.py), and each start on an empty cache
    (a fresh container) compiles it again; keep the folder to load them instead."""
    environ = os.environ if environ is None else environ
    cache = Path(environ.get("TRITON_CACHE_DIR")
                 or Path(environ.get("TRITON_HOME") or home) / ".triton" / "cache")
    return _cache_line("triton", cache, "each server start compiles sglang's triton kernels "
                       "again (set TRITON_CACHE_DIR to a folder that persists)")


def package_versions(
    packages: Sequence[str] = PACKAGES, version: Callable[[str], str] = metadata.version
) -> Dict[str, Optional[str]]:
    found: Dict[str, Optional[str]] = {}
    for name in packages:
        try:
            found[name] = version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def device_report(
    torch_module, package_dir: Optional[Path]
) -> Tuple[int, List[str]]:
    """(exit status, report lines) for the CUDA devices ``torch_module`` sees."""
    missing = missing_nvidia_gpu(torch_module)
    if missing is not None:
        return 2, [missing]
    cuda = torch_module.cuda
    status, lines = 0, []
    for index in range(cuda.device_count()):
        capability = tuple(cuda.get_device_capability(index))
        arch = SUPPORTED.get(capability)
        lines.append(
            f"cuda:{index} {cuda.get_device_name(index)} compute capability "
            f"{capability[0]}.{capability[1]} -> "
            + (f"supported: {arch}" if arch else "NOT supported")
        )
        has_code, kernels = kernel_line(capability, package_dir)
        lines.append(f"  kernels: {kernels}")
        if arch is None or not has_code:
            status = 1
            continue
        lines.append(f"  EAGLE3_DYNAMIC on this architecture: {RUN_ON[capability]}")
        lines += [f"  flag: {flag}" for flag in FLAGS[capability]]
    if status:
        supported = ", ".join(f"{a}.{b}" for a, b in SUPPORTED)
        lines.append(f"supported compute capabilities: {supported}")
    return status, lines


def doctor(torch_module=None, package_dir: Optional[Path] = None, home: Optional[Path] = None,
           out=print) -> int:
    if torch_module is None:
        try:
            import torch as torch_module
        except ImportError:
            out(missing_nvidia_gpu(None))
            return 2
    status, lines = device_report(torch_module, package_dir or find_sgl_kernel())
    lines.append(flashinfer_cache_line(home or Path.home()))
    lines.append(triton_cache_line(home or Path.home()))
    lines.append("installed packages:")
    lines += [f"  {name}: {version or 'not installed'}" for name, version in package_versions().items()]
    for line in lines:
        out(line)
    return status
