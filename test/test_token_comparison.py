"""The GPU tests' output comparison rules (test/gpu/token_comparison.py), on hand-made outputs."""

import importlib.util
import sys
from pathlib import Path

import pytest

MODULE_PATH = Path(__file__).parent / "gpu" / "token_comparison.py"
_spec = importlib.util.spec_from_file_location("token_comparison", MODULE_PATH)
token_comparison = importlib.util.module_from_spec(_spec)
sys.modules["token_comparison"] = token_comparison  # dataclasses look their module up
_spec.loader.exec_module(token_comparison)



def plain_output(ids, top_at):
    """A plain server's output whose top (logprob, token id) after its own token are given per
    position: (best logprob, (logprob, token id), ...)."""
    return {
        "output_ids": ids,
        "meta_info": {
            "output_top_logprobs": [
                [(best, ids[i], None)] + [(logprob, token, None) for logprob, token in others]
                for i, (best, *others) in enumerate(top_at)
            ]
        },
    }


PLAIN = plain_output(
    [5, 6, 7],
    [(-0.5, (-1.5, 9)), (-1.0, (-1.0625, 8), (-1.125, 3)), (-0.2, (-0.2004, 4), (-0.3, 2))],
)
BF16 = token_comparison.bf16_flip_margin([PLAIN])  # 8 units of 0.0625


def compare(ids, flip_margin):
    return token_comparison.compare_outputs([{"output_ids": ids}], [PLAIN], flip_margin)


def test_equal_outputs_have_no_differences() -> None:
    comparison = compare([5, 6, 7], BF16)
    assert (comparison.ties, comparison.flips, comparison.failures) == ([], [], [])


def test_a_gap_below_the_tie_margin_is_a_tie_under_both_rules() -> None:
    for flip_margin in (None, BF16):
        comparison = compare([5, 6, 4], flip_margin)
        assert [(d.prompt, d.position) for d in comparison.ties] == [(0, 2)]
        assert not comparison.failures and comparison.above_tie_margin == 0


def test_a_third_choice_beyond_the_tie_margin_is_no_tie_under_a_tied_top_two() -> None:
    comparison = compare([5, 6, 2], None)
    assert [d.as_tuple() for d in comparison.failures] == [(0, 2, 0.0004, 0.1)]


def test_a_runner_up_within_the_bf16_margin_is_a_flip_only_under_the_bf16_rule() -> None:
    bf16 = compare([5, 8, 7], BF16)
    assert [d.as_tuple() for d in bf16.flips] == [(0, 1, 0.0625, 0.0625)]
    assert not bf16.failures and bf16.above_tie_margin == 1
    float32 = compare([5, 8, 7], None)
    assert [d.as_tuple() for d in float32.failures] == [(0, 1, 0.0625, 0.0625)]


def test_a_third_choice_within_the_bf16_margin_is_a_flip() -> None:
    comparison = compare([5, 3, 7], BF16)
    assert [d.as_tuple() for d in comparison.flips] == [(0, 1, 0.0625, 0.125)]


def test_a_token_outside_the_plain_top_logprobs_fails_even_at_a_small_margin() -> None:
    comparison = compare([5, 11, 7], BF16)
    # Its gap is unknown, but above the last listed logprob's (-1.0 against -1.125).
    assert [d.as_tuple() for d in comparison.failures] == [(0, 1, 0.0625, ">0.12500")]
    assert comparison.failures[0].gap == float("inf") and comparison.failures[0].gap_above == 0.125


def test_a_runner_up_beyond_the_bf16_margin_fails() -> None:
    comparison = compare([9, 6, 7], BF16)
    assert [d.as_tuple() for d in comparison.failures] == [(0, 0, 1.0, 1.0)]


def test_a_shorter_output_fails() -> None:
    comparison = compare([5, 6], BF16)
    assert [d.position for d in comparison.failures] == [2]


def test_the_bf16_margin_is_eight_units_read_from_the_plain_margins() -> None:
    assert token_comparison.logit_unit([PLAIN]) == pytest.approx(0.0625)  # the tie ignored
    assert BF16 == pytest.approx(0.5)
    only_ties = plain_output([5], [(-0.2, (-0.2004, 4))])
    assert token_comparison.bf16_flip_margin([only_ties]) == 0.0


def test_flip_allowance_grows_with_the_reference_count() -> None:
    assert token_comparison.flip_allowance(0) == 3
    assert token_comparison.flip_allowance(36) == 15


def ids_outputs(*id_lists):
    return [{"output_ids": list(ids)} for ids in id_lists]


PLAIN_IDS = ids_outputs([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16])


def test_agreed_fraction_counts_tokens_before_each_first_difference():
    outputs = ids_outputs([1, 2, 3, 4], [5, 0, 0, 0], [0, 10, 11, 12], [13, 14, 15])
    # 4 + 1 + 0 + 3 of 16 (a shorter output agrees up to its end)
    assert token_comparison.agreed_fraction(outputs, PLAIN_IDS) == 8 / 16
    assert token_comparison.differing_prompts(outputs, PLAIN_IDS) == 3


def test_within_the_reference_when_it_differs_as_much():
    reference = ids_outputs([1, 2, 0, 0], [5, 6, 7, 8], [9, 10, 11, 0], [13, 14, 15, 16])
    server = ids_outputs([1, 2, 3, 4], [5, 6, 0, 0], [9, 10, 11, 0], [13, 14, 15, 16])
    verdict = token_comparison.reference_verdict(server, reference, PLAIN_IDS)
    assert (verdict.differing, verdict.reference_differing) == (2, 2)
    assert verdict.within


def test_a_server_that_diverges_early_everywhere_is_outside_the_reference():
    """Four differing prompts are within the count allowance of two (2 + 2 + 3), but the share
    of plain's tokens before the first differences falls from 13/16 to 4/16."""
    reference = ids_outputs([1, 2, 0, 0], [5, 6, 7, 8], [9, 10, 11, 0], [13, 14, 15, 16])
    broken = ids_outputs([1, 0, 0, 0], [5, 0, 0, 0], [9, 0, 0, 0], [13, 0, 0, 0])
    verdict = token_comparison.reference_verdict(broken, reference, PLAIN_IDS)
    assert verdict.differing <= verdict.reference_differing + token_comparison.flip_allowance(2)
    assert not verdict.within
    assert "differing prompts 4 (reference 2)" in verdict.summary()
