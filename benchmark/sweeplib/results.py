"""The sweep's result document: one JSON object with every run and its provenance.

{
  "schema_version": 1,
  "sources": [{created, command_line, gpu, sglang_version, settings}, ...],  # one per sweep
  "configs": {name: {status, error, server_command, server_env, startup_s,
                     max_running_requests, server_version, ttft_probe}},
  "runs": [{config, concurrency, num_prompts, status, error, wall_s,
            metrics, ttft_diagnostics, mode_counters}, ...]
}
A merged document has one source per merged sweep.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import logging
import os
import shlex
import shutil
import subprocess
from pathlib import Path

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
RUN_OK = "ok"


def gpu_name() -> str | None:
    """The first GPU's name from nvidia-smi, or None where there is no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        output = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return next((line.strip() for line in output.splitlines() if line.strip()), None)


def installed_sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


KIT_DIR_ENV = "KIT_DIR"


def shown_paths(text: str) -> str:
    """``text`` with the folder of an offline sglang install (``$KIT_DIR``, where it is set)
    written as ``$KIT_DIR``, so that recorded commands read the same on every machine."""
    kit_dir = os.environ.get(KIT_DIR_ENV, "").rstrip("/")
    if not kit_dir:
        return text
    for folder in {str(Path(kit_dir).resolve()), kit_dir}:
        text = text.replace(folder + "/", "$KIT_DIR/")
    return text


def new_results_document(command_line: list[str], settings: dict) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "sources": [{
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command_line": shown_paths(shlex.join(command_line)),
            "gpu": gpu_name(),
            "sglang_version": installed_sglang_version(),
            "settings": settings,
        }],
        "configs": {},
        "runs": [],
    }


def save_results(document: dict, path: Path) -> None:
    """Write atomically, so a sweep killed mid-write leaves the previous complete file."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document, indent=1) + "\n")
    os.replace(temporary, path)


def load_results(path: Path) -> dict:
    document = json.loads(path.read_text())
    if document.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version {document.get('schema_version')!r}, expected {SCHEMA_VERSION}")
    return document


def merge_results(documents: list[dict]) -> dict:
    """Union of several result documents. A later document wins a repeated (configuration,
    concurrency) pair, with a warning, unless its run failed where an earlier one succeeded.
    Each configuration's server record comes from the last document whose runs were kept."""
    kept: dict[tuple[str, int], tuple[int, dict]] = {}
    for index, document in enumerate(documents):
        for run in document["runs"]:
            key = run["config"], int(run["concurrency"])
            if key in kept and kept[key][1]["status"] == RUN_OK and run["status"] != RUN_OK:
                logger.warning("run %s c=%d failed in a later input; keeping the earlier result", *key)
                continue
            if key in kept:
                logger.warning("run %s c=%d appears in several inputs; keeping the last", *key)
            kept[key] = (index, run)
    merged = {"schema_version": SCHEMA_VERSION, "sources": [s for d in documents for s in d["sources"]],
              "configs": {}, "runs": [run for _, run in kept.values()]}
    for name in dict.fromkeys(name for document in documents for name in document["configs"]):
        having = [i for i, document in enumerate(documents) if name in document["configs"]]
        with_kept_runs = [i for (config, _), (i, _) in kept.items() if config == name and i in having]
        merged["configs"][name] = documents[max(with_kept_runs, default=having[-1])]["configs"][name]
    return merged


def successful_runs(document: dict) -> list[dict]:
    return [run for run in document["runs"] if run["status"] == RUN_OK]
