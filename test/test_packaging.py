"""Package metadata: one version, the console script's --version, the licence, a short long
description."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import sglang_dynamic_eagle
from sglang_dynamic_eagle import cli

ROOT = Path(__file__).resolve().parents[1]
VERSION = sglang_dynamic_eagle.__version__


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_written_once_in_the_package() -> None:
    project = pyproject()
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "sglang_dynamic_eagle.__version__"}
    parts = VERSION.split(".")
    assert len(parts) == 3 and all(part.isdigit() for part in parts), VERSION


def test_the_installed_metadata_carries_that_version() -> None:
    """Fails after a version change until the package is installed again."""
    assert metadata.version("sglang-dynamic-eagle") == VERSION


def test_version_flag(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"sglang-dynamic-eagle {VERSION}\n"


def test_console_script_version() -> None:
    script = Path(sys.executable).with_name("sglang-dynamic-eagle")
    command = [str(script)] if script.exists() else [sys.executable, "-m",
                                                     "sglang_dynamic_eagle.doctor"]
    proc = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == f"sglang-dynamic-eagle {VERSION}\n"


def test_apache_licence() -> None:
    assert pyproject()["project"]["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) > 190


def test_the_long_description_is_short() -> None:
    """The wheel's long description is the readme pyproject names, not the repository's
    README (PyPI shows it whole; 5 KB at most)."""
    readme = ROOT / pyproject()["project"]["readme"]
    assert readme != ROOT / "README.md"
    assert 0 < len(readme.read_bytes()) < 5000
