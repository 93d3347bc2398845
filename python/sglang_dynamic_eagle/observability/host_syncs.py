"""Host synchronisations inside the worker's forwards: a diagnostic, off by default.

A synchronising call (a blocking copy, ``.item()``, ``.tolist()`` of a GPU tensor) makes the
host wait for all GPU work enqueued before it. Under sglang's overlap scheduler that costs the
step its overlap; inside a prefill it also delays the previous batch's first tokens by one
prefill (``sglang_compat.hooks.prefill_tail_tokens`` removes the one sglang's EAGLE prefill had).

With ``SGLANG_DYNAMIC_EAGLE_SYNC_CHECK=1`` (``config``) the plugin builds the worker of
:func:`with_host_sync_check`: every prefill, plain step and speculative step runs under
``torch.cuda.set_sync_debug_mode("warn")``; the call sites that synchronised are counted per kind
of forward and reported in ``/server_info`` (``host_syncs``). The check costs a little host time
per forward, so it is for diagnosis and the GPU tests, not for serving; without it the worker
runs no part of it.

What PyTorch's sync debug mode sees: blocking copies, ``.item()``/``.tolist()`` of GPU tensors
and stream or device synchronisations. It does not see ``torch.cuda.Event.synchronize`` (the
catch-up waits on one, for a copy enqueued before the previous plain step's forward) nor a
``non_blocking`` copy from pageable memory. While a forward is watched, every warning it raises
is recorded instead of shown (the scheduler runs forwards on one thread).
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from contextlib import contextmanager
from typing import Dict, Iterator, Type

import torch

# The text of PyTorch's warning for a synchronising CUDA call under sync debug mode.
SYNC_WARNING_TEXT = "called a synchronizing CUDA operation"


class HostSyncCounter:
    """Counts synchronising call sites per kind of forward ("prefill", "plain", ...)."""

    def __init__(self) -> None:
        self._sites: Counter = Counter()

    @contextmanager
    def watch(self, kind: str) -> Iterator[None]:
        previous_mode = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(previous_mode)
        for warning in caught:
            if SYNC_WARNING_TEXT in str(warning.message):
                site = f"{os.path.basename(warning.filename)}:{warning.lineno}"
                self._sites[f"{kind} {site}"] += 1

    def report(self) -> Dict[str, float]:
        """``"<kind> <file>:<line>": count`` of every call site that synchronised."""
        return dict(self._sites)


def with_host_sync_check(worker_class: Type) -> Type:
    """A subclass of the worker class (``engine.worker.DynamicEagleWorker``) whose prefills
    (``_prefill``) and decode steps (``_decode``, of either mode) run watched, and whose report
    adds ``host_syncs``."""

    class HostSyncCheckedWorker(worker_class):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.host_syncs = HostSyncCounter()

        def _prefill(self, batch, *args):
            with self.host_syncs.watch("prefill"):
                return super()._prefill(batch, *args)

        def _decode(self, mode, batch, *args):
            with self.host_syncs.watch(mode.value):
                return super()._decode(mode, batch, *args)

        def report(self) -> dict:
            return {**super().report(), "host_syncs": self.host_syncs.report()}

    return HostSyncCheckedWorker
