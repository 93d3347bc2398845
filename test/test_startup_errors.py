"""Startup refusals reach the user as one line: the excepthook, and sglang's real launcher."""

from __future__ import annotations

import argparse
import os
import re
import site
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from sglang_dynamic_eagle import config
from sglang_dynamic_eagle.sglang_compat import first_contact, launcher
from sglang_dynamic_eagle.sglang_compat.gpu_check import NEEDS, missing_nvidia_gpu
from sglang_dynamic_eagle.sglang_compat.startup_errors import (
    StartupError,
    install_excepthook,
    one_line_excepthook,
)

# ``path:line: SomeWarning: message``, the first line the warnings module prints for a warning.
PYTHON_WARNING = re.compile(r"^\S+:\d+: \w*Warning: ")


def without_python_warnings(output: str) -> List[str]:
    """The lines of ``output`` that are not Python warnings (a warning's first line and the
    indented lines under it). sglang prints such warnings on a machine without CUDA (Triton,
    AWQ, GGUF) and for ``python -m sglang.launch_server`` itself, the first five lines before
    any plugin code runs; they are sglang's, not this package's."""
    kept: List[str] = []
    in_warning = False
    for line in output.splitlines():
        if PYTHON_WARNING.match(line):
            in_warning = True
        elif not (in_warning and line.startswith("  ")):
            in_warning = False
            kept.append(line)
    return kept


def launch(*argv: str, command=(sys.executable, "-m", "sglang.launch_server")) -> subprocess.CompletedProcess:
    """sglang's real launcher (no --device unless given: sglang would look for an accelerator)."""
    env = {key: value for key, value in os.environ.items() if key != config.ENV_VAR}
    return subprocess.run(
        [*command, "--model-path", "some/model", *argv],
        capture_output=True, text=True, timeout=300, env=env,
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


def test_output_without_python_warnings_drops_each_warning_and_its_indented_lines() -> None:
    output = ("/x/utils.py:223: UserWarning: Triton is not supported.\n  warnings.warn(\n"
              "/x/launch_server.py:56: UserWarning: still supported\n  Example: serve\n"
              "  warnings.warn(\nCannot detect CUDA architecture.\nerror: one line\n")
    assert without_python_warnings(output) == ["Cannot detect CUDA architecture.", "error: one line"]


no_gpu_here = pytest.mark.skipif(
    missing_nvidia_gpu() is None, reason="this machine has an NVIDIA GPU: the launcher goes on")


first_contact_installed = pytest.mark.skipif(
    not any((Path(d) / first_contact.PTH_FILE).exists() for d in site.getsitepackages()),
    reason="the first-contact line is not in site-packages (an editable install); CI installs the wheel")


@first_contact_installed
@pytest.mark.parametrize("command", [[sys.executable, "-m", "sglang.launch_server"],
                                     [str(Path(sys.executable).parent / "sglang"), "serve"]],
                         ids=["python -m sglang.launch_server", "sglang serve"])
@no_gpu_here
def test_first_contact_without_a_gpu_is_one_line(command) -> None:
    """The command a user types first, on a machine without a GPU: one line, no traceback, and
    none of sglang's import-time warnings (before: 12 lines, 11 of them sglang's; earlier: 48,
    two chained tracebacks). The first-contact line (``first_contact``) exits before sglang
    imports anything."""
    proc = launch("--speculative-algorithm", "EAGLE3_DYNAMIC", command=command)
    lines = (proc.stderr + proc.stdout).splitlines()
    assert proc.returncode == 1
    assert len(lines) <= 3, lines
    assert lines[-1].startswith(f"error: {NEEDS}; found none"), lines


@no_gpu_here
def test_this_package_refuses_before_sglang_resolves_the_device() -> None:
    """Past the first-contact line (``--device cuda`` where a driver loads, here ``cpu``): this
    package's own refusal in one line, before sglang's device resolution could print its
    tracebacks."""
    proc = launch("--speculative-algorithm", "EAGLE3_DYNAMIC", "--device", "cpu")
    lines = without_python_warnings(proc.stderr + proc.stdout)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert len(lines) <= 3 and "requires --speculative-draft-model-path" in lines[-1], lines


def test_the_gpu_check_names_what_it_found_and_what_to_do() -> None:
    class Cuda:
        def __init__(self, count):
            self.count = count

        def is_available(self):
            return self.count > 0

        def device_count(self):
            return self.count

    def torch(cuda="13.0", hip=None, gpus=0):
        return argparse.Namespace(__version__="2.11.0", version=argparse.Namespace(cuda=cuda, hip=hip),
                                  cuda=Cuda(gpus))

    assert missing_nvidia_gpu(torch(gpus=1)) is None
    assert missing_nvidia_gpu(torch()).startswith(NEEDS + "; found none")
    assert "CUDA_VISIBLE_DEVICES" in missing_nvidia_gpu(torch())
    assert "built without CUDA" in missing_nvidia_gpu(torch(cuda=None))
    assert "ROCm build" in missing_nvidia_gpu(torch(hip="7.0", gpus=1))


@pytest.mark.usefixtures("clean_flags_env")
def test_only_a_command_line_that_selects_the_algorithm_gets_the_excepthook(
    monkeypatch, capsys
) -> None:
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    parser = argparse.ArgumentParser()
    parser.add_argument("--speculative-algorithm", default=None)
    parser.add_argument("--speculative-draft-model-path", default=None)
    parser.add_argument("--device", default=None)
    launcher.add_cli_args(parser)
    for argv in ([], ["--speculative-algorithm", "EAGLE3"]):
        launcher.around_from_cli_args(lambda cls, args: None, object, parser.parse_args(argv))
        assert sys.excepthook is sys.__excepthook__, argv
    launcher.around_from_cli_args(lambda cls, args: None, object, parser.parse_args(
        ["--speculative-algorithm", "EAGLE3_DYNAMIC", "--speculative-draft-model-path", "d",
         "--device", "cpu"]))
    # Other libraries may wrap it in turn (nvidia-cutlass-dsl's hook, imported with sglang's
    # models, calls the one it found): what counts is what the interpreter prints.
    capsys.readouterr()
    sys.excepthook(StartupError, StartupError("--flag is bad; use --flag 1."), None)
    assert capsys.readouterr().err == "error: --flag is bad; use --flag 1.\n"


def test_a_server_without_the_algorithm_keeps_python_s_tracebacks(tiny_models) -> None:
    """sglang loads every installed plugin in every server; one that does not select
    EAGLE3_DYNAMIC prints its errors as without this package."""
    code = (
        "from sglang.srt.plugins import load_plugins\n"
        "load_plugins()\n"
        "from sglang.srt.server_args import prepare_server_args\n"
        f"prepare_server_args(['--model-path', {tiny_models.llama!r}, '--device', 'cpu'])\n"
        "from sglang_dynamic_eagle.sglang_compat.startup_errors import StartupError\n"
        "raise StartupError('a plain server')\n"
    )
    env = {key: value for key, value in os.environ.items() if key != config.ENV_VAR}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "StartupError: a plain server" in proc.stderr
    assert "error: a plain server" not in proc.stderr
