"""Prometheus export of the EAGLE3_DYNAMIC counters, for servers started with --enable-metrics.

sglang's scheduler processes write their metrics through prometheus_client's multiprocess mode
and the HTTP server's /metrics endpoint merges them; metrics created here, in the scheduler
process, are exported the same way, next to sglang's own `sglang:*` metrics and with the same
labels. They are updated on the schedule of sglang's periodic decode log line
(--decode-log-interval), by the hook in sglang_compat.hooks.reporting.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, Optional

logger = logging.getLogger(__name__)

METRIC_PREFIX = "sglang:dynamic_eagle_"

# Counter snapshot key -> help text; exported as Prometheus counters `<prefix><key>_total`.
COUNTERS: Dict[str, str] = {
    "speculative_steps": "Decode steps that ran EAGLE-3 speculation.",
    "plain_steps": "Decode steps that ran plain one-token decoding.",
    "plain_graph_steps": "Plain decode steps that replayed a plain CUDA graph.",
    "switches_to_plain": "Switches from speculative to plain decoding.",
    "switches_to_speculative": "Switches from plain to speculative decoding.",
    "catchup_forwards": "Draft-KV catch-up forwards run when speculation resumed.",
    "catchup_tokens": "Positions caught up in the draft KV cache.",
    "catchup_truncated_tokens": "Missed positions not caught up (older than the catch-up "
    "window or the stash kept; stale draft KV).",
    "prefill_batches": "Prefill batches whose GPU time was measured.",
    "prefill_tokens": "Prompt tokens of those prefill batches.",
    "prefill_target_gpu_ms": "GPU milliseconds of their target extends.",
    "prefill_draft_gpu_ms": "GPU milliseconds of their draft extends (the draft's prefill cost).",
    "host_dispatch_ms": "Host milliseconds of EAGLE3_DYNAMIC's own work on decode steps (batch "
    "view, policy, bookkeeping, result processing).",
    "host_before_launch_ms": "Of host_dispatch_ms, the part from the worker's call to each mode's "
    "step (a decision made at the scheduler's choice of the batch is not in it): what a backend "
    "that waits for the previous verify can leave the GPU idle for.",
    "host_speculative_step_ms": "Host milliseconds inside speculative steps (launches, catch-ups).",
    "host_plain_step_ms": "Host milliseconds inside plain steps (launches).",
}

# Report key -> help text; exported as Prometheus gauges `<prefix><key>` (0 where not reported).
GAUGES: Dict[str, str] = {
    "mean_accept_length": "Tokens per request per speculative verify step, bonus included "
    "(plain steps excluded).",
    "acceptance_estimate": "Server-wide acceptance length the automatic policy decides with: the "
    "recent mean shrunk towards the long-run mean and the full acceptance.",
    "crossover_batch": "Largest batch size at which speculation pays, from the measured step "
    "costs and the acceptance estimate (0: nowhere).",
}


class DynamicEagleMetrics:
    """The Prometheus metrics of one scheduler process."""

    def __init__(self, labels: Mapping[str, str], registry: Optional[Any] = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge

        registry = REGISTRY if registry is None else registry
        self._labels = dict(labels)
        label_names = list(self._labels)
        self._counters = {
            key: Counter(METRIC_PREFIX + key, text, labelnames=label_names, registry=registry)
            for key, text in COUNTERS.items()
        }
        self._exported = {key: 0 for key in COUNTERS}
        for counter in self._counters.values():
            counter.labels(**self._labels)  # every series exists from the start, at 0
        self._speculative_mode = Gauge(
            METRIC_PREFIX + "speculative_mode",
            "1 while decode steps speculate, 0 while they decode plainly.",
            labelnames=label_names, multiprocess_mode="mostrecent", registry=registry,
        )
        self._gauges = {
            key: Gauge(
                METRIC_PREFIX + key, text,
                labelnames=label_names, multiprocess_mode="mostrecent", registry=registry,
            )
            for key, text in GAUGES.items()
        }

    def update(self, snapshot: Mapping[str, float], speculative: bool) -> None:
        """Bring the metrics up to a worker report (or a ModeCounters snapshot) and the
        current mode."""
        for key, counter in self._counters.items():
            delta = snapshot.get(key, 0) - self._exported[key]
            if delta > 0:
                counter.labels(**self._labels).inc(delta)
                self._exported[key] = snapshot[key]
        self._speculative_mode.labels(**self._labels).set(1 if speculative else 0)
        for key, gauge in self._gauges.items():
            gauge.labels(**self._labels).set(snapshot.get(key, 0.0))


class MetricsExport:
    """One worker's export. The metrics are created on the first update, with the labels of
    sglang's collector. Updates run inside the scheduler loop, where HookRegistry catches
    nothing: a failure is logged once and ends the export instead of stopping the server."""

    def __init__(self, registry: Optional[Any] = None) -> None:
        self._registry = registry
        self._metrics: Optional[DynamicEagleMetrics] = None
        self.enabled = True

    def update(self, labels: Mapping[str, str], snapshot: Mapping[str, float], speculative: bool) -> None:
        if not self.enabled:
            return
        try:
            if self._metrics is None:
                self._metrics = DynamicEagleMetrics(labels, self._registry)
            self._metrics.update(snapshot, speculative)
        except Exception:
            logger.exception("EAGLE3_DYNAMIC: Prometheus export failed; it stays off in this process")
            self.enabled = False
