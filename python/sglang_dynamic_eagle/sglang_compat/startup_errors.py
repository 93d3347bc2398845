"""Startup refusals as one line, without a traceback.

:class:`StartupError` (a ``ValueError``) is what this package raises for a configuration it
refuses before any GPU work, or for a start-up that cannot go on (GPU memory run out for the
worker's own parts, raised in sglang's scheduler process, whose log then shows it as the last
line of sglang's traceback); its message names the flag or variable and the fix. sglang lets
such an error rise out of ``ServerArgs.__post_init__`` to the top of
``python -m sglang.launch_server``, where Python would print a traceback of about 25 lines
above the message. :func:`install_excepthook` makes the interpreter print only
``error: <message>`` for a StartupError and leaves every other exception to the hook that was
there before. The launcher hook ``launcher.around_from_cli_args`` installs it when the command line
selects EAGLE3_DYNAMIC (or gives one of its flags); loading the plugin does not install it.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from types import TracebackType
from typing import Callable, Iterator, Optional, Type

ExceptHook = Callable[[Type[BaseException], BaseException, Optional[TracebackType]], None]


class StartupError(ValueError):
    """A configuration refused at startup; the message is one line naming the fix."""


def one_line_excepthook(previous: ExceptHook) -> ExceptHook:
    def excepthook(exc_type, exc, traceback) -> None:
        if issubclass(exc_type, StartupError):
            print(f"error: {exc}", file=sys.stderr)
            return
        previous(exc_type, exc, traceback)

    excepthook.prints_startup_errors = True
    return excepthook


def install_excepthook() -> None:
    """Idempotent: a second call keeps the hook already installed."""
    if getattr(sys.excepthook, "prints_startup_errors", False):
        return
    sys.excepthook = one_line_excepthook(sys.excepthook)


@contextmanager
def refused_if_out_of_memory(what: str, other_fix: str) -> Iterator[None]:
    """GPU memory running out while building ``what`` becomes a one-line StartupError. The
    worker's own parts (the catch-up stash, the plain-decode graphs) and the split-KV verify's
    scratch are allocated after sglang has sized its KV pool, from the memory its
    ``--mem-fraction-static`` leaves to activations: with several servers on one GPU, or a
    fraction tuned for EAGLE3 alone, that can be too little."""
    import torch  # the launcher imports this module without needing torch

    try:
        yield
    except torch.OutOfMemoryError as error:
        try:
            free = f"{torch.cuda.mem_get_info()[0] / 2**20:.0f} MiB free; "
        except Exception:  # no CUDA here, or a context the failure left unusable
            free = ""
        torch_says = (str(error).splitlines() or [""])[0][:300]  # who holds the memory, on a shared GPU
        raise StartupError(
            f"EAGLE3_DYNAMIC: out of GPU memory allocating {what} after sglang sized its KV pool; "
            f"lower --mem-fraction-static or --max-total-tokens, {other_fix} "
            f"({free}torch: {torch_says})") from None
