"""The README's layout table names every module of the package and every top-level folder."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python" / "sglang_dynamic_eagle"


def layout_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Layout")
    return readme[start : readme.index("\n## ", start + 1)]


def test_every_module_is_in_the_layout_table() -> None:
    layout = layout_section()
    missing = [path.name for path in sorted(PACKAGE.glob("*.py"))
               if path.name != "__init__.py" and path.name not in layout]
    assert not missing


def test_every_tracked_top_level_folder_is_in_the_layout_table() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    folders = sorted({path.split("/")[0] for path in tracked if "/" in path}
                     - {".github", ".ci", "python"})
    layout = layout_section()
    assert [folder for folder in folders if f"`{folder}/" not in layout] == []
