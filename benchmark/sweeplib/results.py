"""The result document: {"schema_version": 2, "sources": [{created (UTC), command_line, gpu, sglang_version, git_commit,
settings}], "configs": {name: server record}, "runs": [{config, workload, round, status, error, started_at, ended_at,
metrics, segments: [{bench: bench_serving's result line without its per-request lists, requests: {ok, output_len,
ttft_s, tpot_s, e2e_s}}], mode_counters, trace}]}. Schema 1 (the former sweep.py, interleaved.py, paired.py) has runs by
concurrency with bench_serving's metrics only, or waves ("pairs"), and "sources" of several runs merged."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import lzma
import math
import os
import re
import shlex
import subprocess
from pathlib import Path

SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)
RUN_OK = "ok"
OFFLINE_ENV_VAR = "SGLANG_OFFLINE_ENV"
REPO_ROOT = Path(__file__).resolve().parents[2]


def first_output_line(command: list[str]) -> str | None:
    """The first non-empty line a command prints, or None where it fails or does not exist."""
    try:
        output = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True, cwd=REPO_ROOT).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return next((line.strip() for line in output.splitlines() if line.strip()), None)


def shown_paths(text: str) -> str:
    """``text`` with the folder of an offline sglang install (``$SGLANG_OFFLINE_ENV``, where it is set)
    written as ``$SGLANG_OFFLINE_ENV``, so that recorded commands read the same on every machine."""
    offline_dir = os.environ.get(OFFLINE_ENV_VAR, "").rstrip("/")
    if not offline_dir:
        return text
    for folder in {str(Path(offline_dir).resolve()), offline_dir}:
        text = text.replace(folder + "/", "$SGLANG_OFFLINE_ENV/")
    return text


def new_results_document(command_line: list[str], settings: dict, git_commit: str | None = None) -> dict:
    try:
        sglang_version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        sglang_version = None
    source = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command_line": shown_paths(shlex.join(command_line)),
              "gpu": first_output_line(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]),
              "sglang_version": sglang_version, "settings": settings,
              "git_commit": git_commit or first_output_line(["git", "describe", "--always", "--dirty", "--abbrev=12"])}
    return {"schema_version": SCHEMA_VERSION, "sources": [source], "configs": {}, "runs": []}


def write_atomically(path: Path, text: str) -> None:
    """A rename over the old file: a reader, or a run killed mid-write, never sees half of it."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def save_results(document: dict, path: Path) -> None:
    write_atomically(path, json.dumps(document, indent=1) + "\n")


def load_results(path: Path) -> dict:
    """A result document, also xz-compressed (``*.json.xz``)."""
    document = json.loads(lzma.open(path).read() if path.suffix == ".xz" else path.read_bytes())
    if document.get("schema_version") not in READABLE_SCHEMAS:
        raise ValueError(f"{path}: schema_version {document.get('schema_version')!r}, expected one of "
                         f"{READABLE_SCHEMAS}")
    return document


def file_safe(name: str) -> str:  # a workload name in a file name (``~1.3:0.5/4.0:0.5``: no ``/``)
    return re.sub(r"[^\w.-]", "_", name)


def split_trace(trace: Path, runs: list[dict], out_dir: Path, prefix: str) -> None:
    """Write the lines of a decode-step trace (``SGLANG_DYNAMIC_EAGLE_TRACE``) from the time windows of
    each workload's runs to ``<prefix><workload>.jsonl`` (and its ``config`` line to each: a replay reads
    it), and give each run ``trace``: the file, its line count and its step lines by mode. Lines without a
    time ``t`` (a step's time, its verify) go with the step line of the same ``step``, else the line before."""
    windows: dict[str, list[tuple[float, float]]] = {}
    for run in (run for run in runs if run.get("started_at")):
        windows.setdefault(run["workload"], []).append((run["started_at"], run["ended_at"]))
    step_times, last_t = {}, -math.inf  # a step's time; the time of the line before
    chosen, modes = {name: [] for name in windows}, {name: {} for name in windows}  # lines; step lines by mode
    for text in trace.read_text().splitlines() if trace.exists() else []:
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue  # a line cut when the server was killed
        last_t = t = line.get("t", step_times.get(line.get("step"), last_t))
        if line.get("k") == "step":
            step_times[line.get("step")] = t
        for name in (name for name, spans in windows.items()
                     if line.get("k") == "config" or any(start <= t <= end for start, end in spans)):
            chosen[name].append(text)
            if line.get("k") == "step":
                modes[name][str(line.get("mode"))] = modes[name].get(str(line.get("mode")), 0) + 1
    files = {name: prefix + file_safe(name) + ".jsonl" for name in chosen}
    for name, kept in chosen.items():
        (out_dir / files[name]).write_text("".join(text + "\n" for text in kept))
    for run in (run for run in runs if run.get("started_at")):
        name = run["workload"]
        run["trace"] = {"file": files[name], "lines": len(chosen[name]), "steps_by_mode": modes[name]}


# EAGLE3_DYNAMIC's mode counters: the plugin publishes a dict under "dynamic_eagle" in
# internal_states[0] of /server_info (python/sglang_dynamic_eagle/engine/worker.py, report(); the top
# level is accepted too), counters and static facts of the server (thresholds, graph sizes).
COUNTERS_KEY = "dynamic_eagle"
COUNTER_FIELDS = ("speculative_steps", "plain_steps", "switches_to_plain", "switches_to_speculative", "catchup_tokens")
# Counters that newer plugin versions add; their deltas are reported when both snapshots have them.
OPTIONAL_COUNTER_FIELDS = ("plain_graph_steps", "catchup_forwards", "catchup_truncated_tokens", "catchup_gpu_ms",
                           "speculative_verified_requests", "speculative_accepted_tokens", "prefill_batches",
                           "prefill_tokens", "prefill_target_gpu_ms", "prefill_draft_gpu_ms", "mismatched_results")
HOST_MS_FIELDS = ("host_dispatch_ms", "host_speculative_step_ms", "host_plain_step_ms")  # per step: worker, spec, plain
OPTIONAL_COUNTER_FIELDS += HOST_MS_FIELDS + ("host_before_launch_ms", "decided_at_batch_selection")  # deltas too
MEAN_ACCEPT_FIELD = "mean_accept_length"
RUN_ACCEPT_FIELD, RUN_SPECULATIVE_BATCH_FIELD = "speculative_accept_length", "mean_speculative_batch"
POLICY_FIELDS = ("policy", "disable_batch_threshold", "enable_batch_threshold", "switch_patience",
                 "crossover_batch", "acceptance_estimate")


def find_mode_counters(server_info: dict | None, complete: bool = True) -> dict | None:
    """A copy of the plugin's dict (with ``complete``: only where all five required counters are
    present), or None when absent."""
    if not server_info:
        return None
    candidates = [server_info.get(COUNTERS_KEY)] + [
        state.get(COUNTERS_KEY) for state in server_info.get("internal_states") or [] if isinstance(state, dict)]
    return next((dict(counters) for counters in candidates if isinstance(counters, dict) and (
        not complete or all(field in counters for field in COUNTER_FIELDS))), None)


def counter_delta(before: dict | None, after: dict | None) -> dict | None:
    """What the counters did between two snapshots (counters whose name holds "probe" included);
    None unless both have the required ones. If one went down, the counters were reset in between
    and the `after` values alone are the run's. mean_accept_length is the plugin's lifetime value;
    speculative_accept_length (tokens per request per speculative step) and mean_speculative_batch
    (requests per speculative step) are the run's own, where the plugin reports their counts."""
    if before is None or after is None or not all(f in before and f in after for f in COUNTER_FIELDS):
        return None
    was_reset = any(after[field] < before[field] for field in COUNTER_FIELDS)
    probes = tuple(f for f in after if "probe" in f and all(type(c.get(f)) in (int, float) for c in (before, after)))
    fields = COUNTER_FIELDS + tuple(f for f in OPTIONAL_COUNTER_FIELDS + probes if f in before and f in after)
    delta = {field: after[field] if was_reset else after[field] - before[field] for field in fields}
    spec_steps, verified = delta["speculative_steps"], delta.get("speculative_verified_requests")
    steps = spec_steps + delta["plain_steps"]
    delta["speculative_step_fraction"] = spec_steps / steps if steps else None
    delta["counters_reset_during_run"] = was_reset
    delta[MEAN_ACCEPT_FIELD] = after.get(MEAN_ACCEPT_FIELD)
    delta[RUN_ACCEPT_FIELD] = delta["speculative_accepted_tokens"] / verified if verified else None
    delta[RUN_SPECULATIVE_BATCH_FIELD] = verified / spec_steps if verified is not None and spec_steps else None
    return delta


def run_delta(mode_counter_record: dict | None) -> dict | None:
    """A run's counter change, recomputed from its two snapshots where the record has them (so
    reports of older result files gain fields added since), else the stored change."""
    record = mode_counter_record or {}
    recomputed = counter_delta(record.get("before"), record.get("after"))
    return recomputed if recomputed is not None else record.get("delta")


def policy_settings(counters: dict | None) -> dict:
    """The switching policy the server reported (thresholds, or the automatic policy's
    crossover batch and acceptance estimate at that moment), where it reported them."""
    return {field: counters[field] for field in POLICY_FIELDS if counters and field in counters}
