"""The test-only acceptance-mix plugin (test/gpu/native_ops_plugin/sglang_de_acceptance_mix.py)
on real servers of the tiny pair (chain: 3 steps, topk 1, 4 draft tokens):

* EAGLE3 and EAGLE3_DYNAMIC (speculating always) with SGLANG_DE_TEST_ACCEPTANCE_MIX=1.5:0.5,3.5:0.5:
  each request's accepted tokens per verify (``spec_num_correct_drafts / spec_verify_ct + 1``
  from its meta_info) are those of the class its prompt hashes to, and both classes occur;
* a schedule ``0=1:1;60=4:1``: a request before the switch accepts exactly 1 token per verify,
  one after it exactly 4, and the server logs both mixtures. The schedule's clock starts at the
  server's first verify (its warm-up request), so this test runs first: its first request must
  come within 60 s of that.

Speed-benchmark plumbing only: the outputs are not the model's tokens.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List

import pytest

from gpu_servers import LazyServers, TINY_MEMORY_ARGS, tiny_pair_args, tiny_pair_server_env

pytestmark = pytest.mark.gpu

PLUGIN = "dynamic_eagle_test_acceptance_mix"
MIX_ENV = "SGLANG_DE_TEST_ACCEPTANCE_MIX"
SCHEDULE_ENV = "SGLANG_DE_TEST_ACCEPTANCE_MIX_SCHEDULE"
MIX = "1.5:0.5,3.5:0.5"
SWITCH_S = 60
SCHEDULE = f"0=1:1;{SWITCH_S}=4:1"
PROMPTS = 32
OUTPUT_TOKENS = 96
# About 40 verifies per request; a class mean of m has a per-verify spread of at most 0.5.
PER_REQUEST_TOLERANCE = 0.35
PER_CLASS_TOLERANCE = 0.12


@pytest.fixture(scope="module")
def servers():
    from importlib.metadata import entry_points

    if PLUGIN not in {ep.name for ep in entry_points(group="sglang.srt.plugins")}:
        pytest.fail("the acceptance-mix test plugin is not installed: pip install --no-deps "
                    "--no-build-isolation -e test/gpu/native_ops_plugin")
    common, draft = tiny_pair_args()
    common = common + TINY_MEMORY_ARGS
    specs = {
        "mix_schedule": common + ["--speculative-algorithm", "EAGLE3", *draft],
        "mix_eagle3": common + ["--speculative-algorithm", "EAGLE3", *draft],
        "mix_dynamic": common + ["--speculative-algorithm", "EAGLE3_DYNAMIC", *draft,
                                 "--speculative-disable-batch-threshold", "0"],
    }
    env = {**tiny_pair_server_env(), "SGLANG_SIMULATE_ACC_LEN": "3.0"}
    started = LazyServers(specs, env=env, server_envs={
        "mix_eagle3": {MIX_ENV: MIX}, "mix_dynamic": {MIX_ENV: MIX},
        "mix_schedule": {SCHEDULE_ENV: SCHEDULE}})
    try:
        started.start(list(specs))
        yield started
    finally:
        started.stop_all()


def prompts(count: int, seed: int) -> List[List[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 1000) for _ in range(24)] for _ in range(count)]


def accepted_per_verify(server, input_ids: List[int]) -> float:
    meta = server.generate(input_ids, OUTPUT_TOKENS)["meta_info"]
    assert meta.get("spec_verify_ct", 0) > 0, meta
    return meta["spec_num_correct_drafts"] / meta["spec_verify_ct"] + 1


def expected_means(input_ids_list: List[List[int]]) -> List[float]:
    import sglang_de_acceptance_mix as plugin

    mixture = plugin.parse_mixture(MIX)
    return [mixture.means[mixture.class_of(plugin.prompt_fraction(ids))] for ids in input_ids_list]


def test_the_schedule_switches_mixture(servers) -> None:
    server = servers["mix_schedule"]
    start = time.monotonic()
    before = accepted_per_verify(server, prompts(1, seed=21)[0])
    time.sleep(max(0.0, SWITCH_S + 5 - (time.monotonic() - start)))
    after = accepted_per_verify(server, prompts(1, seed=22)[0])
    log = server.log_path.read_text(errors="replace")
    print(f"schedule: before {before}, after {after}")
    assert before == 1.0 and after == 4.0
    assert "mixture 1:1 " in log and "mixture 4:1 " in log


@pytest.mark.parametrize("name", ["mix_eagle3", "mix_dynamic"])
def test_each_request_accepts_its_classs_length(servers, name) -> None:
    server = servers[name]
    batch = prompts(PROMPTS, seed=11)
    expected = expected_means(batch)
    with ThreadPoolExecutor(max_workers=8) as pool:
        observed = list(pool.map(lambda ids: accepted_per_verify(server, ids), batch))
    by_class: Dict[float, List[float]] = {}
    for mean, seen in zip(expected, observed):
        by_class.setdefault(mean, []).append(seen)
    summary = {mean: (len(v), round(sum(v) / len(v), 3)) for mean, v in by_class.items()}
    print(f"{name}: class mean -> (requests, observed mean tokens per verify): {summary}")
    assert set(by_class) == {1.5, 3.5}
    for mean, seen in by_class.items():
        assert abs(sum(seen) / len(seen) - mean) < PER_CLASS_TOLERANCE, summary
    misses = [(m, round(s, 2)) for m, s in zip(expected, observed)
              if abs(s - m) > PER_REQUEST_TOLERANCE]
    assert not misses, misses
    log = server.log_path.read_text(errors="replace")
    assert "simulated acceptance differs by request" in log
