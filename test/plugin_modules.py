"""Loads modules of the test-only plugin package (test/gpu/native_ops_plugin) for CPU tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

PLUGIN_DIR = Path(__file__).parent / "gpu" / "native_ops_plugin"


def plugin_path(module_name: str) -> Path:
    return PLUGIN_DIR / f"{module_name}.py"


def load_plugin_module(module_name: str) -> ModuleType:
    """A fresh copy of the module, so that each test's ``register()`` starts from scratch."""
    spec = importlib.util.spec_from_file_location(module_name, plugin_path(module_name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_register_changes_nothing_without(env: str, module_name: str, owner: object,
                                            attribute: str, monkeypatch) -> None:
    """Without ``env`` set, the plugin's ``register()`` leaves ``owner.attribute`` as it was."""
    monkeypatch.delenv(env, raising=False)
    original = getattr(owner, attribute)
    load_plugin_module(module_name).register()
    assert getattr(owner, attribute) is original
