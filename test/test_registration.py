"""The plugin registers EAGLE3_DYNAMIC and its flags through sglang's plugin machinery."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from sglang_dynamic_eagle import config
from sglang_dynamic_eagle.policy import DISABLE_FLAG, ENABLE_FLAG, PATIENCE_FLAG

pytestmark = pytest.mark.usefixtures("clean_flags_env")


def test_entry_point_is_declared():
    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("dynamic_eagle") == "sglang_dynamic_eagle.sglang_compat.plugin:register"


def test_from_string_returns_our_spec(loaded_plugins):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    algo = SpeculativeAlgorithm.from_string("EAGLE3_DYNAMIC")
    assert algo is loaded_plugins
    assert isinstance(algo, CustomSpecAlgo)
    assert algo.name == "EAGLE3_DYNAMIC"
    # sglang upper-cases the CLI value before the lookup; from_string does too.
    assert SpeculativeAlgorithm.from_string("eagle3_dynamic") is algo


def test_spec_behaves_like_eagle3(loaded_plugins):
    algo = loaded_plugins
    assert algo.is_eagle() is True
    assert algo.is_eagle3() is True
    assert algo.is_speculative() is True
    assert algo.is_some() is True
    assert algo.is_none() is False
    for predicate in ("is_standalone", "is_ngram", "is_dflash", "is_dspark", "is_frozen_kv_mtp"):
        assert getattr(algo, predicate)() is False, predicate
    # Methods that SpeculativeAlgorithm has but CustomSpecAlgo lacks; sglang calls them
    # on the algorithm object for EAGLE-family algorithms.
    assert callable(algo.create_future_map)
    assert algo.need_topk() is True
    assert algo.carries_draft_hidden_states() is True
    assert algo.has_draft_kv() is True


def test_spec_validator_checks_hooks_then_flags(loaded_plugins, monkeypatch):
    from sglang_dynamic_eagle.sglang_compat import launcher, plugin, registry

    assert loaded_plugins.validate_server_args is plugin._validate_server_args
    calls = []
    monkeypatch.setattr(registry, "check_hooks_in_effect", lambda: calls.append("hooks"))
    monkeypatch.setattr(launcher, "validate_server_args", lambda args: calls.append("flags"))
    plugin._validate_server_args(object())
    assert calls == ["hooks", "flags"]


def test_register_is_idempotent(loaded_plugins):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_dynamic_eagle.sglang_compat import plugin

    plugin.register()
    assert SpeculativeAlgorithm.from_string("EAGLE3_DYNAMIC") is loaded_plugins


def test_register_leaves_the_excepthook_alone(loaded_plugins, monkeypatch):
    """sglang loads plugins in every process, whatever the algorithm; the one-line printing of
    start-up refusals is installed for EAGLE3_DYNAMIC command lines only (test_startup_errors)."""
    from sglang_dynamic_eagle.sglang_compat import plugin

    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    plugin.register()
    assert sys.excepthook is sys.__excepthook__


def test_serverargs_hooks_are_applied(loaded_plugins):
    """HookRegistry re-wraps the staticmethod/classmethod; check the result on the class."""
    from sglang.srt.server_args import ServerArgs

    assert isinstance(ServerArgs.__dict__["add_cli_args"], staticmethod)
    assert isinstance(ServerArgs.__dict__["from_cli_args"], classmethod)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    for flag in (DISABLE_FLAG, ENABLE_FLAG, PATIENCE_FLAG):
        assert flag in parser._option_string_actions, flag


def test_launch_server_help_lists_flags():
    env = dict(os.environ)
    env.pop(config.ENV_VAR, None)
    proc = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for flag in (DISABLE_FLAG, ENABLE_FLAG, PATIENCE_FLAG):
        assert flag in proc.stdout, f"{flag} missing from --help"
    assert "EAGLE3_DYNAMIC" in proc.stdout
