"""The test-only float32 plugin (test/gpu/native_ops_plugin) routes sglang's custom ops to forward_native."""

import pytest

from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.utils.multi_platform import MultiPlatformOp

from plugin_modules import assert_register_changes_nothing_without, load_plugin_module


def _load_plugin():
    return load_plugin_module("sglang_de_native_ops")


@pytest.fixture
def restore_dispatch(monkeypatch) -> None:
    monkeypatch.setattr(MultiPlatformOp, "dispatch_forward", MultiPlatformOp.dispatch_forward)


def test_without_env_nothing_changes(restore_dispatch, monkeypatch) -> None:
    assert_register_changes_nothing_without("SGLANG_DE_TEST_NATIVE_OPS", "sglang_de_native_ops",
                                            MultiPlatformOp, "dispatch_forward", monkeypatch)


def test_with_env_ops_dispatch_to_forward_native_even_if_registered_twice(restore_dispatch, monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_DE_TEST_NATIVE_OPS", "1")
    original = MultiPlatformOp.dispatch_forward
    plugin = _load_plugin()
    plugin.register()
    assert MultiPlatformOp.dispatch_forward is not original
    plugin.register()
    norm = RMSNorm(8)
    assert norm._forward_method.__func__ is RMSNorm.forward_native
