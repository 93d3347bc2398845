"""The reliance and patch registry: every place this package relies on sglang 0.5.17 internals,
and every hook, subclass and attribute swap it applies to sglang's objects.

``RELIANCES`` is data (:class:`~.reliance.UpstreamReliance`): what we use (``target``), of which
kind (a HookRegistry hook, a subclass, a call of a private function, an assignment to an
attribute of an sglang object, or a behaviour we depend on), how, why, and what upstream change
would let us drop it; ``code`` names the dotted paths that must exist in the installed sglang and
``patched_by`` this package's functions that do the patching. ``registry.server`` holds what
the plugin, the launcher and the hooks rely on, ``registry.engine`` what the worker relies on,
``registry.kernels`` what it relies on in sglang's attention kernels.
``HOOKS`` lists every HookRegistry hook, and :func:`install_hooks` installs all of them (from
``plugin.register``). At start-up :func:`check_hooks_in_effect` (launcher) and
:func:`check_at_start_up` (each scheduler process, before it builds its worker) refuse to start,
with one line, if sglang did not apply a hook or lacks a code path of ``RELIANCES``;
``test/test_registry.py`` resolves them all on CPU, and ``test/test_layout.py`` finds every
assignment to another object's attribute in the package in a ``patched_by``.

Checked against sglang 0.5.17 (the pinned version). A version bump must walk this list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Tuple

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_dynamic_eagle.sglang_compat import launcher, triton_verify
from sglang_dynamic_eagle.sglang_compat.hooks import (batch_selection, prefill_tail_tokens, reporting,
                                                      request_guards)
from sglang_dynamic_eagle.sglang_compat.registry.engine import ENGINE_RELIANCES
from sglang_dynamic_eagle.sglang_compat.registry.kernels import KERNEL_RELIANCES
from sglang_dynamic_eagle.sglang_compat.registry.reliance import (
    ATTRIBUTE_SWAP,
    BEHAVIOUR,
    HOOK,
    KINDS,
    PRIVATE_CALL,
    SUBCLASS,
    SUPPORTED_SGLANG,
    UpstreamReliance,
    resolve,
)
from sglang_dynamic_eagle.sglang_compat.registry.server import SERVER_RELIANCES

__all__ = [
    "ATTRIBUTE_SWAP", "BEHAVIOUR", "HOOK", "HOOKS", "KINDS", "PRIVATE_CALL", "RELIANCES",
    "SUBCLASS", "SUPPORTED_SGLANG", "HookSpec", "UpstreamReliance", "check_at_start_up",
    "check_hooks_in_effect", "install_hooks", "missing_code_paths", "missing_hooks", "resolve",
]

RELIANCES: Tuple[UpstreamReliance, ...] = SERVER_RELIANCES + ENGINE_RELIANCES + KERNEL_RELIANCES


@dataclass(frozen=True)
class HookSpec:
    target: str
    hook: Callable
    hook_type: HookType


HOOKS: Tuple[HookSpec, ...] = (
    HookSpec("sglang.srt.server_args.ServerArgs.add_cli_args", launcher.after_add_cli_args,
             HookType.AFTER),
    HookSpec("sglang.srt.server_args.ServerArgs.from_cli_args", launcher.around_from_cli_args,
             HookType.AROUND),
    HookSpec("sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run",
             batch_selection.batch_selected, HookType.AFTER),
    HookSpec("sglang.srt.managers.scheduler.Scheduler.get_internal_state",
             reporting.add_report_to_internal_state, HookType.AFTER),
    HookSpec("sglang.srt.managers.scheduler_components.metrics_reporter."
             "SchedulerMetricsReporter.report_decode_stats",
             reporting.report_with_decode_stats, HookType.AFTER),
    HookSpec("sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
             request_guards.check_request_token_ids, HookType.BEFORE),
    HookSpec("sglang.srt.speculative.eagle_worker_v2._eagle_prefill_tail_tokens",
             prefill_tail_tokens.tail_tokens_without_sync, HookType.AROUND),
    HookSpec("sglang.srt.layers.attention.triton_backend.TritonAttnBackend.__init__",
             triton_verify.after_backend_init, HookType.AFTER),
    HookSpec("sglang.kernels.ops.attention.verify_splitkv.VerifySplitKV._alloc",
             triton_verify.zero_new_partials, HookType.AFTER),
)

_installed = False


def install_hooks() -> None:
    """Register every hook in ``HOOKS`` with sglang's HookRegistry (idempotent); sglang's
    ``load_plugins()`` applies them right after the plugins ran."""
    global _installed
    if _installed:
        return
    for spec in HOOKS:
        HookRegistry.register(spec.target, spec.hook, spec.hook_type)
    _installed = True


def _wraps_hook(obj: Any, hook: Callable) -> bool:
    """Whether ``hook`` is in a closure along ``obj``'s ``__wrapped__`` chain."""
    obj = getattr(obj, "__func__", obj)
    while obj is not None:
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook:
                    return True
            except ValueError:  # an empty cell
                continue
        obj = getattr(obj, "__wrapped__", None)
    return False


def missing_hooks() -> List[str]:
    """Targets in ``HOOKS`` on which our hook is not in effect."""
    missing = []
    for spec in HOOKS:
        try:
            in_effect = _wraps_hook(resolve(spec.target), spec.hook)
        except Exception:  # any failure to find the target means the hook is not in effect
            in_effect = False
        if not in_effect:
            missing.append(spec.target)
    return missing


def missing_code_paths() -> List[str]:
    """The ``code`` paths of ``RELIANCES`` that the installed sglang lacks."""
    missing = []
    for path in sorted({path for reliance in RELIANCES for path in reliance.code}):
        try:
            resolve(path)
        except Exception:  # any failure to find it means it is missing
            missing.append(path)
    return missing


def _refuse(what: str, hint: str = "") -> None:
    import sglang

    raise RuntimeError(
        f"sglang-dynamic-eagle: {what}; this package supports sglang=={SUPPORTED_SGLANG} "
        f"(installed: {sglang.__version__}){hint}."
    )


def check_hooks_in_effect() -> None:
    """Raise a one-line RuntimeError naming every hook sglang did not apply."""
    missing = missing_hooks()
    if missing:
        _refuse(f"hooks not in effect on {', '.join(missing)}",
                "; sglang's HookRegistry logged why above (\"Failed to apply hooks\"), unless "
                "another plugin wrapped the target without functools.wraps")


def check_at_start_up() -> None:
    """:func:`check_hooks_in_effect`, then a one-line RuntimeError naming every code path of
    ``RELIANCES`` the installed sglang lacks."""
    check_hooks_in_effect()
    missing = missing_code_paths()
    if missing:
        _refuse(f"sglang internals it relies on are missing: {', '.join(missing)}")
