"""The test-only slow-side-stream plugin (test/gpu/native_ops_plugin/sglang_de_slow_side_stream.py)."""

import pytest

from sglang_dynamic_eagle.engine import early_first_token
from sglang_dynamic_eagle.engine.early_first_token import CudaStreams, EarlyFirstToken

from plugin_modules import assert_register_changes_nothing_without, load_plugin_module

MODULE = "sglang_de_slow_side_stream"
SLOW_ENV = "SGLANG_DE_TEST_SLOW_SIDE_STREAM"


@pytest.fixture(autouse=True)
def restore(monkeypatch) -> None:
    monkeypatch.setattr(CudaStreams, "use", CudaStreams.use)
    monkeypatch.setattr(EarlyFirstToken, "war_fastpath_read_done_event", None, raising=False)


def test_without_the_variable_nothing_changes(monkeypatch) -> None:
    assert_register_changes_nothing_without(SLOW_ENV, MODULE, CudaStreams, "use", monkeypatch)


def test_a_bad_value_is_refused(monkeypatch) -> None:
    monkeypatch.setenv(SLOW_ENV, "fast")
    with pytest.raises(ValueError, match="slow-no-barrier"):
        load_plugin_module(MODULE).register()


@pytest.mark.parametrize("value, barrier_kept", [("slow", True), ("slow-no-barrier", False)])
def test_the_side_stream_spins_and_only_the_control_loses_the_barrier(monkeypatch, value,
                                                                     barrier_kept) -> None:
    original = CudaStreams.use
    monkeypatch.setenv(SLOW_ENV, value)
    load_plugin_module(MODULE).register()
    assert early_first_token.CudaStreams.use is not original
    early = EarlyFirstToken(True)
    early.war_fastpath_read_done_event = "side stream's end"
    assert (early.war_fastpath_read_done_event is not None) is barrier_kept
