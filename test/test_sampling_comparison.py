"""The GPU tests' sampling comparison (test/gpu/sampling_comparison.py), on outputs drawn on the
CPU from known distributions: a server sampling the reference's distribution passes the z bound
of the sampling test, and its z spreads as a standard normal's (the standard error is neither
too small nor too large); one that samples 15% of its tokens greedily does not pass."""

import importlib.util
import math
import random
import statistics
import sys
from pathlib import Path

import pytest

MODULE_PATH = Path(__file__).parent / "gpu" / "sampling_comparison.py"
_spec = importlib.util.spec_from_file_location("sampling_comparison", MODULE_PATH)
sampling_comparison = importlib.util.module_from_spec(_spec)
sys.modules["sampling_comparison"] = sampling_comparison
_spec.loader.exec_module(sampling_comparison)

MAX_Z = 4.0  # the GPU test's bound
VOCAB = 50


def distribution(seed: int, sharpness: float = 3.0) -> list:
    rng = random.Random(seed)
    weights = [rng.random() ** sharpness for _ in range(VOCAB)]
    total = sum(weights)
    return [w / total for w in weights]


PROMPTS = 16
REPEATS = 8
KEYS = [i % PROMPTS for i in range(PROMPTS * REPEATS)]


def outputs(sequences: int, tokens: int, seed: int, greedy_share: float = 0.0) -> list:
    """Sequences of prompt i % PROMPTS whose token at each position is drawn from that prompt's
    and position's distribution (prompts range from nearly certain to broad), or for
    ``greedy_share`` of the positions its most likely token, with its log-probability."""
    rng = random.Random(seed)
    result = []
    for index in range(sequences):
        prompt = index % PROMPTS
        entries = []
        for position in range(tokens):
            p = distribution(1000 * prompt + position, sharpness=1.0 + prompt)
            token = (max(range(VOCAB), key=p.__getitem__) if rng.random() < greedy_share
                     else rng.choices(range(VOCAB), weights=p)[0])
            entries.append([math.log(p[token]), token, None])
        result.append({"meta_info": {"output_token_logprobs": entries}})
    return result


def compare(ours, reference):
    return sampling_comparison.compare_sampling(ours, reference, KEYS)


def test_the_same_distribution_stays_within_the_bound() -> None:
    reference = outputs(len(KEYS), 32, seed=1)
    zs = [compare(outputs(len(KEYS), 32, seed=s), reference).z for s in range(2, 12)]
    assert max(abs(z) for z in zs) < MAX_Z


def test_z_spreads_as_a_standard_normal() -> None:
    """Over independent pairs of servers sampling the same distributions, z has a spread near 1: a
    standard error computed too large (pooled prompts, say) would shrink it, too small widen it."""
    zs = [compare(outputs(len(KEYS), 16, seed=2 * s), outputs(len(KEYS), 16, seed=2 * s + 1)).z
          for s in range(40)]
    spread = statistics.pstdev(zs)
    assert 0.7 < spread < 1.4, spread
    assert abs(statistics.fmean(zs)) < 0.5


def test_a_step_that_samples_greedily_exceeds_it() -> None:
    reference = outputs(len(KEYS), 32, seed=1)
    broken = compare(outputs(len(KEYS), 32, seed=2, greedy_share=0.15), reference)
    assert broken.z > MAX_Z, broken.summary()


def test_comparing_prompt_by_prompt_removes_their_spread() -> None:
    """Prompts from nearly certain to broad: pooled, their spread would hide the broken step."""
    reference, broken = outputs(len(KEYS), 32, seed=1), outputs(len(KEYS), 32, seed=2, greedy_share=0.15)
    pooled = sampling_comparison.compare_sampling(broken, reference, [0] * len(KEYS))
    assert compare(broken, reference).standard_error < pooled.standard_error / 2
    assert abs(pooled.z) < MAX_Z


def test_outputs_without_logprobs_or_one_sequence_of_a_prompt_are_refused() -> None:
    with pytest.raises(AssertionError, match="finite token logprobs"):
        sampling_comparison.sequence_mean_logprobs([{"meta_info": {"output_token_logprobs": []}}])
    with pytest.raises(ValueError, match="two sequences of every prompt"):
        sampling_comparison.compare_sampling(outputs(3, 4, 0), outputs(3, 4, 1), [0, 0, 1])
    with pytest.raises(ValueError, match="as long as"):
        sampling_comparison.compare_sampling(outputs(3, 4, 0), outputs(3, 4, 1), [0, 0])
