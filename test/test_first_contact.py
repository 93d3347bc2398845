"""The first-contact line: a command line that starts EAGLE3_DYNAMIC on a machine with no
NVIDIA GPU exits with one line before sglang imports anything; every other process is left
alone."""

from __future__ import annotations

import io
from pathlib import Path
from typing import List

import pytest

import sglang_dynamic_eagle
from sglang_dynamic_eagle.sglang_compat.first_contact import (PTH_FILE, certainly_no_gpu, check,
                                                              launches_sglang, selects_algorithm)
from sglang_dynamic_eagle.sglang_compat.gpu_check import NEEDS

REPO = Path(__file__).resolve().parents[1]
ALGO = ["--speculative-algorithm", "EAGLE3_DYNAMIC"]


@pytest.mark.parametrize("argv, selected", [
    (["sglang", "serve", *ALGO], True),
    (["-m", "--speculative-algorithm=EAGLE3_DYNAMIC"], True),
    (["-m", "--speculative-algorithm", "eagle3_dynamic"], True),
    (["-m", *ALGO, "--device", "cuda:1"], True),
    (["-m", *ALGO, "--device", "cpu"], False),  # an explicit other device is left to sglang
    (["-m", *ALGO, "--device=npu"], False),
    (["-m", "--speculative-algorithm", "EAGLE3"], False),
    (["-m", "--speculative-algorithm", "EAGLE3", "--served-model-name", "EAGLE3_DYNAMIC"], False),
    (["-m", "--speculative-algorithm"], False),
    (["pytest", "-k", "EAGLE3_DYNAMIC"], False),
])
def test_which_command_lines_start_the_algorithm_on_cuda(argv, selected) -> None:
    assert selects_algorithm(argv) is selected


def test_the_algorithm_name_is_the_packages() -> None:
    """first_contact spells the name out (it runs at interpreter start, before the policy package)."""
    from sglang_dynamic_eagle.policy import ALGORITHM_NAME
    from sglang_dynamic_eagle.sglang_compat.first_contact import ALGORITHM

    assert ALGORITHM == ALGORITHM_NAME


def test_no_gpu_only_when_certain() -> None:
    assert "libcuda.so.1 does not load" in certainly_no_gpu({}, lambda: False)
    assert "hides every GPU" in certainly_no_gpu({"CUDA_VISIBLE_DEVICES": ""}, lambda: True)
    assert "hides every GPU" in certainly_no_gpu({"CUDA_VISIBLE_DEVICES": "-1"}, lambda: True)
    assert certainly_no_gpu({"CUDA_VISIBLE_DEVICES": "0,1"}, lambda: True) is None
    assert certainly_no_gpu({}, lambda: True) is None  # a driver: torch decides, later


@pytest.mark.parametrize("argv, orig_argv, launcher", [
    (["/venv/bin/sglang", "serve"], ["/venv/bin/python", "/venv/bin/sglang", "serve"], True),
    (["-m", "--model-path", "m"], ["python", "-m", "sglang.launch_server", "--model-path", "m"], True),
    (["-m", "--x"], ["python", "-X", "dev", "-m", "sglang.launch_server", "--x"], True),
    (["-m", "--x"], ["python", "-m", "other.tool", "--x"], False),
    (["fake_server.py", "--x"], ["python", "fake_server.py", "--x"], False),  # the benchmark tests' fake
    (["-c", "--x"], ["python", "-c", "...", "--x"], False),
])
def test_only_sglangs_launcher_is_checked(argv, orig_argv, launcher) -> None:
    assert launches_sglang(argv, orig_argv) is launcher


def run_check(argv, driver: bool, environ=None) -> List:
    exits: List[int] = []
    err = io.StringIO()
    check(argv, environ or {}, lambda: driver, stderr=err, exit_fn=exits.append,
          orig_argv=["python", *argv])
    return [exits, err.getvalue()]


def test_check_exits_with_one_line_only_without_a_gpu() -> None:
    exits, err = run_check(["sglang", "serve", *ALGO], driver=False)
    assert exits == [1]
    assert err.count("\n") == 1 and err.startswith(f"error: {NEEDS}; found none")
    assert run_check(["sglang", "serve", *ALGO], driver=True) == [[], ""]
    assert run_check(["sglang", "serve", "--speculative-algorithm", "EAGLE3"], driver=False) == [[], ""]
    assert run_check(["fake_server.py", *ALGO], driver=False) == [[], ""]


def test_the_pth_line_guards_cheaply_and_calls_check() -> None:
    """Python runs a .pth line that starts with ``import``; its guard (a substring) must let
    through every command line ``selects_algorithm`` accepts, and the rest must call ``check``."""
    line = (REPO / "python" / PTH_FILE).read_text()
    assert line.count("\n") == 1 and line.startswith("import sys;")
    calls = []
    namespace = {"__import__": lambda name, fromlist: type("M", (), {"check": staticmethod(calls.append)})}
    for argv in (["-m", "--speculative-algorithm=eagle3_dynamic"], ["sglang", "serve", *ALGO],
                 ["python", "-c", "pass"]):
        exec(line.replace("import sys;", "", 1).strip(), {"sys": type("S", (), {"argv": argv}), **namespace})
    assert calls == [["-m", "--speculative-algorithm=eagle3_dynamic"], ["sglang", "serve", *ALGO]]


PACKAGE_ROOT = Path(sglang_dynamic_eagle.__file__).resolve().parents[1]  # site-packages when installed


@pytest.mark.skipif(not list(PACKAGE_ROOT.glob("sglang_dynamic_eagle-*.dist-info")),
                    reason="imported from a source tree (an editable install carries no .pth of ours)")
def test_the_installed_package_carries_the_line() -> None:
    """Installed from the wheel (as CI installs it): the line sits beside the package, at the
    root of site-packages, and the wheel's RECORD lists it."""
    record = next(PACKAGE_ROOT.glob("sglang_dynamic_eagle-*.dist-info")) / "RECORD"
    assert any(line.split(",")[0] == PTH_FILE for line in record.read_text().splitlines())
    assert (PACKAGE_ROOT / PTH_FILE).read_text() == (REPO / "python" / PTH_FILE).read_text()


def test_the_sdist_carries_the_line() -> None:
    """setup.py copies the line from the source tree: an sdist built without it cannot build its
    wheel (MANIFEST.in names it)."""
    manifest = (REPO / "MANIFEST.in").read_text().splitlines()
    assert f"include python/{PTH_FILE}" in manifest
