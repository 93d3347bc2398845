"""Command-line flags of EAGLE3_DYNAMIC and how their values reach every process.

Flags (only used with ``--speculative-algorithm EAGLE3_DYNAMIC``):

* ``--speculative-disable-batch-threshold auto|N`` (default ``auto``): ``auto`` decides every
  decode step from the measured step costs and acceptance (``policy.throughput``). A number N uses
  fixed thresholds instead: speculation turns off when the running decode batch is larger than
  N for K consecutive decode steps; 0 = always speculate (except above the largest speculative
  CUDA-graph batch).
* ``--speculative-enable-batch-threshold M`` (fixed thresholds only): speculation turns back on
  only when the batch is at most M for K consecutive decode steps; M <= N. When N is given and
  M is not, M = max(1, min(16, 2*N // 3)).
* ``--speculative-switch-patience K`` (default 4, >= 1): consecutive qualifying decode steps
  before the mode changes, with fixed thresholds.

The values are not ``ServerArgs`` fields (``ServerArgs.from_cli_args`` copies dataclass
fields only), so they travel in the environment instead:

1. Two sglang ``HookRegistry`` hooks (installed with all others by
   ``upstream_internals.install_hooks``): :func:`after_add_cli_args` on
   ``ServerArgs.add_cli_args`` adds the flags to the parser, and :func:`around_from_cli_args`
   on ``ServerArgs.from_cli_args`` reads them from the namespace, validates them and writes
   them as JSON to ``os.environ[ENV_VAR]`` *before* ``ServerArgs`` is built.
2. sglang starts the scheduler processes with multiprocessing "spawn"; a spawned child
   inherits ``os.environ`` of the parent at start time, and calls ``load_plugins()``
   itself. There, :func:`current_flags` reads ``ENV_VAR``.

With the Python API (``sglang.Engine(...)``) no command line is parsed: set ``ENV_VAR``
yourself before creating the engine (e.g.
``os.environ[ENV_VAR] = '{"disable_batch_threshold": 32}'``, or ``"auto"``; missing keys take
the defaults and the rule above), or leave it unset to get the defaults.

On the command line the flags (or, when absent, their defaults) always win: the
``from_cli_args`` hook overwrites ``ENV_VAR``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Callable, Mapping, Optional, Tuple

from sglang_dynamic_eagle.policy import (
    ALGORITHM_NAME,
    DEFAULT_ENABLE_BATCH_THRESHOLD,
    DEFAULT_SWITCH_PATIENCE,
    DISABLE_FLAG,
    ENABLE_FLAG,
    PATIENCE_FLAG,
    check_int_at_least,
)
from sglang_dynamic_eagle.gpu_check import missing_nvidia_gpu
from sglang_dynamic_eagle.startup_errors import StartupError, install_excepthook
from sglang_dynamic_eagle.unsupported import unsupported_reason

logger = logging.getLogger(__name__)

ENV_VAR = "SGLANG_DYNAMIC_EAGLE_FLAGS"

AUTO = "auto"



@dataclass(frozen=True)
class DynamicEagleFlags:
    disable_batch_threshold: Optional[int]  # None = auto (cost-based policy)
    enable_batch_threshold: Optional[int]  # None with auto, unless the user gave one
    switch_patience: int

    @property
    def automatic(self) -> bool:
        return self.disable_batch_threshold is None

    def to_json(self) -> str:
        data = asdict(self)
        if self.automatic:
            data["disable_batch_threshold"] = AUTO
        return json.dumps(data, sort_keys=True)


DEFAULT_FLAGS = DynamicEagleFlags(
    disable_batch_threshold=None,
    enable_batch_threshold=None,
    switch_patience=DEFAULT_SWITCH_PATIENCE,
)


def derived_enable_threshold(disable_batch_threshold: int) -> int:
    """M used when the user gives N but not M: max(1, min(default M, 2*N // 3)).

    N == 0 (always speculate) ignores M; the default M is kept then.
    """
    if disable_batch_threshold == 0:
        return DEFAULT_ENABLE_BATCH_THRESHOLD
    return max(1, min(DEFAULT_ENABLE_BATCH_THRESHOLD, (2 * disable_batch_threshold) // 3))


# --------------------------------------------------------------------------------------
# Value checking
# --------------------------------------------------------------------------------------


def _check_value(flag: str, value: Any, minimum: int) -> int:
    """Return ``value`` (an int or its decimal text) as an int, or raise a one-line
    ValueError naming ``flag``."""
    if isinstance(value, str):
        try:
            value = int(value.strip(), 10)
        except ValueError:
            raise ValueError(
                f"{flag} must be an integer >= {minimum}, got {value!r}."
            ) from None
    return check_int_at_least(flag, value, minimum)


def _check_disable_threshold(value: Any) -> Optional[int]:
    """None for ``auto``, else the fixed threshold N."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return None
    try:
        return _check_value(DISABLE_FLAG, value, 0)
    except ValueError:
        raise ValueError(
            f"{DISABLE_FLAG} must be '{AUTO}' or an integer >= 0, got {value!r}."
        ) from None


@dataclass(frozen=True)
class FlagSpec:
    """One flag, declared once: its DynamicEagleFlags field (also its JSON key in ENV_VAR), its
    command-line name, how a given value is checked, and its help text."""

    field: str
    flag: str
    metavar: str
    check: Callable[[Any], Any]  # a given value (text or JSON) -> the value; ValueError names the flag
    help: str

    @property
    def dest(self) -> str:
        """The argparse destination: the flag without dashes, in snake case."""
        return self.flag.lstrip("-").replace("-", "_")


FLAG_SPECS: Tuple[FlagSpec, ...] = (
    FlagSpec(
        field="disable_batch_threshold",
        flag=DISABLE_FLAG,
        metavar="{auto,N}",
        check=_check_disable_threshold,
        help=(
            f"'{AUTO}' (the default): speculate while the step costs and acceptance measured on "
            "this server say a speculative step yields more tokens per second than a plain one. "
            "A number N uses fixed thresholds instead: speculation turns off when the running "
            "decode batch is larger than N for K consecutive decode steps (K = "
            f"{PATIENCE_FLAG}); 0 = always speculate, except above the largest speculative "
            "CUDA-graph batch."
        ),
    ),
    FlagSpec(
        field="enable_batch_threshold",
        flag=ENABLE_FLAG,
        metavar="M",
        check=partial(_check_value, ENABLE_FLAG, minimum=0),
        help=(
            "With a numeric N only: speculation turns back on only when the running decode "
            "batch is at most M for K consecutive decode steps. Must be <= N. "
            f"Default: max(1, min({DEFAULT_ENABLE_BATCH_THRESHOLD}, 2*N//3))."
        ),
    ),
    FlagSpec(
        field="switch_patience",
        flag=PATIENCE_FLAG,
        metavar="K",
        check=partial(_check_value, PATIENCE_FLAG, minimum=1),
        help=(
            "With a numeric N: consecutive decode steps that must qualify before the mode "
            f"switches (>= 1). Default: {DEFAULT_SWITCH_PATIENCE}."
        ),
    ),
)


def resolve_flags(
    disable_batch_threshold: Any = None,
    enable_batch_threshold: Any = None,
    switch_patience: Any = None,
) -> DynamicEagleFlags:
    """Fill in defaults (None = not given) and check each value on its own.

    The M <= N relation is checked by :func:`validate_server_args` (only when
    EAGLE3_DYNAMIC is selected), so a server that does not use the algorithm is not
    refused because of these flags.
    """
    disable, enable, patience = (spec.check for spec in FLAG_SPECS)
    n = None if disable_batch_threshold is None else disable(disable_batch_threshold)
    if enable_batch_threshold is not None:
        m = enable(enable_batch_threshold)
    elif n is None:
        m = None
    else:
        m = derived_enable_threshold(n)
    k = DEFAULT_SWITCH_PATIENCE if switch_patience is None else patience(switch_patience)
    return DynamicEagleFlags(
        disable_batch_threshold=n, enable_batch_threshold=m, switch_patience=k
    )


def flags_from_mapping(data: Mapping[str, Any], source: str = ENV_VAR) -> DynamicEagleFlags:
    fields = sorted(spec.field for spec in FLAG_SPECS)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown}; allowed keys are {fields}.")
    return resolve_flags(**{spec.field: data.get(spec.field) for spec in FLAG_SPECS})


def current_flags() -> DynamicEagleFlags:
    """The flags of this server: from ``os.environ[ENV_VAR]`` if set, else the defaults.

    Works in any process (launcher, scheduler subprocesses, Python-API users).
    """
    raw = os.environ.get(ENV_VAR)
    if raw is None or not raw.strip():
        return DEFAULT_FLAGS
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise StartupError(
            f"{ENV_VAR} must be a JSON object such as "
            f'{{"disable_batch_threshold": 24}}, got {raw!r} ({e.msg}).'
        ) from None
    if not isinstance(data, dict):
        raise StartupError(f"{ENV_VAR} must be a JSON object, got {raw!r}.")
    return flags_from_mapping(data)


def export_flags(flags: DynamicEagleFlags) -> None:
    """Write ``flags`` to ``os.environ[ENV_VAR]`` (inherited by spawned subprocesses)."""
    os.environ[ENV_VAR] = flags.to_json()


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


def flags_from_namespace(args: argparse.Namespace) -> DynamicEagleFlags:
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
    if previous is not None and previous != _last_exported and previous != flags.to_json():
        logger.warning(
            "%s=%s is overridden by the command line (%s).", ENV_VAR, previous, flags.to_json()
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
    here). Raises ``StartupError`` with a one-line message that names the flag and the fix.
    """
    flags = current_flags()  # raises for a malformed ENV_VAR
    n, m = flags.disable_batch_threshold, flags.enable_batch_threshold
    if n is None and m is not None:
        raise StartupError(
            f"{ENABLE_FLAG} only applies with fixed thresholds; give a number for "
            f"{DISABLE_FLAG} or remove {ENABLE_FLAG} (the default, {AUTO}, measures the "
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
    # Imported here: spec_algo imports this module (the plugin has loaded both by now).
    from sglang_dynamic_eagle.spec_algo import check_environment

    check_environment()
    device = getattr(args, "device", None)
    if device is None or str(device).startswith("cuda"):
        reason = missing_nvidia_gpu()
        if reason is not None:
            raise StartupError(reason)
