"""How the GPU tests compare a server's greedy outputs with a plain server's.

Every output is compared at its first differing position, where both servers had the same
prefix; the plain server's top logprobs there (requested with ``top_logprobs_num=TOP_LOGPROBS``)
say how far the other server's token was from the plain choice: its *gap*, the plain best
logprob minus the plain logprob of that token (infinite if the token is not among the plain top
``TOP_LOGPROBS``). The gap is never below the plain top-2 margin.

* float32 servers (the tiny pair): a difference counts as a numerical tie only where the gap is
  below ``TIE_MARGIN`` (1e-3; so the plain top-2 margin is too); every other difference fails.
* bf16 servers also allow a *bf16 flip*: a gap of at most ``BF16_FLIP_UNITS`` units in the last
  place of the top logits. The logits are bf16, so every margin is a multiple of that unit (the
  8B-shaped dummy model's top logits lie in [4, 8), where it is 0.03125), and a kernel that
  reduces a row in another order (a verify over 4 tokens against a decode over one, a batch of
  another size, a KV entry written by another kernel) moves a logit by a few units: top-2
  margins of 1 to 4 units at every difference of the first two runs (2026-12-01), three of them
  (one from sglang's own EAGLE3) to a token other than the plain second choice at a margin of
  one unit, and gaps of at most 3 units under this rule; the margin allows twice the largest. The unit is read from the plain outputs themselves (their smallest
  top-2 margin above the tie margin), so the rule fits any bf16 model. Such a difference is not
  a tie under the 1e-3 rule, and sglang's own EAGLE3 server makes it as often (the 8B-shaped
  lossless test measures both). A token outside the plain top ``TOP_LOGPROBS``, or one whose
  gap exceeds the margin, fails: a broken K/V write fails 41 of 64 prompts so (the negative
  control of 2026-12-01). ``TOP_LOGPROBS`` is 32, not 5, so that on a nearly flat dummy model the
  list is likelier to reach past the flip margin: with 5, the 8B-shaped suite on triton
  (2026-12-07) failed on a token outside the top 5 at a top-2 margin of 2 units, its gap unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

TIE_MARGIN = 1e-3
BF16_FLIP_UNITS = 8
TOP_LOGPROBS = 32


def first_difference(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def top_logprobs(plain_output: dict, position: int) -> List[tuple]:
    """The plain server's top (logprob, token id) at one output position, best first."""
    entries = plain_output["meta_info"]["output_top_logprobs"][position]
    return sorted(((entry[0], entry[1]) for entry in entries), reverse=True)


def top2_margin(plain_output: dict, position: int) -> float:
    """Top-1 minus top-2 logprob of the plain server at one output position."""
    (best, _), (second, _) = top_logprobs(plain_output, position)[:2]
    return best - second


def gap_of(plain_output: dict, position: int, token: int) -> float:
    """The plain best logprob minus the plain logprob of ``token`` at one output position
    (infinite if ``token`` is not among the plain top logprobs)."""
    ranked = top_logprobs(plain_output, position)
    logprob = next((lp for lp, token_id in ranked if token_id == token), float("-inf"))
    return ranked[0][0] - logprob


def logit_unit(plain: Sequence[dict]) -> float:
    """The smallest top-2 margin above the tie margin over every position of the plain outputs:
    with bf16 logits, one unit in the last place of the top logits (0.0 if there is none)."""
    margins = (
        top2_margin(output, position)
        for output in plain
        for position in range(len(output["meta_info"]["output_top_logprobs"]))
    )
    return min((margin for margin in margins if margin >= TIE_MARGIN), default=0.0)


def bf16_flip_margin(plain: Sequence[dict]) -> float:
    return BF16_FLIP_UNITS * logit_unit(plain)


@dataclass(frozen=True)
class FirstDifference:
    prompt: int
    position: int
    margin: float  # the plain server's top-2 logprob margin there
    gap: float  # the plain best logprob minus the plain logprob of the other server's token
    # Where that token is not among the plain top logprobs (gap infinite): the plain best minus
    # the last one listed, which its gap is above.
    gap_above: float = 0.0

    def as_tuple(self) -> tuple:
        gap = f">{self.gap_above:.5f}" if self.gap == float("inf") and self.gap_above else round(self.gap, 5)
        return (self.prompt, self.position, round(self.margin, 5), gap)


@dataclass
class Comparison:
    ties: List[FirstDifference] = field(default_factory=list)
    flips: List[FirstDifference] = field(default_factory=list)
    failures: List[FirstDifference] = field(default_factory=list)

    @property
    def above_tie_margin(self) -> int:
        """Differences that the 1e-3 tie rule alone would fail."""
        return len(self.flips) + len(self.failures)

    def summary(self) -> str:
        largest_flip = max((d.gap for d in self.flips), default=0.0)
        return (
            f"ties {len(self.ties)}, bf16 flips {len(self.flips)} (largest gap "
            f"{largest_flip:.5f}), failures (prompt, position, margin, gap) "
            f"{[d.as_tuple() for d in self.failures]}"
        )


def classify(
    prompt: int, output: dict, plain_output: dict, flip_margin: Optional[float]
) -> Optional[tuple]:
    """(kind, FirstDifference) of one output against the plain server's, or None if equal.
    ``flip_margin`` None: the float32 rule (ties only)."""
    output_ids, plain_ids = output["output_ids"], plain_output["output_ids"]
    position = first_difference(output_ids, plain_ids)
    if position is None:
        return None
    if position >= min(len(output_ids), len(plain_ids)):
        return "failures", FirstDifference(prompt, position, float("inf"), float("inf"))
    ranked = top_logprobs(plain_output, position)
    difference = FirstDifference(prompt, position, top2_margin(plain_output, position),
                                 gap_of(plain_output, position, output_ids[position]),
                                 ranked[0][0] - ranked[-1][0])
    if difference.gap < TIE_MARGIN:
        return "ties", difference
    if flip_margin is not None and difference.gap <= flip_margin:
        return "flips", difference
    return "failures", difference


def compare_outputs(
    outputs: Sequence[dict], plain: Sequence[dict], flip_margin: Optional[float]
) -> Comparison:
    """Every output against the plain server's output of the same prompt."""
    comparison = Comparison()
    for prompt, (output, plain_output) in enumerate(zip(outputs, plain)):
        classified = classify(prompt, output, plain_output, flip_margin)
        if classified is not None:
            kind, difference = classified
            getattr(comparison, kind).append(difference)
    return comparison


def flip_allowance(reference_flips: int) -> int:
    """How many more bf16 flips than the reference server's (sglang's EAGLE3 on the same
    prompts) a server may show: two standard deviations of a count of that size, plus 3."""
    return int(2 * reference_flips**0.5) + 3


# How much less of plain's output a server may reproduce before its first differences than the
# reference server does (a fraction of plain's output tokens), under ``within_reference``.
AGREED_FRACTION_SLACK = 0.1


def agreed_fraction(outputs: Sequence[dict], plain: Sequence[dict]) -> float:
    """Output tokens equal to plain's before each prompt's first difference, over plain's
    output tokens."""
    agreed = 0
    for output, plain_output in zip(outputs, plain):
        position = first_difference(output["output_ids"], plain_output["output_ids"])
        agreed += len(plain_output["output_ids"]) if position is None else position
    total = sum(len(plain_output["output_ids"]) for plain_output in plain)
    return agreed / total if total else 1.0


def differing_prompts(outputs: Sequence[dict], plain: Sequence[dict]) -> int:
    return sum(first_difference(output["output_ids"], plain_output["output_ids"]) is not None
               for output, plain_output in zip(outputs, plain))


@dataclass(frozen=True)
class ReferenceVerdict:
    """A server's outputs against plain decoding's, next to a reference server's (sglang's
    EAGLE3 on the same pair), for targets whose outputs move beyond bf16 rounding with the
    batch's shape (an MoE's router picks another expert at a near-tie): a server within the
    reference differs from plain in at most ``flip_allowance`` more prompts than the
    reference, and reproduces at least the reference's share of plain's tokens before its
    first differences, less ``AGREED_FRACTION_SLACK``. A broken step that corrupts decoding
    from some step on cuts that share even where the count of differing prompts saturates."""

    differing: int
    reference_differing: int
    agreed: float
    reference_agreed: float

    @property
    def within(self) -> bool:
        allowed = self.reference_differing + flip_allowance(self.reference_differing)
        return (self.differing <= allowed
                and self.agreed >= self.reference_agreed - AGREED_FRACTION_SLACK)

    def summary(self) -> str:
        return (f"differing prompts {self.differing} (reference {self.reference_differing}), "
                f"share of plain's tokens before the first difference {self.agreed:.3f} "
                f"(reference {self.reference_agreed:.3f})")


def reference_verdict(outputs: Sequence[dict], reference: Sequence[dict],
                      plain: Sequence[dict]) -> ReferenceVerdict:
    return ReferenceVerdict(differing_prompts(outputs, plain), differing_prompts(reference, plain),
                            agreed_fraction(outputs, plain), agreed_fraction(reference, plain))
