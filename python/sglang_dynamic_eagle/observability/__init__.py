"""What the server tells operators and tests: mode counters (``counters``), their Prometheus
export (``prometheus_metrics``), the GPU time of prefills (``prefill_timing``), decode-step traces
for replay (``trace``) and the host-sync check (``host_syncs``). Nothing here decides anything."""
