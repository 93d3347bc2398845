"""sgl-kernel/check_arch.py with a stand-in torch (no GPU needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "sgl-kernel" / "check_arch.py"


@pytest.fixture(scope="module")
def check_arch():
    spec = importlib.util.spec_from_file_location("check_arch", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_torch(*capabilities):
    devices = [(f"GPU {i}", cap) for i, cap in enumerate(capabilities)]
    cuda = SimpleNamespace(
        is_available=lambda: bool(devices),
        device_count=lambda: len(devices),
        get_device_capability=lambda i: devices[i][1],
        get_device_name=lambda i: devices[i][0],
    )
    return SimpleNamespace(cuda=cuda)


@pytest.mark.parametrize(
    "capabilities, status",
    [
        ([(9, 0)], 0),
        ([(12, 0)], 0),
        ([(9, 0), (9, 0)], 0),
        ([(8, 0)], 1),
        ([(10, 0)], 1),
        ([(9, 0), (8, 9)], 1),
        ([], 2),
    ],
)
def test_exit_status(check_arch, capabilities, status, capsys):
    assert check_arch.main([], torch_module=_fake_torch(*capabilities)) == status
    out = capsys.readouterr().out
    assert "installed packages:" in out
    assert "sglang-kernel" in out and "flashinfer-python" in out
    for index, (major, minor) in enumerate(capabilities):
        assert f"cuda:{index} GPU {index} compute capability {major}.{minor}" in out


def test_unsupported_device_is_named(check_arch, capsys):
    check_arch.main([], torch_module=_fake_torch((9, 0), (8, 0)))
    out = capsys.readouterr().out
    assert "cuda:0 GPU 0 compute capability 9.0 -> supported" in out
    assert "cuda:1 GPU 1 compute capability 8.0 -> NOT supported" in out


def test_package_versions_marks_missing(check_arch):
    def version(name):
        if name == "torch":
            return "2.11.0"
        raise check_arch.metadata.PackageNotFoundError(name)

    found = check_arch.package_versions(("torch", "flashinfer-python"), version=version)
    assert found == {"torch": "2.11.0", "flashinfer-python": None}
