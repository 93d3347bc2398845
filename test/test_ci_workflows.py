"""The CI workflows parse and run the commands the README documents."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"


def load(name: str) -> dict:
    workflow = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True.
    workflow["on"] = workflow.get("on", workflow.pop(True, None))
    return workflow


def run_lines(job: dict) -> list[str]:
    return [line.strip() for step in job["steps"] for line in step.get("run", "").splitlines()]


def test_cpu_workflow_runs_the_ci_script_on_every_push() -> None:
    workflow = load("cpu-tests.yml")
    assert {"push", "pull_request"} <= set(workflow["on"])
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    assert "bash .ci/run" in run_lines(job)


def test_gpu_workflow_runs_both_suites_on_a_labelled_self_hosted_runner() -> None:
    workflow = load("gpu-tests.yml")
    assert "workflow_dispatch" in workflow["on"]
    (job,) = workflow["jobs"].values()
    assert {"self-hosted", "gpu"} <= set(job["runs-on"])
    lines = run_lines(job)
    pytest_line = next(line for line in lines if "pytest" in line)
    assert "python3 -m pytest -m gpu" in pytest_line and "test/gpu" in pytest_line
    assert any("test/gpu/native_ops_plugin" in line for line in lines)
    uploads = [step for step in job["steps"] if step.get("uses", "").startswith("actions/upload-artifact")]
    assert uploads and uploads[0]["if"] == "always()"


def test_readme_documents_both_workflows_and_their_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "python -m pytest -q" in readme and "bash .ci/run" in readme
    assert "python -m pytest -m gpu test/gpu" in readme
    assert ".github/workflows/gpu-tests.yml" in readme and "self-hosted, linux, x64, gpu" in readme
