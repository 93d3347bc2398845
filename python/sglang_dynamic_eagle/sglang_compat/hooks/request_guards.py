"""Request checks that keep one bad request from taking an sglang 0.5.17 server down.

A ``/generate`` (or OpenAI-compatible) request whose ``input_ids`` hold a negative id or one at or
above the vocabulary size reaches the embedding on the GPU, fails a device-side assert there and
kills the scheduler, with every request in flight; sglang 0.5.17 defines
``TokenizerManager._validate_input_ids_in_vocab`` but never calls it. The hook in
``registry`` runs :func:`check_token_ids` where sglang validates a request's length, so
a bad request gets HTTP 400 with the message below and the server keeps serving. It applies to
every server that loads this package, speculative or not.
"""

from __future__ import annotations

import numbers
from typing import Sequence

MULTIMODAL_FIELDS = ("image_data", "video_data", "audio_data")


def _is_token_id_type(token: object) -> bool:
    """An integer (Python or numpy, as the Python API may pass), not a bool."""
    return isinstance(token, numbers.Integral) and not isinstance(token, bool)


def check_token_ids(input_ids: Sequence[object], vocab_size: int) -> None:
    """Raise a one-line ValueError naming the first id that is not an integer in
    [0, vocab_size)."""
    plain_ints = all(type(token) is int for token in input_ids)  # the fast, common case
    if (plain_ints or all(_is_token_id_type(token) for token in input_ids)) and (
        not input_ids or (min(input_ids) >= 0 and max(input_ids) < vocab_size)
    ):
        return
    for position, token in enumerate(input_ids):
        if not _is_token_id_type(token) or not 0 <= token < vocab_size:
            raise ValueError(
                f"input_ids[{position}] is {token!r}, not a token id of this model: token ids "
                f"must be integers in [0, {vocab_size})."
            )


def _has_multimodal_data(request) -> bool:
    return any(getattr(request, name, None) for name in MULTIMODAL_FIELDS)


def check_request_token_ids(tokenizer_manager, request, input_ids, *args, **kwargs) -> None:
    """HookRegistry BEFORE hook on ``TokenizerManager._validate_one_request``.

    Checks ids the client sent; text the server tokenized is left alone, and so are multimodal
    requests, whose processors put placeholder ids into the prompt.
    """
    if getattr(request, "input_ids", None) is None or input_ids is None:
        return None
    if _has_multimodal_data(request):
        return None
    check_token_ids(input_ids, tokenizer_manager.model_config.vocab_size)
    return None
