"""The scheduler's choice of its next batch, handed to EAGLE3_DYNAMIC's worker: an AFTER hook on
``Scheduler.get_next_batch_to_run`` (installed by ``registry.install_hooks``). The worker takes
the queue left waiting (the policy's queue input) and, for a decode batch, makes the step's
decision there, before the scheduler waits for the previous step's verify
(``DynamicEagleWorker.batch_selected`` says why). At the first call the worker also takes the
scheduler itself (``engine.early_first_token`` wraps its future map)."""

from __future__ import annotations

from sglang_dynamic_eagle.sglang_compat.hooks.reporting import dynamic_worker


def batch_selected(plan, scheduler, *args, **kwargs):
    """AFTER hook on ``Scheduler.get_next_batch_to_run``: ``plan.batch_to_run`` (None: nothing
    to run) and ``len(scheduler.waiting_queue)`` to the worker; other servers' workers are left
    alone."""
    worker = dynamic_worker(scheduler)
    if worker is not None:
        worker.attach_scheduler(scheduler)
        worker.batch_selected(getattr(plan, "batch_to_run", None), len(scheduler.waiting_queue))
    return plan
