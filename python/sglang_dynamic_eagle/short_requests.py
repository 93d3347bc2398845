"""Requests that ask for at most two tokens: their prefill skips the draft, exactly.

Such a request (scoring and classification loads ask for one or two tokens) gets its first
token from the prefill and its last from one decode step, in which a speculative step yields at
least the one token it has left: speculation cannot shorten it, and its own draft KV is never
read. Only a later request that reuses its prompt's prefix from the radix cache would read that
prefix's draft KV. So by default (``SGLANG_DYNAMIC_EAGLE_SHORT_PREFILL=separate-cache``) such
requests get a radix-cache namespace of their own, through sglang's per-request cache key
(``Req.extra_key``, which sglang itself namespaces the cache with, for LoRA adapters, cache
salts and elastic EP): they share prefixes with each other and never with other requests, so
no request that may speculate reads draft KV their prefill left stale, and a prefill batch of
such requests alone runs the target extend without the draft's
(``deferred_draft_prefill.DeferredDraftPrefill``). The price: a prefix shared by short and
other requests is computed and cached once for each kind.

``shared-cache`` skips the draft's prefill of such batches and keeps one cache for all (a later
request that reuses their prefix reads its stale draft KV: acceptance pays, never an output
token); ``with-draft`` runs EAGLE-3's prefill for them, as for every other request.

Pure Python: the hook runs in the scheduler process of every server that loads this package.
"""

from __future__ import annotations

import enum
import os
from typing import Iterable

from sglang_dynamic_eagle.flags import ALGORITHM_NAME
from sglang_dynamic_eagle.startup_errors import StartupError

SHORT_PREFILL_ENV = "SGLANG_DYNAMIC_EAGLE_SHORT_PREFILL"
# The prefill's token and one decode step's: speculation cannot shorten such a request.
MAX_TOKENS_THAT_CANNOT_SPECULATE = 2
RADIX_NAMESPACE = "sglang-dynamic-eagle:no-draft-prefill"


class ShortPrefill(enum.Enum):
    SEPARATE_CACHE = "separate-cache"
    SHARED_CACHE = "shared-cache"
    WITH_DRAFT = "with-draft"


def short_prefill() -> ShortPrefill:
    """What the prefill of short requests does, from the environment (checked at server
    start-up)."""
    raw = os.environ.get(SHORT_PREFILL_ENV, ShortPrefill.SEPARATE_CACHE.value)
    try:
        return ShortPrefill(raw)
    except ValueError:
        choices = ", ".join(choice.value for choice in ShortPrefill)
        raise StartupError(
            f"{SHORT_PREFILL_ENV}={raw!r} is invalid: set it to one of {choices} (default "
            f"{ShortPrefill.SEPARATE_CACHE.value}), or leave it unset."
        ) from None


def asks_at_most_two_tokens(request) -> bool:
    max_new_tokens = request.sampling_params.max_new_tokens
    return max_new_tokens is not None and max_new_tokens <= MAX_TOKENS_THAT_CANNOT_SPECULATE


def in_separate_cache(request) -> bool:
    """Whether the request's radix-cache key carries the short requests' namespace."""
    key = request.extra_key
    return key is not None and (key == RADIX_NAMESPACE or key.endswith("|" + RADIX_NAMESPACE))


def all_in_separate_cache(requests: Iterable) -> bool:
    return all(in_separate_cache(request) for request in requests)


def namespace_short_request(result, scheduler, request, *args, **kwargs):
    """AFTER hook on ``Scheduler._maybe_namespace_elastic_radix_cache``, which sglang runs on
    every new request before it queues it: an EAGLE3_DYNAMIC server with the default
    ``separate-cache`` puts a request that asks for at most two tokens into the short
    requests' radix namespace (after any namespace sglang gave it)."""
    if (
        (scheduler.server_args.speculative_algorithm or "").upper() == ALGORITHM_NAME
        and asks_at_most_two_tokens(request)
        and short_prefill() is ShortPrefill.SEPARATE_CACHE
    ):
        key = request.extra_key
        request.extra_key = f"{key}|{RADIX_NAMESPACE}" if key else RADIX_NAMESPACE
    return result
