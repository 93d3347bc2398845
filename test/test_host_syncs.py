"""HostSyncCounter: which warnings count, per kind of forward, and the debug mode's reset."""

from __future__ import annotations

import warnings
from typing import List

import pytest
import torch

from sglang_dynamic_eagle import host_syncs
from sglang_dynamic_eagle.host_syncs import SYNC_CHECK_ENV, HostSyncCounter, sync_check_enabled


@pytest.fixture
def debug_modes(monkeypatch) -> List:
    """The modes set, in order; the mode before the first watch is 0 (PyTorch's default)."""
    modes: List = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    return modes


def synchronise() -> None:
    warnings.warn(f"{host_syncs.SYNC_WARNING_TEXT} (Triggered internally)", UserWarning)


def test_synchronising_call_sites_are_counted_per_kind(debug_modes) -> None:
    counter = HostSyncCounter(enabled=True)
    with counter.watch("prefill"):
        synchronise()
        synchronise()
        warnings.warn("an unrelated deprecation", DeprecationWarning)
    with counter.watch("plain"):
        pass
    report = counter.report()
    assert list(report.values()) == [2]
    (site,) = report
    assert site.startswith("prefill test_host_syncs.py:")
    assert debug_modes == ["warn", 0, "warn", 0]


def test_the_previous_debug_mode_is_restored_when_the_forward_fails(debug_modes) -> None:
    counter = HostSyncCounter(enabled=True)
    with pytest.raises(RuntimeError):
        with counter.watch("speculative"):
            raise RuntimeError("forward failed")
    assert debug_modes == ["warn", 0]


def test_off_by_default_and_then_free(debug_modes, monkeypatch) -> None:
    monkeypatch.delenv(SYNC_CHECK_ENV, raising=False)
    assert not sync_check_enabled()
    counter = HostSyncCounter(enabled=sync_check_enabled())
    with counter.watch("prefill"):
        pass
    assert counter.report() == {} and debug_modes == []
    monkeypatch.setenv(SYNC_CHECK_ENV, "1")
    assert sync_check_enabled()
