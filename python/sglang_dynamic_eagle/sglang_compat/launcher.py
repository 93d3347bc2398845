"""EAGLE3_DYNAMIC in sglang's launcher: its flags on the command line, and the checks of its server
arguments before any GPU work.

Two sglang ``HookRegistry`` hooks (installed with all others by ``registry.install_hooks``):
:func:`after_add_cli_args` on ``ServerArgs.add_cli_args`` adds the flags of
``config.FLAG_SPECS`` to the parser, and :func:`around_from_cli_args` on
``ServerArgs.from_cli_args`` reads them from the namespace, checks them and writes them to
``config.ENV_VAR`` (``config.export_flags``) *before* ``ServerArgs`` is built, where the
scheduler processes find them (see ``config``).

:func:`validate_server_args` refuses configurations that cannot work, with one line; it runs on
the parsed command line (:func:`refuse_before_resolution`) and again inside
``ServerArgs.__post_init__`` (the algorithm's validation, ``plugin``).
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Optional

from sglang_dynamic_eagle.config import (
    ENV_VAR,
    FLAG_SPECS,
    Config,
    export_flags,
    load_config,
    resolve_flags,
)
from sglang_dynamic_eagle.policy import (
    ALGORITHM_NAME,
    DISABLE_FLAG,
    ENABLE_FLAG,
    PATIENCE_FLAG,
)
from sglang_dynamic_eagle.sglang_compat.gpu_check import missing_nvidia_gpu
from sglang_dynamic_eagle.sglang_compat.startup_errors import StartupError, install_excepthook
from sglang_dynamic_eagle.sglang_compat.unsupported import unsupported_reason

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Add the three flags to ``parser``. Calling it twice on one parser is a no-op."""
    if DISABLE_FLAG in parser._option_string_actions:  # argparse's own flag index
        return
    group = parser.add_argument_group(
        f"{ALGORITHM_NAME} (sglang-dynamic-eagle)",
        f"Used only with --speculative-algorithm {ALGORITHM_NAME}: EAGLE-3 while speculation "
        "pays, plain decoding while it does not.",
    )
    for spec in FLAG_SPECS:
        group.add_argument(
            spec.flag,
            dest=spec.dest,
            # Checked by around_from_cli_args, which refuses a bad value in one line (argparse
            # would print sglang's whole usage text first).
            default=None,
            metavar=spec.metavar,
            help=f"{spec.help} Only applies with --speculative-algorithm {ALGORITHM_NAME}.",
        )


def flags_from_namespace(args: argparse.Namespace) -> Config:
    return resolve_flags(**{spec.field: getattr(args, spec.dest, None) for spec in FLAG_SPECS})


def _flags_given(args: argparse.Namespace) -> bool:
    return any(getattr(args, spec.dest, None) is not None for spec in FLAG_SPECS)


# The ENV_VAR value this module last wrote; used to tell a user-set value apart.
_last_exported: Optional[str] = None


def after_add_cli_args(result, parser, *args, **kwargs):
    """HookRegistry AFTER hook on ``ServerArgs.add_cli_args`` (a staticmethod: the hook gets
    ``(result, parser)``)."""
    add_cli_args(parser)
    return result


def selects_algorithm(args) -> bool:
    """Whether parsed arguments (or ServerArgs) select ``--speculative-algorithm EAGLE3_DYNAMIC``."""
    return (getattr(args, "speculative_algorithm", None) or "").upper() == ALGORITHM_NAME


def around_from_cli_args(original_fn, cls, args, *rest, **kwargs):
    """HookRegistry AROUND hook on ``ServerArgs.from_cli_args`` (a classmethod: the hook gets
    ``(original_fn, cls, args)``).

    A command line that selects EAGLE3_DYNAMIC (or gives one of its flags) gets the one-line
    printing of :class:`StartupError` (``startup_errors.install_excepthook``) and, with
    EAGLE3_DYNAMIC, :func:`refuse_before_resolution`; any other command line is left as sglang
    handles it."""
    global _last_exported
    algorithm = getattr(args, "speculative_algorithm", None)
    selected = selects_algorithm(args)
    if selected or _flags_given(args):
        install_excepthook()
    try:
        flags = flags_from_namespace(args)
    except ValueError as error:
        raise StartupError(str(error)) from None
    previous = os.environ.get(ENV_VAR)
    if previous is not None and previous != _last_exported and previous != flags.flags_json():
        logger.warning(
            "%s=%s is overridden by the command line (%s).", ENV_VAR, previous, flags.flags_json()
        )
    if _flags_given(args) and not selected:
        logger.warning(
            "%s/%s/%s only apply with --speculative-algorithm %s; ignored with %s.",
            DISABLE_FLAG,
            ENABLE_FLAG,
            PATIENCE_FLAG,
            ALGORITHM_NAME,
            algorithm,
        )
    export_flags(flags)
    _last_exported = os.environ[ENV_VAR]
    if selected:
        refuse_before_resolution(args)
    return original_fn(cls, args, *rest, **kwargs)


# --------------------------------------------------------------------------------------
# Server-argument validation (runs inside ServerArgs.__post_init__)
# --------------------------------------------------------------------------------------


def validate_server_args(server_args) -> None:
    """Refuse EAGLE3_DYNAMIC configurations that cannot work, before any GPU work.

    Called on the parsed command line by :func:`refuse_before_resolution`, and by sglang's
    ``handle_speculative_decoding`` (inside ``ServerArgs.__post_init__``) for custom algorithms,
    before the EAGLE defaults for steps/topk/draft tokens are applied (they may still be None
    here). Raises ``StartupError`` with a one-line message that names the flag (or environment
    variable) and the fix.
    """
    config = load_config()  # raises for a malformed ENV_VAR or environment variable
    n, m = config.disable_batch_threshold, config.enable_batch_threshold
    if n is None and m is not None:
        raise StartupError(
            f"{ENABLE_FLAG} only applies with fixed thresholds; give a number for "
            f"{DISABLE_FLAG} or remove {ENABLE_FLAG} (the default, auto, measures the "
            "switch point itself)."
        )
    if n is not None and n > 0 and m > n:
        raise StartupError(
            f"{ENABLE_FLAG} ({m}) must be <= {DISABLE_FLAG} ({n}); lower {ENABLE_FLAG} "
            f"or raise {DISABLE_FLAG}."
        )

    if not getattr(server_args, "speculative_draft_model_path", None):
        raise StartupError(
            f"--speculative-algorithm {ALGORITHM_NAME} requires "
            "--speculative-draft-model-path (an EAGLE-3 draft model for the target)."
        )

    reason = unsupported_reason(server_args)
    if reason is not None:
        raise StartupError(reason)


def refuse_before_resolution(args) -> None:
    """Every refusal of this package, on the parsed command line, then the GPU check: before
    sglang builds ``ServerArgs``.

    sglang's ``ServerArgs.__post_init__`` resolves the device first (on a machine without an
    accelerator it fails there, with two chained tracebacks) and calls the algorithm's
    validation later, so without this a missing draft path on such a machine never showed. The
    same validation runs again inside ``__post_init__`` on the resolved values. The GPU check
    applies where sglang would look for CUDA (``--device`` unset or ``cuda``); an explicit
    other device (the CPU tests resolve arguments with ``--device cpu``) is left to sglang.
    """
    validate_server_args(args)
    device = getattr(args, "device", None)
    if device is None or str(device).startswith("cuda"):
        reason = missing_nvidia_gpu()
        if reason is not None:
            raise StartupError(reason)
