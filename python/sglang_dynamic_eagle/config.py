"""Every setting of EAGLE3_DYNAMIC in one frozen dataclass, :class:`Config`, read and checked in
one place, :func:`load_config`.

Command-line flags (only used with ``--speculative-algorithm EAGLE3_DYNAMIC``; ``FLAG_SPECS``):

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

The flag values are not ``ServerArgs`` fields (``ServerArgs.from_cli_args`` copies dataclass
fields only), so they travel in the environment as JSON, in ``ENV_VAR``: the launcher's hook on
``ServerArgs.from_cli_args`` (``sglang_compat.launcher``) checks them and writes ``ENV_VAR``
(:func:`export_flags`) *before* ``ServerArgs`` is built; sglang starts the scheduler processes
with multiprocessing "spawn", so they inherit it, and read it with :func:`load_config`. With the
Python API (``sglang.Engine(...)``) no command line is parsed: set ``ENV_VAR`` yourself before
creating the engine (e.g. ``os.environ[ENV_VAR] = '{"disable_batch_threshold": 32}'``, or
``"auto"``; missing keys take the defaults and the rule above), or leave it unset to get the
defaults. On the command line the flags (or, when absent, their defaults) always win: the hook
overwrites ``ENV_VAR``.

Environment variables (``ENVIRONMENT``), read where the server runs:

* ``SGLANG_DYNAMIC_EAGLE_CATCHUP_MIB`` (default 1024): memory of the draft-KV catch-up stash;
* ``SGLANG_DYNAMIC_EAGLE_CATCHUP_WINDOW`` (1 to 256, default 256): positions caught up per
  request at most;
* ``SGLANG_DYNAMIC_EAGLE_TRACE=<file>``: decode-step traces for replay (``observability.trace``);
* ``SGLANG_DYNAMIC_EAGLE_SYNC_CHECK=1``: the host-sync check (``observability.host_syncs``);
* ``SGLANG_DYNAMIC_EAGLE_EARLY_FIRST_TOKEN`` (``1``, the default, or ``0``): a prefill's first
  token to the host before the draft's extend (``engine.early_first_token``); ``0`` keeps
  sglang's order;
* ``SGLANG_DYNAMIC_EAGLE_SPLITKV_VERIFY`` (``1``, the default, or ``0``): on triton attention with
  a chain, a verify's attention through sglang's split-KV kernel (``sglang_compat.triton_verify``);
  ``0`` keeps sglang's prefill kernel.

A bad value raises :class:`StartupError` with one line that names the flag or variable and the
fix, before any GPU work (the launcher checks them all, and each scheduler process again).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from sglang_dynamic_eagle.policy import (
    DEFAULT_ENABLE_BATCH_THRESHOLD,
    DEFAULT_SWITCH_PATIENCE,
    DISABLE_FLAG,
    ENABLE_FLAG,
    PATIENCE_FLAG,
    check_int_at_least,
)
from sglang_dynamic_eagle.sglang_compat.startup_errors import StartupError

logger = logging.getLogger(__name__)
ENV_VAR = "SGLANG_DYNAMIC_EAGLE_FLAGS"
CATCHUP_BUDGET_ENV = "SGLANG_DYNAMIC_EAGLE_CATCHUP_MIB"
CATCHUP_WINDOW_ENV = "SGLANG_DYNAMIC_EAGLE_CATCHUP_WINDOW"
TRACE_ENV = "SGLANG_DYNAMIC_EAGLE_TRACE"
SYNC_CHECK_ENV = "SGLANG_DYNAMIC_EAGLE_SYNC_CHECK"
EARLY_FIRST_TOKEN_ENV = "SGLANG_DYNAMIC_EAGLE_EARLY_FIRST_TOKEN"
SPLITKV_VERIFY_ENV = "SGLANG_DYNAMIC_EAGLE_SPLITKV_VERIFY"
AUTO = "auto"
DEFAULT_CATCHUP_BUDGET_MIB = 1024
MAX_WINDOW = 256


@dataclass(frozen=True)
class Config:
    # The three flags (``FLAG_SPECS``), carried to the scheduler processes in ENV_VAR.
    disable_batch_threshold: Optional[int] = None  # None = auto (cost-based policy)
    enable_batch_threshold: Optional[int] = None  # None with auto, unless the user gave one
    switch_patience: int = DEFAULT_SWITCH_PATIENCE
    # The environment variables (``ENVIRONMENT``).
    catchup_budget_mib: int = DEFAULT_CATCHUP_BUDGET_MIB
    catchup_window: int = MAX_WINDOW
    trace_path: Optional[str] = None
    sync_check: bool = False
    early_first_token: bool = True
    splitkv_verify: bool = True

    @property
    def automatic(self) -> bool:
        return self.disable_batch_threshold is None

    @property
    def catchup_budget_bytes(self) -> int:
        return self.catchup_budget_mib * 1024 * 1024

    def flags_json(self) -> str:
        """The flags as ``ENV_VAR`` carries them."""
        data = {spec.field: getattr(self, spec.field) for spec in FLAG_SPECS}
        if self.automatic:
            data["disable_batch_threshold"] = AUTO
        return json.dumps(data, sort_keys=True)

    def speculative_graph_max_bs(self, graph_max_bs: int) -> int:
        """Largest batch the speculative graphs are captured for.

        Automatic policy and threshold 0 (always speculate): every graph size, so the policy can
        speculate at any batch where the measured costs say it pays (at high acceptance that can
        be well above stock EAGLE's 48). With a fixed threshold, twice the disable threshold
        leaves room for the ``--speculative-switch-patience`` steps that may still run
        speculatively above it (at 24 that is EAGLE's 48).
        """
        if self.automatic or self.disable_batch_threshold == 0:
            return graph_max_bs
        return max(1, min(graph_max_bs, 2 * self.disable_batch_threshold))


DEFAULT_CONFIG = Config()


def derived_enable_threshold(disable_batch_threshold: int) -> int:
    """M used when the user gives N but not M: max(1, min(default M, 2*N // 3)).

    N == 0 (always speculate) ignores M; the default M is kept then.
    """
    if disable_batch_threshold == 0:
        return DEFAULT_ENABLE_BATCH_THRESHOLD
    return max(1, min(DEFAULT_ENABLE_BATCH_THRESHOLD, (2 * disable_batch_threshold) // 3))


# --------------------------------------------------------------------------------------
# Flags
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
    """One flag, declared once: its Config field (also its JSON key in ENV_VAR), its
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
        help="With a numeric N: consecutive decode steps that must qualify before the mode "
        f"switches (>= 1). Default: {DEFAULT_SWITCH_PATIENCE}.",
    ),
)


def resolve_flags(
    disable_batch_threshold: Any = None,
    enable_batch_threshold: Any = None,
    switch_patience: Any = None,
) -> Config:
    """The flags given (None = not given) with defaults filled in, each value checked on its
    own; the environment variables keep their defaults.

    The M <= N relation is checked by ``sglang_compat.launcher.validate_server_args`` (only
    when EAGLE3_DYNAMIC is selected), so a server that does not use the algorithm is not
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
    return Config(disable_batch_threshold=n, enable_batch_threshold=m, switch_patience=k)


def flags_from_mapping(data: Mapping[str, Any], source: str = ENV_VAR) -> Config:
    names = sorted(spec.field for spec in FLAG_SPECS)
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown}; allowed keys are {names}.")
    return resolve_flags(**{spec.field: data.get(spec.field) for spec in FLAG_SPECS})


def _flags_from_environment(raw: Optional[str]) -> Config:
    if raw is None or not raw.strip():
        return DEFAULT_CONFIG
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


def export_flags(config: Config) -> None:
    """Write the flags of ``config`` to ``os.environ[ENV_VAR]`` (inherited by spawned
    subprocesses)."""
    os.environ[ENV_VAR] = config.flags_json()


# --------------------------------------------------------------------------------------
# Environment variables
# --------------------------------------------------------------------------------------


def _whole_number(name: str, default: int, what: str, high: Optional[int] = None
                  ) -> Callable[[Optional[str]], int]:
    """A parser of a variable holding a whole number from 1 to ``high``."""

    def parse(raw: Optional[str]) -> int:
        value = str(default) if raw is None else raw
        if not value.isdigit() or int(value) < 1 or (high is not None and int(value) > high):
            raise StartupError(f"{name}={value!r} is invalid: set it to {what}, or unset it for "
                               f"the default ({default}).")
        return int(value)

    return parse


def _switch(name: str, default: bool) -> Callable[[Optional[str]], bool]:
    def parse(raw: Optional[str]) -> bool:
        if raw is None or raw == "":
            return default
        if raw not in ("0", "1"):
            raise StartupError(f"{name}={raw!r} is not a switch: set it to 1 (on) or 0 (off), "
                               "or unset it")
        return raw == "1"

    return parse


@dataclass(frozen=True)
class EnvSpec:
    """One environment variable: its Config field and how its text (None when unset) becomes
    the value (a StartupError names the variable)."""

    field: str
    name: str
    parse: Callable[[Optional[str]], Any]


ENVIRONMENT: Tuple[EnvSpec, ...] = (
    EnvSpec("catchup_budget_mib", CATCHUP_BUDGET_ENV, _whole_number(
        CATCHUP_BUDGET_ENV, DEFAULT_CATCHUP_BUDGET_MIB,
        "a positive number of MiB for the draft-KV catch-up stash")),
    EnvSpec("catchup_window", CATCHUP_WINDOW_ENV, _whole_number(
        CATCHUP_WINDOW_ENV, MAX_WINDOW, f"a whole number of positions from 1 to {MAX_WINDOW}",
        high=MAX_WINDOW)),
    EnvSpec("trace_path", TRACE_ENV, lambda raw: raw or None),
    EnvSpec("sync_check", SYNC_CHECK_ENV, lambda raw: raw == "1"),
    EnvSpec("early_first_token", EARLY_FIRST_TOKEN_ENV, _switch(EARLY_FIRST_TOKEN_ENV, True)),
    EnvSpec("splitkv_verify", SPLITKV_VERIFY_ENV, _switch(SPLITKV_VERIFY_ENV, True)),
)


def load_config(environ: Optional[Mapping[str, str]] = None) -> Config:
    """This server's configuration: the flags from ``ENV_VAR`` (the defaults where unset) and
    every variable of ``ENVIRONMENT``, each checked; works in any process (launcher, scheduler
    subprocesses, Python-API users)."""
    environ = os.environ if environ is None else environ
    known = {ENV_VAR, SYNC_CHECK_ENV} | {spec.name for spec in ENVIRONMENT}
    for name in sorted(n for n in environ if n.startswith("SGLANG_DYNAMIC_EAGLE_")
                       and n not in known):
        logger.warning("EAGLE3_DYNAMIC ignores %s: no such setting (known: %s).", name,
                       ", ".join(sorted(known)))
    values: Dict[str, Any] = {spec.field: spec.parse(environ.get(spec.name))
                              for spec in ENVIRONMENT}
    return replace(_flags_from_environment(environ.get(ENV_VAR)), **values)
