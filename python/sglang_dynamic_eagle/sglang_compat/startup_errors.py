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
from types import TracebackType
from typing import Callable, Optional, Type

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
