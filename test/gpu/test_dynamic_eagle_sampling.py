"""EAGLE3_DYNAMIC sampling with temperature > 0 (the tiny trained pair, float32, real acceptance).

Requests that set no sampling parameters get sglang's defaults (temperature 1.0); chat clients
commonly send a lower temperature with top-p. Sampled tokens differ from server to server, so
the comparison is of distributions (``sampling_comparison``): each prompt is sent
``SAMPLING_REPEATS`` times in waves that switch the dynamic server's mode both ways, and the mean
log-probability of its sampled tokens must match the reference server's within ``MAX_Z``
standard errors:

* sglang's defaults, and a chat client's temperature 0.7 with top-p 0.9, against the plain
  server (every server reports a token's logprob at the request's temperature, before top-p);
* the negative control, in both cases: a server whose plain steps sample greedily exceeds the
  bound.

Every request must also come back whole with a finite logprob per token, and the repeats of some
prompt must differ (the server sampled at all; at 0.7 with top-p 0.9 the tiny pair keeps a single
token at every position of some prompts).
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import pytest

from gpu_servers import send_in_waves
from sampling_comparison import compare_sampling

pytestmark = pytest.mark.gpu

SAMPLING_PROMPTS = 16
SAMPLING_REPEATS = 24
# Request lengths by position in a wave of WAVE_SIZE: a wave drains from 4 running requests to
# 1, so the fixed-threshold server (2 / 2 / 2) switches both ways in every wave.
WAVE_SIZE = 4
LENGTHS = (16, 32, 48, 64)
# Four standard errors: a server that samples the reference's distributions stays within it but
# for well under one run in a thousand (the variances are estimated, so the tails are somewhat
# heavier than a normal's).
MAX_Z = 4.0
# The test must catch a shift of the mean of MIN_SHIFT_NATS per token with 95% probability, so
# its standard error may be at most MIN_SHIFT_NATS / (MAX_Z + 1.645). A plain step sampling
# greedily at half the positions moves the mean by more than the tokens' entropy it removes; a
# quarter nat is a small share of that for a model whose sampled tokens average below -1 nat.
MIN_SHIFT_NATS = 0.25
MAX_STANDARD_ERROR = MIN_SHIFT_NATS / (MAX_Z + 1.645)
MIN_SWITCHES = 4
SGLANG_DEFAULTS: Dict[str, float] = {}  # no sampling parameter: temperature 1.0, top-p 1.0
CHAT = {"temperature": 0.7, "top_p": 0.9}


def repeated_prompts(eval_set: dict) -> List[Dict]:
    """Request i asks for prompt i % SAMPLING_PROMPTS, LENGTHS[i % WAVE_SIZE] tokens (each
    prompt always the same length: SAMPLING_PROMPTS is a multiple of WAVE_SIZE)."""
    prompts = eval_set["prompts"][:SAMPLING_PROMPTS]
    return [{"input_ids": prompts[i % SAMPLING_PROMPTS]["input_ids"],
             "max_new_tokens": LENGTHS[i % WAVE_SIZE]}
            for i in range(SAMPLING_PROMPTS * SAMPLING_REPEATS)]


def prompt_keys() -> List[int]:
    return [i % SAMPLING_PROMPTS for i in range(SAMPLING_PROMPTS * SAMPLING_REPEATS)]


def sample(server, prompts: Sequence[Dict], sampling: Dict[str, float]) -> List[dict]:
    outputs = send_in_waves(server, prompts, WAVE_SIZE, sampling=sampling, return_logprob=True)
    for prompt, output in zip(prompts, outputs):
        assert len(output["output_ids"]) == prompt["max_new_tokens"]
        assert len(output["meta_info"]["output_token_logprobs"]) == prompt["max_new_tokens"]
    return outputs


def most_distinct(outputs: Sequence[dict]) -> int:
    """The most distinct outputs among the repeats of one prompt."""
    by_prompt: Dict[int, set] = {}
    for prompt, output in zip(prompt_keys(), outputs):
        by_prompt.setdefault(prompt, set()).add(tuple(output["output_ids"]))
    return max(len(seen) for seen in by_prompt.values())


def sampled_against(dynamic, reference, prompts, sampling, label: str):
    before = dynamic.dynamic_counters()
    outputs = sample(dynamic, prompts, sampling)
    after = dynamic.dynamic_counters()
    reference_outputs = sample(reference, prompts, sampling)
    comparison = compare_sampling(outputs, reference_outputs, prompt_keys())
    switches = {key: after[key] - before.get(key, 0)
                for key in ("switches_to_plain", "switches_to_speculative")}
    print(f"{label}: {dynamic.name} against {reference.name}: {comparison.summary()}; switches "
          f"{switches}; most distinct outputs of a prompt {most_distinct(outputs)} / "
          f"{most_distinct(reference_outputs)} of {SAMPLING_REPEATS}")
    assert min(switches.values()) >= MIN_SWITCHES
    assert after["speculative_steps"] > before.get("speculative_steps", 0)
    assert after["plain_steps"] > before.get("plain_steps", 0)
    assert comparison.standard_error <= MAX_STANDARD_ERROR, "too few sequences to see a broken step"
    assert most_distinct(reference_outputs) > 1
    return comparison, outputs


CASES = {"sglang-defaults": SGLANG_DEFAULTS, "chat-0.7-top-p-0.9": CHAT}


@pytest.mark.uses_servers("tiny_dynamic", "tiny_plain")
@pytest.mark.parametrize("case", sorted(CASES))
def test_sampling_matches_plain_decoding_across_switches(tiny_servers, eval_set, case):
    comparison, outputs = sampled_against(tiny_servers["tiny_dynamic"], tiny_servers["tiny_plain"],
                                          repeated_prompts(eval_set), CASES[case], case)
    assert most_distinct(outputs) > 1
    assert abs(comparison.z) <= MAX_Z


@pytest.mark.uses_servers("tiny_dynamic_greedy_plain", "tiny_plain")
@pytest.mark.parametrize("case", sorted(CASES))
def test_negative_control_plain_steps_that_sample_greedily_fail(tiny_servers, eval_set, case):
    """What the sampling tests assert must not hold for a server whose plain steps ignore the
    requests' sampling parameters, in either case."""
    comparison, _ = sampled_against(tiny_servers["tiny_dynamic_greedy_plain"],
                                    tiny_servers["tiny_plain"], repeated_prompts(eval_set),
                                    CASES[case], f"negative control, {case}")
    assert abs(comparison.z) > MAX_Z
