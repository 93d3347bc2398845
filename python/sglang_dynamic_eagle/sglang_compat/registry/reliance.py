"""One entry of the registry (:class:`UpstreamReliance`), its kinds, and :func:`resolve`, which
finds a dotted path in the installed sglang (or in this package)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Tuple

HOOK = "hook"  # a HookRegistry hook (registry.HOOKS)
SUBCLASS = "subclass"  # a subclass of an sglang class
PRIVATE_CALL = "private call"  # a call of a private sglang function or method
ATTRIBUTE_SWAP = "attribute swap"  # an assignment to an attribute of an sglang object
BEHAVIOUR = "behaviour"  # a behaviour of sglang's code that ours depends on
KINDS = (HOOK, SUBCLASS, PRIVATE_CALL, ATTRIBUTE_SWAP, BEHAVIOUR)
SUPPORTED_SGLANG = "0.5.17"


@dataclass(frozen=True)
class UpstreamReliance:
    target: str
    how: str
    why: str
    drop_when: str
    kind: str
    # Dotted paths in sglang that must exist (resolved at start-up and by the CPU tests): the
    # code we call, subclass or hook, or the code that reads what we assign.
    code: Tuple[str, ...] = ()
    upstream: str = ""  # an upstream issue or PR, where one exists
    # Dotted paths of this package's functions that assign the attributes (ATTRIBUTE_SWAP):
    # test/test_layout.py finds every assignment to another object's attribute in the package
    # and requires its function here (or on its list of the package's own objects).
    patched_by: Tuple[str, ...] = ()


def resolve(dotted: str) -> Any:
    """The object at a dotted path: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(f"no importable module in {dotted!r}")
