"""What EAGLE3_DYNAMIC adds to sglang's own reporting, as HookRegistry AFTER hooks (installed by
``registry.install_hooks``): the worker's report under ``dynamic_eagle`` in ``/server_info``
(with the target's verify kernel on triton: ``triton_verify``), and on the periodic decode log
line's schedule a log line of the counters and, with ``--enable-metrics``, their Prometheus
export."""

from __future__ import annotations

import logging
from typing import Any

from sglang_dynamic_eagle.policy import DecodeMode
from sglang_dynamic_eagle.sglang_compat import triton_verify

logger = logging.getLogger(__name__)


def dynamic_worker(scheduler) -> Any:
    """The scheduler's DynamicEagleWorker, or None for any other server."""
    from sglang_dynamic_eagle.engine.worker import DynamicEagleWorker

    worker = getattr(scheduler, "draft_worker", None)
    return worker if isinstance(worker, DynamicEagleWorker) else None


def add_report_to_internal_state(result, scheduler, *args, **kwargs):
    """AFTER hook on ``Scheduler.get_internal_state``."""
    worker = dynamic_worker(scheduler)
    if worker is not None:
        result.internal_state["dynamic_eagle"] = {**worker.report(), **triton_verify.report(worker)}
    return result


def report_with_decode_stats(result, reporter, *args, **kwargs):
    """AFTER hook on ``SchedulerMetricsReporter.report_decode_stats``."""
    worker = dynamic_worker(reporter.scheduler)
    if (
        worker is not None
        and reporter.is_stats_logging_rank
        and reporter.forward_ct_decode % reporter.decode_log_interval == 0
    ):
        logger.info(worker.counters.log_line())
        if reporter.enable_metrics and reporter.metrics_collector is not None:
            worker.metrics_export.update(
                reporter.metrics_collector.labels,
                worker.report(),
                speculative=worker.mode is DecodeMode.SPECULATIVE,
            )
    return result
