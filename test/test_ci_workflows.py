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


def readme_gpu_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    return [line.split("#")[0].strip() for line in readme.splitlines()
            if line.startswith("python -m pytest -m gpu ")]


def test_gpu_workflow_runs_every_readme_selection_on_a_labelled_self_hosted_runner() -> None:
    workflow = load("gpu-tests.yml")
    assert "workflow_dispatch" in workflow["on"]
    (job,) = workflow["jobs"].values()
    assert {"self-hosted", "gpu"} <= set(job["runs-on"])
    assert "pipefail" in job["defaults"]["run"]["shell"]
    lines = run_lines(job)
    assert any("test/gpu/native_ops_plugin" in line for line in lines)
    commands = readme_gpu_commands()
    assert len(commands) >= 5
    for command in commands:
        assert any(line.startswith(command.replace("python ", "python3 ", 1)) for line in lines), command
    pytest_steps = [step for step in job["steps"] if "pytest" in step.get("run", "")]
    assert all(step["if"] == "success() || failure()" for step in pytest_steps)
    uploads = [step for step in job["steps"] if step.get("uses", "").startswith("actions/upload-artifact")]
    assert uploads and uploads[0]["if"] == "always()"


def test_readme_documents_both_workflows_and_their_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "python -m pytest -q" in readme and "bash .ci/run" in readme
    assert ".github/workflows/gpu-tests.yml" in readme and "self-hosted, linux, x64, gpu" in readme
