"""The README is for users: short, install and test first, one line per status row, no lab
notes; every link resolves; docs/architecture.md names every module; the results index lists
every results folder."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

from sglang_dynamic_eagle import config

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python" / "sglang_dynamic_eagle"
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
RESULTS = ROOT / "benchmark" / "results"
TEST_COMMAND = "python -m pytest -q"  # .ci/run greps for exactly this line
# Markdown files whose relative links must resolve.
LINKED_DOCS = [README, ARCHITECTURE, ROOT / "docs" / "results.md", ROOT / "docs" / "pypi.md",
               RESULTS / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
CLOCK_TIME = re.compile(r"\b\d{1,2}:\d{2}\b")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def readme() -> str:
    return README.read_text()


def sections(text: str) -> Dict[str, str]:
    """``## Title`` -> the section's text (up to the next ``## ``)."""
    found: Dict[str, str] = {}
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        title, _, body = part.partition("\n")
        found[title.strip()] = body
    return found


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> List[str]:
    return [slug(line.lstrip("#")) for line in path.read_text().splitlines()
            if line.startswith("#")]


def test_the_readme_is_short() -> None:
    assert len(readme().splitlines()) < 200


def test_install_and_test_commands_come_first() -> None:
    head = readme().splitlines()[:40]
    assert TEST_COMMAND in head, "the test command on a line of its own, within 40 lines"
    assert any(line.strip().startswith("pip install") for line in head)


def test_the_sections_users_look_for() -> None:
    found = sections(readme())
    for title in ("Requirements", "Install", "Quickstart", "Flags", "How it decides", "Status",
                  "Tests", "Layout"):
        assert found.get(title, "").strip(), f"## {title} is missing or empty"


def test_every_flag_and_environment_variable_is_documented() -> None:
    flag_section = sections(readme())["Flags"]
    for spec in config.FLAG_SPECS:
        assert f"`{spec.flag}" in flag_section, spec.flag
    variables = set()
    for path in PACKAGE.rglob("*.py"):
        variables |= set(re.findall(r"SGLANG_DYNAMIC_EAGLE_[A-Z_]+", path.read_text()))
    assert sorted(name for name in variables if f"`{name}`" not in flag_section) == []


def test_status_rows_are_one_short_line_each() -> None:
    status = sections(readme())["Status"]
    rows = [line for line in status.splitlines() if line.startswith("| ")][2:]
    assert len(rows) >= 10
    long_rows = [row for row in rows if len(row) > 300]
    assert long_rows == []
    not_run = " ".join(row for row in rows if "not yet run" in row)
    for part in ("prefill CUDA graphs", "Tensor parallelism", "Real model weights"):
        assert part in not_run, part


def test_no_lab_notes_in_the_readme() -> None:
    text = readme()
    assert COMMIT.findall(text) == [], "commit hashes belong in docs/results.md"
    assert CLOCK_TIME.findall(text) == [], "clock times belong in docs/results.md"
    assert DATE.findall(text) == [], "dated notes belong in docs/results.md"


def test_the_lab_note_checks_can_fail() -> None:
    assert COMMIT.findall("at commit 4230bd2, 1024 tokens") == ["4230bd2"]
    assert CLOCK_TIME.findall("run at 23:03 UTC") == ["23:03"]
    assert DATE.findall("on 2026-12-01") == ["2026-12-01"]


@pytest.mark.parametrize("document", LINKED_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document: Path) -> None:
    broken = []
    for target in LINK.findall(document.read_text()):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path_part, _, anchor = target.partition("#")
        path = (document.parent / path_part).resolve() if path_part else document
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(target)
    assert broken == []


def test_architecture_names_every_module() -> None:
    text = ARCHITECTURE.read_text()
    modules = sorted(path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
                     if "__pycache__" not in path.parts and not (
                         path.name == "__init__.py" and path.parent != PACKAGE))
    assert [module for module in modules if f"`{module}`" not in text] == []


def test_every_tracked_top_level_folder_is_in_the_layout_table() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    folders = sorted({path.split("/")[0] for path in tracked if "/" in path}
                     - {".github", ".ci"})
    layout = sections(readme())["Layout"]
    assert [folder for folder in folders if f"`{folder}/" not in layout] == []


def test_the_results_index_lists_every_results_folder() -> None:
    index = (RESULTS / "README.md").read_text()
    folders = sorted(path.name for path in RESULTS.iterdir() if path.is_dir())
    assert folders and [name for name in folders if f"]({name}/README.md)" not in index] == []
