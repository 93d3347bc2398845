"""tools/gc_probe: the probe's lines from a real process, and the runs they fall in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "gc_probe"))

import gc_runs  # noqa: E402


def test_the_probe_records_a_full_collection_of_a_process_that_runs_with_it(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tools" / "gc_probe"), "GCPROBE_DIR": str(tmp_path)}
    code = "import gc; gc.collect(2); gc.collect(0)"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    lines = [line.split() for path in tmp_path.glob("gc-*.txt") for line in path.read_text().splitlines()]
    full = [line for line in lines if line[2] == "2"]
    assert full and int(full[0][5]) >= 0  # generation 2 with its tracked objects
    assert all(line[2] == "2" or float(line[3]) > 2.0 for line in lines)  # fast young ones left out
    # without GCPROBE_DIR nothing is written
    subprocess.run([sys.executable, "-c", code], env={**env, "GCPROBE_DIR": ""}, check=True)
    assert len(list(tmp_path.glob("gc-*.txt"))) == 1


def test_the_probe_keeps_the_sitecustomize_it_hides(tmp_path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(
        "import os\nopen(os.environ['MARK'], 'w').write('imported')\n")
    mark = tmp_path / "mark"
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'tools' / 'gc_probe'}{os.pathsep}{other}",
           "GCPROBE_DIR": str(tmp_path / "gc"), "MARK": str(mark)}
    subprocess.run([sys.executable, "-c", "import gc; gc.collect(2)"], env=env, check=True)
    assert mark.read_text() == "imported"
    assert list((tmp_path / "gc").glob("gc-*.txt"))  # and the probe still ran


def test_collections_are_placed_in_the_runs_they_ended_in(tmp_path) -> None:
    (tmp_path / "gc-7.txt").write_text(
        "100.5 7 1 3.00 0 -1 0 x\n"      # in plain's run
        "101.0 7 0 1.00 0 -1 0 x\n"      # under --min-ms
        "150.0 7 2 400.00 5 9000 0 x\n"  # between runs
        "201.0 7 2 60.00 5 9000 0 x\n"   # in dynamic's run
        "202.0 7 2 1.00 0 9000 0 x\n")   # a full one, listed under --min-ms too
    document = {"runs": [
        {"config": "plain", "workload": "w", "round": 0, "started_at": 100.0, "ended_at": 120.0},
        {"config": "dynamic", "workload": "w", "round": 0, "started_at": 200.0, "ended_at": 220.0},
        {"config": "dynamic", "workload": "w", "round": 1, "started_at": None, "ended_at": None}]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(document))
    text = gc_runs.report(json.loads(path.read_text()), gc_runs.read_probe(tmp_path), 2.0)
    assert "plain w round 0: pid 7 gen 1 3.0 ms at +0.5 s\n" in text
    assert "dynamic w round 0: pid 7 gen 2 60.0 ms at +1.0 s; pid 7 gen 2 1.0 ms at +2.0 s\n" in text
    assert "outside the runs: 1 (longest 400 ms)" in text
