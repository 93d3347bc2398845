"""`sglang-dynamic-eagle doctor` with a stand-in torch and synthetic sgl_kernel builds (no GPU)."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import List, Sequence, Tuple

import pytest

from sglang_dynamic_eagle import doctor
from sglang_dynamic_eagle.sglang_compat.gpu_check import NEEDS, missing_nvidia_gpu


def _fake_torch(*capabilities):
    devices = [(f"GPU {i}", cap) for i, cap in enumerate(capabilities)]
    cuda = SimpleNamespace(
        is_available=lambda: bool(devices),
        device_count=lambda: len(devices),
        get_device_capability=lambda i: devices[i][1],
        get_device_name=lambda i: devices[i][0],
    )
    return SimpleNamespace(cuda=cuda, __version__="2.11.0+cu130",
                           version=SimpleNamespace(cuda="13.0", hip=None))


def fatbin(entries: Sequence[Tuple[int, int]], payload: bytes = b"\0" * 16) -> bytes:
    """A CUDA fat binary with one entry per (kind, SM version), in the layout nvcc writes."""
    body = b""
    for kind, arch in entries:
        words = [0] * 16
        words[_ARCH_WORD] = arch
        # kind, version, header size, payload size fill the first 12 bytes (words 0-2)
        header = struct.pack("<HHII", kind, 0x101, 64, len(payload)) + struct.pack(
            "<13I", *words[3:16])
        body += header + payload
    return struct.pack("<IHHQ", doctor.FATBIN_MAGIC, 1, 16, len(body)) + body


_ARCH_WORD = doctor._ENTRY_ARCH_WORD


def kernel_package(tmp_path: Path, builds: dict) -> Path:
    """An sgl_kernel folder whose builds hold fat binaries with the given SM versions."""
    for build, archs in builds.items():
        (tmp_path / build).mkdir(parents=True)
        blob = b"ELF and other sections" + fatbin([(doctor.KIND_ELF, a) for a in archs])
        blob += b"padding" + fatbin([(doctor.KIND_PTX, max(archs))])
        (tmp_path / build / "common_ops.abi3.so").write_bytes(blob)
    return tmp_path


def test_fatbin_architectures_reads_machine_code_and_ptx() -> None:
    data = b"xx" + fatbin([(2, 80), (2, 90), (2, 90), (1, 90), (2, 120)]) + b"yy" + fatbin([(2, 100)])
    found = doctor.fatbin_architectures(data)
    assert found.sass == {80, 90, 100, 120} and found.ptx == {90}
    assert found.covers((9, 0)) and found.covers((12, 0)) and not found.covers((8, 9))
    assert doctor.fatbin_architectures(b"no fat binary here").sass == set()


def test_fatbin_parser_on_the_installed_sgl_kernel() -> None:
    package = doctor.find_sgl_kernel()
    if package is None or not (package / "sm90" / "common_ops.abi3.so").exists():
        pytest.skip("sgl_kernel's sm90 build is not installed")
    found = doctor.fatbin_architectures((package / "sm90" / "common_ops.abi3.so").read_bytes())
    assert found.covers((9, 0))


def test_the_build_sgl_kernel_loads() -> None:
    assert doctor.sgl_kernel_build((9, 0)) == "sm90"
    assert doctor.sgl_kernel_build((12, 0)) == "sm100"
    assert doctor.sgl_kernel_build((10, 0)) == "sm100"


def run(capabilities: List[Tuple[int, int]], package: Path, home: Path) -> Tuple[int, str]:
    lines: List[str] = []
    status = doctor.doctor(_fake_torch(*capabilities), package, home, out=lines.append)
    return status, "\n".join(lines)


@pytest.mark.parametrize(
    ("capabilities", "status"),
    [([(9, 0)], 0), ([(12, 0)], 0), ([(9, 0), (9, 0)], 0), ([(8, 0)], 1), ([(10, 0)], 1),
     ([(9, 0), (8, 9)], 1), ([], 2)],
)
def test_exit_status(tmp_path: Path, capabilities, status) -> None:
    package = kernel_package(tmp_path / "sgl_kernel", {"sm90": [80, 90], "sm100": [100, 120]})
    code, out = run(capabilities, package, tmp_path)
    assert code == status
    assert "installed packages:" in out and "flashinfer JIT cache:" in out
    for index, (major, minor) in enumerate(capabilities):
        assert f"cuda:{index} GPU {index} compute capability {major}.{minor}" in out


def test_supported_device_gets_what_was_run_and_its_flags(tmp_path: Path) -> None:
    package = kernel_package(tmp_path / "sgl_kernel", {"sm90": [90], "sm100": [120]})
    _, out = run([(12, 0)], package, tmp_path)
    assert "sm100/common_ops.abi3.so has machine code for sm_120" in out
    assert "not run yet" in out and "--disable-custom-all-reduce" in out and "FA3" in out
    _, out = run([(9, 0)], package, tmp_path)
    assert "sm90/common_ops.abi3.so has machine code for sm_90" in out
    assert "sglang's own choices (fa3 attention" in out and "--attention-backend triton" not in out


def test_missing_machine_code_fails_a_supported_device(tmp_path: Path) -> None:
    package = kernel_package(tmp_path / "sgl_kernel", {"sm90": [90], "sm100": [100]})
    code, out = run([(12, 0)], package, tmp_path)
    assert code == 1
    assert "has NO machine code for sm_120 (machine code: sm_100)" in out


def test_missing_build_or_package(tmp_path: Path) -> None:
    package = kernel_package(tmp_path / "sgl_kernel", {"sm90": [90]})
    code, out = run([(12, 0)], package, tmp_path)
    assert code == 1 and "sm100/common_ops.abi3.so is missing" in out
    assert doctor.kernel_line((9, 0), None) == (False, "sgl_kernel is not installed")


def test_flashinfer_cache(tmp_path: Path) -> None:
    assert "is empty" in doctor.flashinfer_cache_line(tmp_path)
    cache = tmp_path / ".cache" / "flashinfer" / "90"
    cache.mkdir(parents=True)
    (cache / "norm.so").write_bytes(b"\0" * 2**20)
    assert doctor.flashinfer_cache_line(tmp_path).endswith("1 files, 1 MiB")


def test_package_versions_marks_missing() -> None:
    def version(name):
        if name == "torch":
            return "2.11.0"
        raise doctor.metadata.PackageNotFoundError(name)

    found = doctor.package_versions(("torch", "flashinfer-python"), version=version)
    assert found == {"torch": "2.11.0", "flashinfer-python": None}


def test_a_machine_without_an_nvidia_gpu_gets_the_launcher_s_line(tmp_path: Path) -> None:
    code, out = run([], tmp_path, tmp_path)
    assert code == 2 and out.splitlines()[0].startswith(NEEDS + "; found none")
    rocm = _fake_torch((9, 0))
    rocm.version.hip = "7.0"
    lines: List[str] = []
    assert doctor.doctor(rocm, tmp_path, tmp_path, out=lines.append) == 2
    assert "ROCm build" in lines[0]


@pytest.mark.skipif(missing_nvidia_gpu() is None, reason="this machine has an NVIDIA GPU")
def test_console_script_runs_without_a_gpu() -> None:
    proc = subprocess.run([sys.executable, "-m", "sglang_dynamic_eagle.cli", "doctor"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    first = proc.stdout.splitlines()[0]
    # The line the launcher refuses EAGLE3_DYNAMIC with on this machine (test_startup_errors).
    assert first == missing_nvidia_gpu() and first.startswith(NEEDS + "; ")
    assert "installed packages:" in proc.stdout


def test_triton_cache_line_reads_triton_cache_dir_first(tmp_path) -> None:
    """Empty (or absent) it says that every start compiles again and how to keep the folder;
    with files it counts them; TRITON_CACHE_DIR wins over TRITON_HOME, which wins over home."""
    assert "is empty" in doctor.triton_cache_line(tmp_path, environ={})
    assert "TRITON_CACHE_DIR" in doctor.triton_cache_line(tmp_path, environ={})
    default = tmp_path / ".triton" / "cache" / "ABC"
    default.mkdir(parents=True)
    (default / "assign_req_to_token_pool.cubin").write_bytes(b"\0" * 2**20)
    assert doctor.triton_cache_line(tmp_path, environ={}).endswith("1 files, 1 MiB")
    elsewhere = tmp_path / "kept"
    elsewhere.mkdir()
    assert f"{elsewhere} is empty" in doctor.triton_cache_line(tmp_path, environ={"TRITON_CACHE_DIR": str(elsewhere)})
    home = tmp_path / "triton-home"
    assert f"{home / '.triton' / 'cache'} is empty" in doctor.triton_cache_line(
        tmp_path, environ={"TRITON_HOME": str(home)})
