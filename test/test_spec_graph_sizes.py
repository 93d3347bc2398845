"""Speculative graph sizing on CPU: Config.speculative_graph_max_bs, spec_algo._limit_speculative_graphs.

``_limit_speculative_graphs`` gets a stand-in server_args holding sglang's real
``PhaseConfig``; the threshold comes from ``SGLANG_DYNAMIC_EAGLE_FLAGS`` as in a
scheduler process.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import List, Optional

import pytest

from sglang.srt.model_executor.cuda_graph_config import PhaseConfig

from sglang_dynamic_eagle.config import ENV_VAR, Config
from sglang_dynamic_eagle.sglang_compat.spec_algo import _limit_speculative_graphs

pytestmark = pytest.mark.usefixtures("clean_flags_env")

# What sglang generates for an H200 at tp 1 (max_bs 256), abbreviated.
FULL_BS = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 96, 128, 160, 192, 224, 256]


def _server_args(bs: Optional[List[int]], max_bs: Optional[int] = None) -> SimpleNamespace:
    decode = PhaseConfig(backend="full", bs=None if bs is None else list(bs), max_bs=max_bs)
    return SimpleNamespace(cuda_graph_config=SimpleNamespace(decode=decode))


def _set_flags(monkeypatch: pytest.MonkeyPatch, **values: int) -> None:
    monkeypatch.setenv(ENV_VAR, json.dumps(values))


# ---------------------------------------------------------------- speculative_graph_max_bs


@pytest.mark.parametrize(
    "threshold, graph_max_bs, expected",
    [
        (None, 256, 256),  # automatic policy: every size, the costs decide
        (None, 8, 8),
        (24, 256, 48),  # a fixed threshold of 24: stock EAGLE's 48
        (20, 256, 40),
        (1, 256, 2),
        (100, 64, 64),  # capped at the largest graph
        (32, 64, 64),  # 2 * 32 == 64 exactly
        (33, 64, 64),
        (0, 256, 256),  # always speculate: every size
        (0, 8, 8),
        (5, 1, 1),
    ],
)
def test_speculative_graph_max_bs(threshold: Optional[int], graph_max_bs: int, expected: int) -> None:
    config = Config(disable_batch_threshold=threshold)
    assert config.speculative_graph_max_bs(graph_max_bs) == expected


# ---------------------------------------------------------------- _limit_speculative_graphs


def test_automatic_policy_keeps_every_size() -> None:
    server_args = _server_args(FULL_BS, max_bs=256)
    _limit_speculative_graphs(server_args)
    decode = server_args.cuda_graph_config.decode
    assert decode.bs == FULL_BS
    assert decode.max_bs == 256


def test_threshold_24_keeps_sizes_up_to_48(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_flags(monkeypatch, disable_batch_threshold=24)
    server_args = _server_args(FULL_BS, max_bs=256)
    _limit_speculative_graphs(server_args)
    decode = server_args.cuda_graph_config.decode
    assert decode.bs == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48]
    assert decode.max_bs == 256


def test_max_bs_none_is_filled_with_the_full_size(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_flags(monkeypatch, disable_batch_threshold=24)
    server_args = _server_args(FULL_BS, max_bs=None)
    _limit_speculative_graphs(server_args)
    decode = server_args.cuda_graph_config.decode
    assert decode.bs == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48]
    assert decode.max_bs == 256


def test_spec_max_missing_from_the_list_is_appended(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_flags(monkeypatch, disable_batch_threshold=20)  # spec max 40
    server_args = _server_args([1, 2, 4, 8, 16, 32, 64, 128])
    _limit_speculative_graphs(server_args)
    decode = server_args.cuda_graph_config.decode
    assert decode.bs == [1, 2, 4, 8, 16, 32, 40]
    assert decode.max_bs == 128


def test_small_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_flags(monkeypatch, disable_batch_threshold=3, enable_batch_threshold=2)  # spec max 6
    server_args = _server_args([1, 2, 4, 8, 16], max_bs=16)
    _limit_speculative_graphs(server_args)
    decode = server_args.cuda_graph_config.decode
    assert decode.bs == [1, 2, 4, 6]
    assert decode.max_bs == 16


def test_threshold_zero_keeps_every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_flags(monkeypatch, disable_batch_threshold=0)
    server_args = _server_args([1, 2, 4, 8, 160])
    _limit_speculative_graphs(server_args)
    decode = server_args.cuda_graph_config.decode
    assert decode.bs == [1, 2, 4, 8, 160]
    assert decode.max_bs == 160


def test_threshold_above_the_largest_graph_keeps_every_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _set_flags(monkeypatch, disable_batch_threshold=100)  # 200 > 64
    server_args = _server_args([1, 2, 4, 8, 16, 32, 64], max_bs=64)
    _limit_speculative_graphs(server_args)
    decode = server_args.cuda_graph_config.decode
    assert decode.bs == [1, 2, 4, 8, 16, 32, 64]
    assert decode.max_bs == 64


@pytest.mark.parametrize("bs", [None, []])
def test_no_decode_sizes_is_left_alone(bs: Optional[List[int]]) -> None:
    server_args = _server_args(bs, max_bs=None)
    _limit_speculative_graphs(server_args)
    decode = server_args.cuda_graph_config.decode
    assert decode.bs == bs
    assert decode.max_bs is None


def test_second_call_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """handle_server_args may run again on already-limited arguments."""
    _set_flags(monkeypatch, disable_batch_threshold=24)
    server_args = _server_args(FULL_BS, max_bs=256)
    _limit_speculative_graphs(server_args)
    _limit_speculative_graphs(server_args)
    decode = server_args.cuda_graph_config.decode
    assert decode.bs == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48]
    assert decode.max_bs == 256


def test_env_is_read_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_flags(monkeypatch, disable_batch_threshold=8, enable_batch_threshold=4)  # spec max 16
    first = _server_args(FULL_BS)
    _limit_speculative_graphs(first)
    _set_flags(monkeypatch, disable_batch_threshold=28)  # spec max 56
    second = _server_args(FULL_BS)
    _limit_speculative_graphs(second)
    assert first.cuda_graph_config.decode.bs == [1, 2, 4, 8, 12, 16]
    assert second.cuda_graph_config.decode.bs == [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56]
    assert first.cuda_graph_config.decode.max_bs == 256
    assert second.cuda_graph_config.decode.max_bs == 256
