"""Server configurations EAGLE3_DYNAMIC refuses at start-up, as one table.

Each row: the flag as the message names it, when it applies, why it cannot work, and the fix.
:func:`unsupported_reason` returns the one-line message of the first row that applies (like
sglang's ``adaptive_unsupported_reason``); ``launcher.validate_server_args`` raises it on the parsed
command line (before sglang builds ``ServerArgs``) and again inside ``ServerArgs.__post_init__``,
before any GPU work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

from sglang_dynamic_eagle.policy import ALGORITHM_NAME

_USE_EAGLE3 = "use --speculative-algorithm EAGLE3 instead"
Getter = Callable[[str], Any]


@dataclass(frozen=True)
class UnsupportedCombination:
    flag: Callable[[Getter], str]  # the flag as the message names it (may show its value)
    applies: Callable[[Getter], bool]
    why: str
    fix: str

    def message(self, get: Getter) -> str:
        return (
            f"--speculative-algorithm {ALGORITHM_NAME} does not support {self.flag(get)}: "
            f"{self.why}; {self.fix}."
        )


def _named(flag: str) -> Callable[[Getter], str]:
    return lambda get: flag


def _is_set(name: str) -> Callable[[Getter], bool]:
    return lambda get: bool(get(name))


UNSUPPORTED: Tuple[UnsupportedCombination, ...] = (
    UnsupportedCombination(
        _named("--enable-dp-attention"),
        _is_set("enable_dp_attention"),
        "each DP rank schedules its own decode batch, so ranks would pick different modes "
        "(this needs an all-reduce of the mode decision, not implemented)",
        f"remove --enable-dp-attention or {_USE_EAGLE3}",
    ),
    UnsupportedCombination(
        _named("--pp-size > 1"),
        lambda get: (get("pp_size") or 1) > 1,
        "the plain-decode path and draft catch-up are written for one pipeline stage",
        "use --pp-size 1",
    ),
    UnsupportedCombination(
        _named("--speculative-adaptive"),
        _is_set("speculative_adaptive"),
        f"{ALGORITHM_NAME} replaces adaptive speculation (it switches between speculative and "
        "plain decoding itself)",
        "remove --speculative-adaptive",
    ),
    UnsupportedCombination(
        _named("--enable-two-batch-overlap"),
        _is_set("enable_two_batch_overlap"),
        "the plain-decode path is not implemented for two micro-batches",
        f"remove --enable-two-batch-overlap or {_USE_EAGLE3}",
    ),
    UnsupportedCombination(
        _named("--enable-pdmux"),
        _is_set("enable_pdmux"),
        "PD-multiplexing runs its own decode path, which does not switch modes",
        "remove --enable-pdmux",
    ),
    UnsupportedCombination(
        lambda get: f"--disaggregation-mode {get('disaggregation_mode')}",
        lambda get: get("disaggregation_mode") not in (None, "null"),
        "the prefill-to-decode handover of draft state is not implemented for it",
        f"run without --disaggregation-mode or {_USE_EAGLE3}",
    ),
    UnsupportedCombination(
        _named("LoRA (--enable-lora / --lora-paths)"),
        lambda get: bool(get("enable_lora") or get("lora_paths")),
        "the plain-decode path is not implemented for LoRA batches",
        "remove --enable-lora and --lora-paths",
    ),
    UnsupportedCombination(
        lambda get: (
            "--speculative-num-steps 0"
            if get("speculative_num_steps") == 0
            else "--speculative-num-draft-tokens 1"
        ),
        lambda get: get("speculative_num_steps") == 0 or get("speculative_num_draft_tokens") == 1,
        "without draft tokens a speculative step verifies only its bonus token, which is plain "
        "decoding with EAGLE's draft and verify work on top",
        "use at least one draft step (--speculative-num-steps 1 or more) or run without "
        "--speculative-algorithm",
    ),
    UnsupportedCombination(
        lambda get: f"--speculative-eagle-topk {get('speculative_eagle_topk')} without both "
        "--speculative-num-steps and --speculative-num-draft-tokens",
        lambda get: (get("speculative_eagle_topk") or 1) > 1
        and (get("speculative_num_steps") is None or get("speculative_num_draft_tokens") is None),
        "a tree's step count and draft-token count do not follow from each other",
        "give both (sglang's EAGLE3 tree for Llama: --speculative-num-steps 5 "
        "--speculative-num-draft-tokens 8), or none of the three shape flags for EAGLE3's default shape",
    ),
    UnsupportedCombination(
        _named("--enable-attn-tp-input-scattered"),
        _is_set("enable_attn_tp_input_scattered"),
        'sglang compares the algorithm name with "EAGLE3" as a string (layers/communicator.py) '
        "and would enable scattered input, which EAGLE-3 does not support",
        "remove --enable-attn-tp-input-scattered",
    ),
    UnsupportedCombination(
        _named("--use-ray"),
        _is_set("use_ray"),
        "sglang's Ray scheduler actors (srt/ray/scheduler_actor.py) do not call load_plugins() "
        "and do not inherit the launcher's environment, so they know neither the algorithm "
        "nor its flags",
        "run without --use-ray",
    ),
    UnsupportedCombination(
        _named("--speculative-use-rejection-sampling"),
        _is_set("speculative_use_rejection_sampling"),
        'sglang enables it only for algorithm names "EAGLE"/"EAGLE3" '
        "(arg_groups/speculative_hook.py)",
        "remove --speculative-use-rejection-sampling",
    ),
)


def resolved(server_args) -> Any:
    """sglang's mid-resolution view (fields other handlers declared but not yet wrote) of a
    ``ServerArgs``; parsed command-line arguments (``launcher.refuse_before_resolution``) as they
    are."""
    from sglang.srt.server_args import ServerArgs

    if not isinstance(server_args, ServerArgs):
        return server_args
    try:
        from sglang.srt.arg_groups.overrides import resolved_view

        return resolved_view(server_args)
    except ImportError:  # pragma: no cover - an sglang without the view
        return server_args


def unsupported_reason(server_args) -> Optional[str]:
    """The one-line refusal of the first unsupported combination in ``server_args``, or None."""
    view = resolved(server_args)

    def get(name: str) -> Any:
        return getattr(view, name, getattr(server_args, name, None))

    for combination in UNSUPPORTED:
        if combination.applies(get):
            return combination.message(get)
    return None
