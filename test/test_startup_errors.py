"""Startup refusals reach the user as one line: the excepthook, and sglang's real launcher."""

from __future__ import annotations

import subprocess
import sys
from typing import List

import pytest

from sglang_dynamic_eagle.deferred_draft_prefill import DEFER_ENV
from sglang_dynamic_eagle.startup_errors import (
    StartupError,
    install_excepthook,
    one_line_excepthook,
)


def test_a_startup_error_prints_one_line_and_others_go_to_the_previous_hook(capsys) -> None:
    seen: List[type] = []
    hook = one_line_excepthook(lambda exc_type, exc, tb: seen.append(exc_type))
    hook(StartupError, StartupError("--flag is bad; use --flag 1."), None)
    hook(KeyError, KeyError("x"), None)
    assert capsys.readouterr().err == "error: --flag is bad; use --flag 1.\n"
    assert seen == [KeyError]


def test_installing_twice_wraps_once(monkeypatch) -> None:
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    install_excepthook()
    first = sys.excepthook
    install_excepthook()
    assert sys.excepthook is first and first.prints_startup_errors


def test_startup_errors_are_value_errors() -> None:
    assert issubclass(StartupError, ValueError)


@pytest.mark.usefixtures("clean_flags_env")
@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--speculative-num-steps", "0"], "--speculative-num-steps 0"),
        (["--speculative-switch-patience", "0"], "--speculative-switch-patience must be"),
    ],
    ids=["refused combination", "bad flag value"],
)
def test_the_launcher_prints_a_refusal_in_one_line(tiny_models, argv, needle) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", tiny_models.llama,
         "--device", "cpu", "--speculative-algorithm", "EAGLE3_DYNAMIC",
         "--speculative-draft-model-path", tiny_models.draft, *argv],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "usage:" not in proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and needle in error_lines[0]


@pytest.mark.usefixtures("clean_flags_env")
def test_the_launcher_refuses_a_bad_deferred_prefill_window_in_one_line(
    tiny_models, monkeypatch
) -> None:
    monkeypatch.setenv(DEFER_ENV, "300")
    proc = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", tiny_models.llama,
         "--device", "cpu", "--speculative-algorithm", "EAGLE3_DYNAMIC",
         "--speculative-draft-model-path", tiny_models.draft],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 1
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1 and f"{DEFER_ENV}='300' is invalid" in error_lines[0]
