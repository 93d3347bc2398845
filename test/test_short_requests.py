"""short_requests.py: the short requests' radix namespace, on CPU (sglang's own RadixCache)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

from sglang_dynamic_eagle.short_requests import (
    RADIX_NAMESPACE,
    SHORT_PREFILL_ENV,
    ShortPrefill,
    in_separate_cache,
    namespace_short_request,
    short_prefill,
)
from sglang_dynamic_eagle.startup_errors import StartupError


def _scheduler(algorithm: Optional[str] = "EAGLE3_DYNAMIC") -> SimpleNamespace:
    return SimpleNamespace(server_args=SimpleNamespace(speculative_algorithm=algorithm))


def _request(max_new_tokens: Optional[int], extra_key: Optional[str] = None) -> SimpleNamespace:
    return SimpleNamespace(sampling_params=SimpleNamespace(max_new_tokens=max_new_tokens),
                           extra_key=extra_key)


def _namespaced(request: SimpleNamespace, scheduler: SimpleNamespace = None) -> SimpleNamespace:
    assert namespace_short_request("result", scheduler or _scheduler(), request) == "result"
    return request


def test_the_default_is_a_separate_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SHORT_PREFILL_ENV, raising=False)
    assert short_prefill() is ShortPrefill.SEPARATE_CACHE
    for choice in ShortPrefill:
        monkeypatch.setenv(SHORT_PREFILL_ENV, choice.value)
        assert short_prefill() is choice


def test_a_bad_value_is_refused_in_one_line_naming_the_variable_and_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SHORT_PREFILL_ENV, "separate")
    with pytest.raises(StartupError) as error:
        short_prefill()
    message = str(error.value)
    assert "\n" not in message and SHORT_PREFILL_ENV in message
    assert all(choice.value in message for choice in ShortPrefill)


@pytest.mark.parametrize("max_new_tokens", [0, 1, 2])
def test_a_request_that_asks_for_two_tokens_or_fewer_gets_the_namespace(max_new_tokens) -> None:
    request = _namespaced(_request(max_new_tokens))
    assert request.extra_key == RADIX_NAMESPACE and in_separate_cache(request)


def test_the_namespace_comes_after_the_one_sglang_gave(monkeypatch) -> None:
    request = _namespaced(_request(1, extra_key="salt|elastic_ep_size=8"))
    assert request.extra_key == f"salt|elastic_ep_size=8|{RADIX_NAMESPACE}"
    assert in_separate_cache(request)
    assert not in_separate_cache(_request(1, extra_key=f"{RADIX_NAMESPACE}-not"))


@pytest.mark.parametrize("max_new_tokens", [3, 256, None])
def test_other_requests_keep_their_key(max_new_tokens) -> None:
    request = _namespaced(_request(max_new_tokens, extra_key="salt"))
    assert request.extra_key == "salt" and not in_separate_cache(request)


@pytest.mark.parametrize("algorithm", ["EAGLE3", "EAGLE", None])
def test_other_servers_keep_every_key(algorithm) -> None:
    request = _namespaced(_request(1), _scheduler(algorithm))
    assert request.extra_key is None


def test_the_algorithm_name_is_matched_as_the_launcher_accepts_it() -> None:
    assert in_separate_cache(_namespaced(_request(1), _scheduler("eagle3_dynamic")))


@pytest.mark.parametrize("choice", [ShortPrefill.SHARED_CACHE, ShortPrefill.WITH_DRAFT])
def test_only_the_separate_cache_namespaces(monkeypatch, choice) -> None:
    monkeypatch.setenv(SHORT_PREFILL_ENV, choice.value)
    assert _namespaced(_request(1)).extra_key is None


def test_sglangs_radix_cache_never_matches_a_short_requests_prefix_for_another_request() -> None:
    """The property the separate cache relies on, on the radix cache an EAGLE server builds
    (bigram keys): a prompt cached by a short request is matched by short requests only."""
    cache = RadixCache(CacheInitParams(disable=False, req_to_token_pool=None,
                                       token_to_kv_pool_allocator=None, page_size=1,
                                       is_eagle=True))
    prompt = list(range(100, 140))
    short = _namespaced(_request(2))
    cache.insert(InsertParams(key=RadixKey(prompt, short.extra_key, is_bigram=True),
                              value=torch.arange(len(prompt) - 1)))

    def matched(request: SimpleNamespace) -> int:
        key = RadixKey(prompt + [7], request.extra_key, is_bigram=True)
        return len(cache.match_prefix(MatchPrefixParams(key=key)).device_indices)

    assert matched(_namespaced(_request(1))) == len(prompt) - 1
    assert matched(_namespaced(_request(64))) == 0
    assert matched(_namespaced(_request(None))) == 0
