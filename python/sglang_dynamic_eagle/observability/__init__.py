"""What the server tells operators and tests: mode counters (``counters``), their Prometheus
export (``prometheus_metrics``), the GPU time of prefills (``prefill_timing``), decode-step traces
for replay (``trace``), the host-sync check (``host_syncs``) and the scheduler's
garbage-collection pauses (``gc_pauses``). Nothing here decides anything."""
