"""EAGLE3_DYNAMIC mode counters from GET /server_info and their change over one benchmark run.

The plugin publishes a dict under the key "dynamic_eagle" in internal_states[0] of the server
info (python/sglang_dynamic_eagle/worker.py, report()); the top level is accepted too. Servers
without the plugin have neither. Besides the counters, the dict carries static facts of the
server (thresholds, graph sizes), which are kept as they are.
"""

from __future__ import annotations

COUNTERS_KEY = "dynamic_eagle"
COUNTER_FIELDS = ("speculative_steps", "plain_steps", "switches_to_plain", "switches_to_speculative",
                  "catchup_tokens")
# Counters that newer plugin versions add; their deltas are reported when both snapshots have them.
OPTIONAL_COUNTER_FIELDS = (
    "plain_graph_steps", "catchup_forwards", "catchup_truncated_tokens", "catchup_gpu_ms",
    "speculative_verified_requests", "speculative_accepted_tokens", "prefill_batches", "prefill_tokens",
    "prefill_target_gpu_ms", "prefill_draft_gpu_ms", "mismatched_results",
    "draft_prefill_full_layer_gpu_caught_up", "draft_prefill_last_position_gpu_behind",
)
MEAN_ACCEPT_FIELD = "mean_accept_length"
RUN_ACCEPT_FIELD = "speculative_accept_length"
RUN_SPECULATIVE_BATCH_FIELD = "mean_speculative_batch"
POLICY_FIELDS = ("policy", "disable_batch_threshold", "enable_batch_threshold", "switch_patience",
                 "crossover_batch", "acceptance_estimate")
# Where a run's "before" snapshot comes from (``before_source`` of its mode_counters record).
BEFORE_AFTER_WARMUP = "after bench_serving's warm-up request"
BEFORE_PREVIOUS_RUN = "after the previous run (bench_serving's warm-up request included)"


def find_mode_counters(server_info: dict | None) -> dict | None:
    """A copy of the plugin's dict (all five required counters present), or None when absent."""
    if not server_info:
        return None
    candidates = [server_info.get(COUNTERS_KEY)] + [
        state.get(COUNTERS_KEY) for state in server_info.get("internal_states") or [] if isinstance(state, dict)]
    for counters in candidates:
        if isinstance(counters, dict) and all(field in counters for field in COUNTER_FIELDS):
            return dict(counters)
    return None


def counter_delta(before: dict | None, after: dict | None) -> dict | None:
    """What the counters did between two snapshots; None unless both snapshots have them.

    If any required counter went down, the counters were reset in between, so the `after`
    values alone are the run's counts. mean_accept_length is the plugin's running value at
    `after` (over the server's lifetime); speculative_accept_length is the run's own figure
    (tokens per request per speculative step), and mean_speculative_batch its requests per
    speculative step (speculation at a large batch is where it costs most), where the plugin
    reports the counts behind them.
    """
    if before is None or after is None:
        return None
    was_reset = any(after[field] < before[field] for field in COUNTER_FIELDS)
    fields = COUNTER_FIELDS + tuple(f for f in OPTIONAL_COUNTER_FIELDS if f in before and f in after)
    delta = {field: after[field] if was_reset else after[field] - before[field] for field in fields}
    steps = delta["speculative_steps"] + delta["plain_steps"]
    delta["speculative_step_fraction"] = delta["speculative_steps"] / steps if steps else None
    delta["counters_reset_during_run"] = was_reset
    delta[MEAN_ACCEPT_FIELD] = after.get(MEAN_ACCEPT_FIELD)
    verified = delta.get("speculative_verified_requests")
    delta[RUN_ACCEPT_FIELD] = delta["speculative_accepted_tokens"] / verified if verified else None
    spec_steps = delta["speculative_steps"]
    delta[RUN_SPECULATIVE_BATCH_FIELD] = (
        verified / spec_steps if verified is not None and spec_steps else None)
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
