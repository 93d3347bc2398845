"""How the GPU tests compare a server's sampled outputs with a reference server's.

With temperature > 0 two servers that sample from the same distributions give different tokens,
so outputs cannot be compared token by token. What they share is the distribution: each sampled
token's log-probability (``output_token_logprobs``: the target's distribution at the request's
temperature, before top-p, as a plain server, a speculative step's verify and EAGLE3_DYNAMIC's
plain step all report it) has the same expectation on both servers for every prompt. A
sequence's mean over its tokens is one sample of its prompt's; the comparison is a z-test on the
difference of the two servers' means, prompt by prompt (each prompt sent several times to both),
averaged over the prompts:

    d = mean over the P prompts p of (mean_p - reference_mean_p)
    z = d * P / sqrt(sum over p of (var_p / n_p + reference_var_p / reference_n_p))

so prompts that are easier or harder to predict add no noise. A server sampling a sharper or
flatter distribution than the reference (a step that ignores the temperature, applies it twice
or loses top-p) moves d, by far more than its noise once enough sequences are sent.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple


def sequence_mean_logprobs(outputs: Sequence[dict]) -> List[float]:
    """Per output, the mean log-probability of its sampled tokens (``return_logprob``)."""
    means = []
    for output in outputs:
        logprobs = [entry[0] for entry in output["meta_info"]["output_token_logprobs"]]
        if not logprobs or not all(math.isfinite(x) for x in logprobs):
            raise AssertionError(f"an output without finite token logprobs: {logprobs[:8]}")
        means.append(sum(logprobs) / len(logprobs))
    return means


@dataclass(frozen=True)
class SamplingComparison:
    difference: float  # d: nats per token, this server's mean minus the reference's
    reference_mean: float  # the reference's mean token logprob over all its sequences
    standard_error: float  # of d
    sequences: int  # per server
    prompts: int

    @property
    def z(self) -> float:
        if self.standard_error > 0:
            return self.difference / self.standard_error
        return 0.0 if self.difference == 0 else math.copysign(math.inf, self.difference)

    def summary(self) -> str:
        return (f"mean token logprob {self.difference:+.4f} nats from the reference's "
                f"{self.reference_mean:.4f} ({self.sequences} sequences over {self.prompts} prompts "
                f"per server), standard error {self.standard_error:.4f}, z {self.z:+.2f}")


def compare_sampling(outputs: Sequence[dict], reference: Sequence[dict],
                     prompts: Sequence[int]) -> SamplingComparison:
    """``outputs`` and ``reference`` answer the same requests, of prompt ``prompts[i]`` each;
    every prompt needs at least two sequences on each server."""
    if not len(outputs) == len(reference) == len(prompts):
        raise ValueError("outputs, reference and prompts must be as long as each other")
    ours, theirs = sequence_mean_logprobs(outputs), sequence_mean_logprobs(reference)
    groups: Dict[int, Tuple[List[float], List[float]]] = {}
    for prompt, a, b in zip(prompts, ours, theirs):
        groups.setdefault(prompt, ([], []))[0].append(a)
        groups[prompt][1].append(b)
    if any(len(a) < 2 for a, _ in groups.values()):
        raise ValueError("a sampling comparison needs at least two sequences of every prompt")
    differences = [statistics.fmean(a) - statistics.fmean(b) for a, b in groups.values()]
    variance = sum(statistics.variance(a) / len(a) + statistics.variance(b) / len(b)
                   for a, b in groups.values())
    return SamplingComparison(statistics.fmean(differences), statistics.fmean(theirs),
                              math.sqrt(variance) / len(groups), len(ours), len(groups))
