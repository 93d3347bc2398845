"""HostSyncCounter: which warnings count, per kind of forward, and the debug mode's reset; the
worker with the check, which the plugin builds only with the variable set."""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import List

import pytest
import torch

from sglang_dynamic_eagle.config import SYNC_CHECK_ENV, load_config
from sglang_dynamic_eagle.engine.worker import DynamicEagleWorker
from sglang_dynamic_eagle.observability import host_syncs
from sglang_dynamic_eagle.observability.host_syncs import HostSyncCounter, with_host_sync_check
from sglang_dynamic_eagle.policy import DecodeMode
from sglang_dynamic_eagle.sglang_compat import plugin, registry


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
    counter = HostSyncCounter()
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
    counter = HostSyncCounter()
    with pytest.raises(RuntimeError):
        with counter.watch("speculative"):
            raise RuntimeError("forward failed")
    assert debug_modes == ["warn", 0]


def test_the_plugin_builds_the_checked_worker_only_with_the_variable(monkeypatch) -> None:
    monkeypatch.setattr(registry, "check_at_start_up", lambda: None)
    monkeypatch.delenv(SYNC_CHECK_ENV, raising=False)
    assert not load_config().sync_check
    assert plugin._worker_class(None) is DynamicEagleWorker
    for value in ("0", "yes", ""):
        monkeypatch.setenv(SYNC_CHECK_ENV, value)
        assert plugin._worker_class(None) is DynamicEagleWorker, value
    monkeypatch.setenv(SYNC_CHECK_ENV, "1")
    checked = plugin._worker_class(None)
    assert issubclass(checked, DynamicEagleWorker) and checked is not DynamicEagleWorker


class _Steps(DynamicEagleWorker):
    """The worker's prefill and decode steps, each warning of one synchronising call."""

    def __init__(self) -> None:  # no sglang worker behind it
        pass

    def _prefill(self, batch, on_publish, grammar_barrier):
        synchronise()
        return "prefilled"

    def _decode(self, mode, batch, on_publish, grammar_barrier):
        synchronise()
        return mode.value

    def report(self) -> dict:
        return {"speculative_steps": 0}


def test_the_checked_worker_counts_syncs_per_kind_of_forward(debug_modes) -> None:
    checked = with_host_sync_check(_Steps)()
    assert checked._prefill(SimpleNamespace(), None, None) == "prefilled"
    assert checked._decode(DecodeMode.PLAIN, SimpleNamespace(), None, None) == "plain"
    assert checked._decode(DecodeMode.SPECULATIVE, SimpleNamespace(), None, None) == "speculative"
    report = checked.report()
    assert report["speculative_steps"] == 0
    assert sorted(site.split()[0] for site in report["host_syncs"]) == [
        "plain", "prefill", "speculative"]
    assert debug_modes == ["warn", 0] * 3
