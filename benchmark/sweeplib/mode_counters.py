"""EAGLE3_DYNAMIC mode counters from GET /server_info and their change over one benchmark run.

The plugin publishes a dict under the key "dynamic_eagle", at the top level of the server info
or inside one of its internal_states entries; servers without the plugin have neither.
"""

from __future__ import annotations

COUNTERS_KEY = "dynamic_eagle"
COUNTER_FIELDS: tuple[str, ...] = (
    "speculative_steps",
    "plain_steps",
    "switches_to_plain",
    "switches_to_speculative",
    "catchup_tokens",
)
MEAN_ACCEPT_FIELD = "mean_accept_length"


def find_mode_counters(server_info: dict | None) -> dict | None:
    """The plugin's counters (integer fields plus mean_accept_length), or None when absent."""
    if not server_info:
        return None
    candidates = [server_info.get(COUNTERS_KEY)]
    candidates += [
        state.get(COUNTERS_KEY)
        for state in server_info.get("internal_states") or []
        if isinstance(state, dict)
    ]
    for counters in candidates:
        if isinstance(counters, dict) and all(field in counters for field in COUNTER_FIELDS):
            found = {field: int(counters[field]) for field in COUNTER_FIELDS}
            mean_accept = counters.get(MEAN_ACCEPT_FIELD)
            found[MEAN_ACCEPT_FIELD] = float(mean_accept) if mean_accept is not None else None
            return found
    return None


def counter_delta(before: dict | None, after: dict | None) -> dict | None:
    """What the counters did between two snapshots; None unless both snapshots have them.

    If any counter went down, the counters were reset in between (for example by a cache
    flush), so the `after` values alone are the run's counts. mean_accept_length is the
    plugin's running value at `after`, not a per-run figure.
    """
    if before is None or after is None:
        return None
    was_reset = any(after[field] < before[field] for field in COUNTER_FIELDS)
    delta = {
        field: after[field] if was_reset else after[field] - before[field]
        for field in COUNTER_FIELDS
    }
    steps = delta["speculative_steps"] + delta["plain_steps"]
    delta["speculative_step_fraction"] = delta["speculative_steps"] / steps if steps else None
    delta["counters_reset_during_run"] = was_reset
    delta[MEAN_ACCEPT_FIELD] = after.get(MEAN_ACCEPT_FIELD)
    return delta
