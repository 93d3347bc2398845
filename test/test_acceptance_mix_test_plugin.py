"""The test-only acceptance-mix plugin (test/gpu/native_ops_plugin/sglang_de_acceptance_mix.py):
parsing, classes by prompt hash, per-verify sampling, schedules on an injected clock, and the
two hooks run through sglang's real ``eagle_sample`` on CPU (its tree kernel replaced by a stub
that accepts only the root, as a dummy model's verify does)."""

import functools
import inspect
import os
import pkgutil
import random
import subprocess
import sys
import tomllib
from array import array
from types import SimpleNamespace
from typing import Iterator, List

import numpy as np
import pytest
import torch

from plugin_modules import PLUGIN_DIR, load_plugin_module, plugin_path

MODULE = "sglang_de_acceptance_mix"
MIX_ENV = "SGLANG_DE_TEST_ACCEPTANCE_MIX"
SCHEDULE_ENV = "SGLANG_DE_TEST_ACCEPTANCE_MIX_SCHEDULE"
FILE_ENV = "SGLANG_DE_TEST_ACCEPTANCE_MIX_FILE"
SIM_ENV = "SGLANG_SIMULATE_ACC_LEN"


@pytest.fixture
def plugin():
    return load_plugin_module(MODULE)


@pytest.fixture
def clean_hook_registry() -> Iterator[None]:
    """register() adds to sglang's global HookRegistry; put it back as it was."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    saved = {target: list(hooks) for target, hooks in HookRegistry._hooks.items()}
    yield
    HookRegistry._hooks.clear()
    HookRegistry._hooks.update(saved)


def random_prompts(count: int, seed: int, length: int = 16) -> List[List[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 128000) for _ in range(length)] for _ in range(count)]


def request(ids) -> SimpleNamespace:
    return SimpleNamespace(origin_input_ids=ids)


# ---------------------------------------------------------------- parsing


def test_mixture_parses_and_normalises(plugin) -> None:
    mixture = plugin.parse_mixture(" 1.3:0.5 , 4.0:0.5 ")
    assert mixture.means == (1.3, 4.0) and mixture.weights == (0.5, 0.5)
    assert mixture.expected_length == pytest.approx(2.65)
    three = plugin.parse_mixture("1.2:0.333,2:0.333,3.5:0.333")
    assert sum(three.weights) == pytest.approx(1.0)
    assert plugin.parse_mixture("3").means == (3.0,)
    assert plugin.parse_mixture("3").weights == (1.0,)


@pytest.mark.parametrize("text, fragment", [
    ("", "empty mixture term"),
    ("1.3:0.5,", "empty mixture term"),
    ("1.3:0.5,4.0", "bad mixture term"),
    ("2:1:1", "bad mixture term"),
    ("0.5:1", "mean 0.5 < 1"),
    ("abc:1", "'abc' is not a finite number"),
    ("nan:1", "not a finite number"),
    ("2:-0.5,3:1.5", "weight -0.5 <= 0"),
    ("2:0.5,3:0.4", "weights sum to 0.9"),
])
def test_a_bad_mixture_is_refused_in_one_line_naming_the_variable(plugin, text, fragment) -> None:
    with pytest.raises(plugin.AcceptanceMixError) as error:
        plugin.parse_mixture(text)
    message = str(error.value)
    assert message.startswith(MIX_ENV + ":") and fragment in message and "\n" not in message


def test_schedule_parses(plugin) -> None:
    schedule = plugin.parse_schedule("0=1.3:0.5,4.0:0.5;30=1.3:0.9,4.0:0.1; 90.5=2")
    assert schedule.starts == (0.0, 30.0, 90.5)
    assert [m.means for m in schedule.mixtures] == [(1.3, 4.0), (1.3, 4.0), (2.0,)]
    assert schedule.mixtures[1].weights == pytest.approx((0.9, 0.1))
    assert [schedule.segment_at(t) for t in (0, 29.99, 30, 90.4, 90.5, 1e9)] == [0, 0, 1, 1, 2, 2]


BAD_SCHEDULES = {  # the schedule -> a fragment of its refusal
    "5=2": "first segment must start at 0",
    "0=2;0=3": "start 0 is not after the previous start 0",
    "0=2;40=3;30=2": "start 30 is not after",
    "0=2;": "empty segment",
    "2": "has no '='",
    "0=2;x=3": "'x' is not a finite number",
    "0=2;30=1.3:0.9,4.0:0.2": "weights sum to 1.1",
}


@pytest.mark.parametrize("text", BAD_SCHEDULES)
def test_a_bad_schedule_is_refused_in_one_line_naming_the_variable(plugin, text) -> None:
    with pytest.raises(plugin.AcceptanceMixError, match=f"^{SCHEDULE_ENV}:") as error:
        plugin.parse_schedule(text)
    assert BAD_SCHEDULES[text] in str(error.value) and "\n" not in str(error.value)


def test_schedule_from_env(plugin) -> None:
    assert plugin.schedule_from_env({}) is None
    lone = plugin.schedule_from_env({MIX_ENV: "1.3:0.5,4.0:0.5"})
    assert lone.starts == (0.0,) and lone.mixtures[0].means == (1.3, 4.0)
    assert plugin.schedule_from_env({SCHEDULE_ENV: "0=2;10=3"}).starts == (0.0, 10.0)
    with pytest.raises(plugin.AcceptanceMixError, match="are set; set one"):
        plugin.schedule_from_env({MIX_ENV: "2", SCHEDULE_ENV: "0=2"})


@pytest.mark.parametrize("env, fragment", [
    ({}, "needs SGLANG_SIMULATE_ACC_LEN set to a number > 0 (got None"),
    ({SIM_ENV: "-1"}, "got '-1'"),
    ({SIM_ENV: "0"}, "got '0'"),
    ({SIM_ENV: "three"}, "got 'three'"),
    ({SIM_ENV: "3", "SGLANG_SIMULATE_ACC_METHOD": "multinomial"}, "unset SGLANG_SIMULATE_ACC_METHOD"),
    ({SIM_ENV: "3", "SGLANG_SIMULATE_ACC_TOKEN_MODE": "random"}, "SGLANG_SIMULATE_ACC_TOKEN_MODE must be"),
])
def test_sglangs_simulation_variables_must_fit(plugin, env, fragment) -> None:
    with pytest.raises(plugin.AcceptanceMixError) as error:
        plugin.check_simulation_env(env, MIX_ENV)
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_sglangs_simulation_variables_that_fit(plugin) -> None:
    plugin.check_simulation_env({SIM_ENV: "3.0"}, MIX_ENV)
    plugin.check_simulation_env({SIM_ENV: "0.5", "SGLANG_SIMULATE_ACC_METHOD": "match-expected",
                                 "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token"}, MIX_ENV)


def test_register_refuses_a_bad_configuration_with_one_line(plugin, clean_hook_registry) -> None:
    """load_plugins() swallows an Exception (the server would run without the mixture); a
    SystemExit stops the launcher with its one line."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    before = {target: len(hooks) for target, hooks in HookRegistry._hooks.items()}
    for env in ({MIX_ENV: "1.3:0.5,4.0:0.5"}, {MIX_ENV: "1.3:0.5,4.0", SIM_ENV: "3"}):
        with pytest.raises(SystemExit) as stop:
            plugin.register(env)
        message = str(stop.value.code)
        assert message.startswith("error: ") and MIX_ENV in message and "\n" not in message
    assert {t: len(h) for t, h in HookRegistry._hooks.items()} == before
    assert plugin._MIX is None


def test_without_the_variables_nothing_is_registered(plugin, clean_hook_registry) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry

    before = {target: len(hooks) for target, hooks in HookRegistry._hooks.items()}
    plugin.register({SIM_ENV: "3.0"})
    assert {t: len(h) for t, h in HookRegistry._hooks.items() if h} == {
        t: n for t, n in before.items() if n}
    assert plugin._MIX is None


def test_register_adds_both_around_hooks_once(plugin, clean_hook_registry) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    env = {MIX_ENV: "1.3:0.5,4.0:0.5", SIM_ENV: "3.0"}
    plugin.register(env)
    plugin.register(env)
    for target, hook in ((plugin.EAGLE_SAMPLE_TARGET, plugin.around_eagle_sample),
                         (plugin.SIMULATED_INDEX_TARGET,
                          plugin.around_generate_simulated_accept_index)):
        ours = [(t, h) for t, h, _ in HookRegistry._hooks[target] if h is hook]
        assert ours == [(HookType.AROUND, hook)]
    assert plugin._MIX.schedule.mixtures[0].means == (1.3, 4.0)


def write_atomically(path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_a_mixture_file_is_read_again_when_it_changes(plugin, tmp_path) -> None:
    path = tmp_path / "acceptance"
    write_atomically(path, "3.0\n")
    mix = plugin.AcceptanceMix(None, mixture_file=plugin.MixtureFile(str(path)))
    reqs = [request(p) for p in random_prompts(2000, seed=9)]
    assert set(mix.means_for(reqs).tolist()) == {3.0}
    write_atomically(path, "1.3:0.5,4.0:0.5")
    os.utime(path, ns=(1, 1))  # a new modification time even on a coarse clock
    means = mix.means_for(reqs)
    assert set(means.tolist()) == {1.3, 4.0}
    assert float(np.mean(means == 4.0)) == pytest.approx(0.5, abs=0.04)
    write_atomically(path, "1.6")
    os.utime(path, ns=(2, 2))
    assert set(mix.means_for(reqs).tolist()) == {1.6}


def test_a_bad_mixture_file_refuses_at_start_and_keeps_the_last_mixture_later(
        plugin, tmp_path, clean_hook_registry, caplog) -> None:
    path = tmp_path / "acceptance"
    for content in (None, "0.5", "1.3:0.5,4.0"):  # missing, below 1, weights not summing to 1
        if content is not None:
            write_atomically(path, content)
        with pytest.raises(SystemExit) as stop:
            plugin.register({FILE_ENV: str(path), SIM_ENV: "3"})
        message = str(stop.value.code)
        assert message.startswith("error: " + FILE_ENV) and "\n" not in message
    assert plugin._MIX is None
    write_atomically(path, "2.0")
    mix = plugin.AcceptanceMix(None, mixture_file=plugin.MixtureFile(str(path)))
    write_atomically(path, "not a mixture")
    os.utime(path, ns=(3, 3))
    assert set(mix.means_for([request([1, 2, 3])]).tolist()) == {2.0}
    assert any("keeping mixture 2" in r.getMessage() for r in caplog.records)
    write_atomically(path, "2.5")  # good again
    assert set(mix.means_for([request([1, 2, 3])]).tolist()) == {2.5}
    path.unlink()
    caplog.clear()
    for _ in range(5):
        assert set(mix.means_for([request([1, 2, 3])]).tolist()) == {2.5}
    assert sum("keeping mixture" in r.getMessage() for r in caplog.records) == 1  # once, not per verify
    path.write_bytes(b"\xff\xfe")  # not UTF-8: logged, not raised into the verify
    assert set(mix.means_for([request([1, 2, 3])]).tolist()) == {2.5}
    with pytest.raises(SystemExit, match="cannot read"):
        plugin.register({FILE_ENV: str(path), SIM_ENV: "3"})


def test_only_one_way_to_give_the_mixture(plugin, tmp_path) -> None:
    with pytest.raises(plugin.AcceptanceMixError, match=f"{MIX_ENV} and {FILE_ENV} are set"):
        plugin.schedule_from_env({MIX_ENV: "2", FILE_ENV: str(tmp_path / "x")})


def test_register_with_a_mixture_file(plugin, tmp_path, clean_hook_registry) -> None:
    path = tmp_path / "acceptance"
    write_atomically(path, "1.3:0.5,4.0:0.5")
    plugin.register({FILE_ENV: str(path), SIM_ENV: "3.0"})
    assert plugin._MIX.schedule is None and plugin._MIX.mixture_now().means == (1.3, 4.0)


# ------------------------------------------------------- classes by prompt


def test_a_prompts_fraction_is_a_deterministic_function_of_its_ids(plugin) -> None:
    ids = [5, 17, 99999, 3, 42]
    u = plugin.prompt_fraction(ids)
    assert 0.0 <= u < 1.0
    assert plugin.prompt_fraction(list(ids)) == u
    assert plugin.prompt_fraction(array("q", ids)) == u
    assert plugin.prompt_fraction(array("i", ids)) == u  # sglang keeps ids in an array
    assert plugin.prompt_fraction(ids[:-1]) != u
    assert plugin.prompt_fraction(ids + [0]) != u
    # a fresh interpreter (another process of the server) gets the same value
    code = ("import importlib.util; s = importlib.util.spec_from_file_location('p', %r); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "print(repr(m.prompt_fraction(%r)))") % (str(plugin_path(MODULE)), ids)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         timeout=300).stdout.split()[-1]
    assert float(out) == u


def test_the_fraction_is_computed_once_per_request(plugin, monkeypatch) -> None:
    req = request([1, 2, 3])
    first = plugin.request_fraction(req)
    monkeypatch.setattr(plugin, "prompt_fraction", lambda ids: pytest.fail("hashed twice"))
    assert plugin.request_fraction(req) == first


def test_random_prompts_get_the_stated_mixture(plugin) -> None:
    mix = plugin.AcceptanceMix(plugin.parse_schedule("0=1.3:0.3,2.5:0.2,4.0:0.5"))
    prompts = random_prompts(20000, seed=1)
    means = mix.means_for([request(p) for p in prompts])
    shares = {m: float(np.mean(means == m)) for m in (1.3, 2.5, 4.0)}
    # binomial standard deviation at n=20000 is at most 0.0036
    assert shares == pytest.approx({1.3: 0.3, 2.5: 0.2, 4.0: 0.5}, abs=0.015), shares
    # and the same prompts (new request objects, a new mix) get the same classes again
    again = plugin.AcceptanceMix(plugin.parse_schedule("0=1.3:0.3,2.5:0.2,4.0:0.5"))
    assert np.array_equal(again.means_for([request(list(p)) for p in prompts]), means)


def test_means_follow_the_batch_order(plugin) -> None:
    mix = plugin.AcceptanceMix(plugin.parse_schedule("0=1.3:0.5,4.0:0.5"))
    reqs = [request(p) for p in random_prompts(64, seed=2)]
    forward = mix.means_for(reqs)
    assert set(forward.tolist()) == {1.3, 4.0}
    assert np.array_equal(mix.means_for(reqs[::-1]), forward[::-1])
    for req, mean in zip(reqs, forward):
        cls = mix.schedule.mixtures[0].class_of(plugin.request_fraction(req))
        assert mix.schedule.mixtures[0].means[cls] == mean


# --------------------------------------------------------- per-step sampling


@pytest.mark.parametrize("mean", [1.0, 1.3, 2.5, 3.75, 4.0])
def test_per_step_lengths_have_the_mean(plugin, mean) -> None:
    rng = np.random.default_rng(7)
    lengths = plugin.sample_lengths(np.full(20000, mean), 4, rng)
    assert lengths.dtype == np.int32
    assert set(np.unique(lengths).tolist()) <= {int(np.floor(mean)), int(np.ceil(mean))}
    # the standard deviation of the mean of 20000 Bernoulli draws is at most 0.0036
    assert float(lengths.mean()) == pytest.approx(mean, abs=0.015)


def test_per_step_lengths_are_clamped_to_the_accept_width(plugin) -> None:
    rng = np.random.default_rng(0)
    lengths = plugin.sample_lengths(np.array([6.5, 4.2, 1.0, 2.0] * 100), 4, rng)
    assert lengths.reshape(100, 4)[:, 0].tolist() == [4] * 100
    assert lengths.reshape(100, 4)[:, 1].tolist() == [4] * 100
    assert set(lengths.reshape(100, 4)[:, 2].tolist()) == {1}
    assert set(lengths.reshape(100, 4)[:, 3].tolist()) == {2}
    assert plugin.sample_lengths(np.array([3.0]), 1, rng).tolist() == [1]  # zero-step verify


def test_a_mixed_batch_has_each_classes_mean(plugin) -> None:
    mix = plugin.AcceptanceMix(plugin.parse_schedule("0=1.3:0.5,3.6:0.5"), seed=3)
    reqs = [request(p) for p in random_prompts(256, seed=4)]
    means = mix.means_for(reqs)
    totals = np.zeros(len(reqs))
    steps = 400
    for _ in range(steps):
        totals += mix.sample_lengths(means, 4)
    per_request = totals / steps
    for mean in (1.3, 3.6):
        assert float(per_request[means == mean].mean()) == pytest.approx(mean, abs=0.02)


# ----------------------------------------------------------------- schedule


class FakeClock:
    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def test_the_schedule_switches_by_time_since_the_first_verify(plugin) -> None:
    clock = FakeClock(1000.0)
    mix = plugin.AcceptanceMix(plugin.parse_schedule("0=1.3:0.5,4.0:0.5;30=1.3:0.9,4.0:0.1"),
                               clock=clock)
    reqs = [request(p) for p in random_prompts(4000, seed=5)]
    us = np.array([plugin.request_fraction(r) for r in reqs])
    first = mix.means_for(reqs)  # the first verify: second 0
    assert float(np.mean(first == 4.0)) == pytest.approx(0.5, abs=0.03)
    clock.now = 1029.9
    assert np.array_equal(mix.means_for(reqs), first)
    clock.now = 1030.0
    later = mix.means_for(reqs)
    assert float(np.mean(later == 4.0)) == pytest.approx(0.1, abs=0.02)
    moved = first != later
    # only the requests whose u lies where the boundary moved change class
    assert np.array_equal(moved, (us >= 0.5) & (us < 0.9))
    clock.now = 5000.0
    assert np.array_equal(mix.means_for(reqs), later)


def test_the_clock_starts_at_the_first_verify_not_at_construction(plugin) -> None:
    clock = FakeClock(0.0)
    mix = plugin.AcceptanceMix(plugin.parse_schedule("0=1;10=4"), clock=clock)
    clock.now = 500.0  # the server started long before its first verify
    assert mix.mixture_now().means == (1.0,)
    clock.now = 509.0
    assert mix.mixture_now().means == (1.0,)
    clock.now = 510.0
    assert mix.mixture_now().means == (4.0,)


# ------------------------------------------------- the hooks on sglang's code


BS, DRAFT_TOKENS = 6, 4  # topk 1 chain: 3 steps, 4 draft tokens


def root_only_greedy_verify(predicts, accept_index, accept_token_num, candidates, retrieve_index,
                            retrieve_next_token, retrieve_next_sibling, target_predict, topk=-1):
    """Stands in for sgl_kernel's verify_tree_greedy (CUDA only): no draft accepted."""
    accept_index[:, 0] = retrieve_index[:, 0].to(accept_index.dtype)
    accept_token_num.zero_()
    predicts[retrieve_index[:, 0]] = target_predict[:, 0].to(predicts.dtype)
    return predicts, accept_index, accept_token_num


def requests_of_each_class(plugin, mixture, per_class: int) -> List[SimpleNamespace]:
    """Requests alternating between the mixture's classes (found among random prompts)."""
    found = {c: [] for c in range(len(mixture.means))}
    for prompt in random_prompts(2000, seed=9):
        req = request(prompt)
        found[mixture.class_of(plugin.request_fraction(req))].append(req)
    assert all(len(v) >= per_class for v in found.values())
    return [found[c][i] for i in range(per_class) for c in found]


@pytest.fixture
def sglang_verify(plugin, monkeypatch):
    """sglang's real eagle_sample with the plugin's two hooks composed as HookRegistry would,
    the simulated path on (SIMULATE_ACC_LEN > 0) and the CUDA tree kernel stubbed."""
    from sglang.srt.speculative import eagle_utils, spec_utils

    monkeypatch.setattr(eagle_utils, "verify_tree_greedy_func", root_only_greedy_verify)
    monkeypatch.setattr(spec_utils, "SIMULATE_ACC_LEN", 2.0)
    original_index = spec_utils.generate_simulated_accept_index
    monkeypatch.setattr(
        spec_utils, "generate_simulated_accept_index",
        functools.wraps(original_index)(functools.partial(
            plugin.around_generate_simulated_accept_index, original_index)))

    def verify(reqs, token_mode="fixed", hooked=True):
        monkeypatch.setattr(spec_utils, "SIMULATE_ACC_TOKEN_MODE", token_mode)
        bs = len(reqs)
        generator = torch.Generator().manual_seed(0)
        verify_input = SimpleNamespace(
            draft_token=torch.randint(1000, 2000, (bs * DRAFT_TOKENS,), generator=generator),
            draft_token_num=DRAFT_TOKENS, max_tree_depth=DRAFT_TOKENS, tree_topk=1,
            retrieve_index=torch.arange(bs * DRAFT_TOKENS).view(bs, DRAFT_TOKENS),
            retrieve_next_token=None, retrieve_next_sibling=None)
        batch = SimpleNamespace(
            device="cpu", reqs=reqs, seq_lens=torch.full((bs,), 20),
            forward_mode=SimpleNamespace(is_idle=lambda: False),
            sampling_info=SimpleNamespace(acc_additive_penalties=None, acc_scaling_penalties=None,
                                          logit_bias=None, is_all_greedy=True))
        logits = SimpleNamespace(next_token_logits=torch.randn(bs * DRAFT_TOKENS, 64,
                                                               generator=generator))
        if hooked:
            result = plugin.around_eagle_sample(eagle_utils.eagle_sample, verify_input, batch,
                                                logits, None)
        else:
            result = eagle_utils.eagle_sample(verify_input, batch, logits, None)
        return result, verify_input, logits

    return verify


def test_sglangs_eagle_sample_gives_each_request_its_classs_length(plugin, sglang_verify) -> None:
    plugin._MIX = plugin.AcceptanceMix(plugin.parse_schedule("0=1:0.5,4:0.5"))
    reqs = requests_of_each_class(plugin, plugin._MIX.schedule.mixtures[0], BS // 2)
    expected = plugin._MIX.means_for(reqs).astype(int)
    assert expected.tolist() == [1, 4] * (BS // 2)
    (predict, accept_lens, accept_index), _, _ = sglang_verify(reqs)
    assert accept_lens.tolist() == expected.tolist()  # bonus included
    for row, length in enumerate(expected):
        root = row * DRAFT_TOKENS
        assert accept_index[row].tolist() == [root + j if j < length else -1
                                              for j in range(DRAFT_TOKENS)]
    assert set(predict.tolist()) == {100}  # sglang's fixed token
    # the batch in another order: the lengths follow the requests
    (_, reversed_lens, _), _, _ = sglang_verify(reqs[::-1])
    assert reversed_lens.tolist() == expected[::-1].tolist()


def test_fractional_means_realised_per_verify_through_sglang(plugin, sglang_verify) -> None:
    plugin._MIX = plugin.AcceptanceMix(plugin.parse_schedule("0=1.3:0.5,3.6:0.5"))
    reqs = requests_of_each_class(plugin, plugin._MIX.schedule.mixtures[0], BS // 2)
    totals = np.zeros(len(reqs))
    steps = 2000
    for _ in range(steps):
        (_, accept_lens, _), _, _ = sglang_verify(reqs)
        totals += accept_lens.numpy()
    means = totals / steps
    assert means[0::2] == pytest.approx([1.3] * (BS // 2), abs=0.05)
    assert means[1::2] == pytest.approx([3.6] * (BS // 2), abs=0.05)


def test_real_draft_tokens_per_row(plugin, sglang_verify) -> None:
    plugin._MIX = plugin.AcceptanceMix(plugin.parse_schedule("0=1:0.5,3:0.5"))
    reqs = requests_of_each_class(plugin, plugin._MIX.schedule.mixtures[0], BS // 2)
    (predict, accept_lens, accept_index), verify_input, logits = sglang_verify(
        reqs, token_mode="real-draft-token")
    candidates = verify_input.draft_token.view(len(reqs), DRAFT_TOKENS)
    target = logits.next_token_logits.argmax(-1).view(len(reqs), DRAFT_TOKENS)
    assert accept_lens.tolist() == [1, 3] * (BS // 2)
    for row, length in enumerate(accept_lens.tolist()):
        tokens = predict[accept_index[row, :length].long()].tolist()
        assert tokens == candidates[row, 1:length].tolist() + [int(target[row, length - 1])]


def test_without_a_mix_sglangs_own_simulation_runs(plugin, sglang_verify) -> None:
    """No mix installed (the variables unset): both hooks call through."""
    reqs = [request(p) for p in random_prompts(BS, seed=3)]
    (_, accept_lens, _), _, _ = sglang_verify(reqs)
    assert accept_lens.tolist() == [2] * BS  # SIMULATE_ACC_LEN = 2.0 for every request


def test_outside_a_hooked_eagle_sample_sglangs_own_simulation_runs(plugin, sglang_verify) -> None:
    plugin._MIX = plugin.AcceptanceMix(plugin.parse_schedule("0=1:0.5,4:0.5"))
    reqs = [request(p) for p in random_prompts(BS, seed=3)]
    (_, accept_lens, _), _, _ = sglang_verify(reqs, hooked=False)
    assert accept_lens.tolist() == [2] * BS


def test_idle_batches_are_passed_through(plugin) -> None:
    plugin._MIX = plugin.AcceptanceMix(plugin.parse_schedule("0=1:0.5,4:0.5"))
    batch = SimpleNamespace(forward_mode=SimpleNamespace(is_idle=lambda: True), reqs=None)
    seen = []
    result = plugin.around_eagle_sample(
        lambda vi, b, *a: seen.append(plugin._ROW_MEANS.get()) or "original", None, batch, None)
    assert result == "original" and seen == [None]


def test_tree_rows_accept_their_first_nodes_like_sglangs_simulation(plugin) -> None:
    """topk 4, 5 steps, 8 draft tokens: accept width 6; row i's block starts at 8 i."""
    bs, draft_tokens, width = 3, 8, 6
    accept_index = torch.full((bs, width), -1, dtype=torch.int32)
    accept_index[:, 0] = torch.arange(bs, dtype=torch.int32) * draft_tokens
    predict = torch.zeros(bs * draft_tokens, dtype=torch.int32)
    num_correct = torch.empty(bs, dtype=torch.int32)
    lengths = torch.tensor([1, 6, 3], dtype=torch.int32)
    sim = plugin.simulated_accept_index(accept_index, predict, num_correct, None, None, lengths,
                                        width, "fixed")
    assert sim.tolist() == [[0, -1, -1, -1, -1, -1], [8, 9, 10, 11, 12, 13],
                            [16, 17, 18, -1, -1, -1]]
    assert num_correct.tolist() == [0, 5, 2]
    # sglang's own simulation with one length per batch lays rows out the same way
    from sglang.srt.speculative.spec_utils import generate_simulated_accept_index

    for length in (1, 3, 6):
        theirs = generate_simulated_accept_index(
            accept_index.clone(), predict.clone(), num_correct.clone(), None, None, bs, width - 1,
            simulate_acc_len=float(length), simulate_acc_method="match-expected",
            simulate_acc_token_mode="fixed")
        ours = plugin.simulated_accept_index(
            accept_index, predict.clone(), num_correct.clone(), None, None,
            torch.full((bs,), length, dtype=torch.int32), width, "fixed")
        assert ours.tolist() == theirs.tolist()


def test_several_mixtures_refuse_tensor_parallelism(plugin, monkeypatch) -> None:
    import sglang.srt.distributed as distributed

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed, "get_tp_group", lambda: SimpleNamespace(world_size=2))
    with pytest.raises(RuntimeError, match="tensor parallelism 1"):
        plugin._check_tensor_parallel(plugin.AcceptanceMix(plugin.parse_schedule("0=2;5=3")))
    fresh = load_plugin_module(MODULE)
    fresh._check_tensor_parallel(fresh.AcceptanceMix(fresh.parse_schedule("0=2")))  # one mixture


# ------------------------------------------- targets in the installed sglang


def test_hook_targets_exist_and_keep_the_shapes_relied_on(plugin) -> None:
    from sglang.srt.speculative import eagle_utils, eagle_worker_common, eagle_worker_v2

    for target, _ in plugin.HOOKS:
        module, _, name = target.rpartition(".")
        assert callable(getattr(pkgutil.resolve_name(module), name)), target
    sample = inspect.signature(eagle_utils.eagle_sample)
    assert list(sample.parameters)[:2] == ["verify_input", "batch"]
    index_params = inspect.signature(pkgutil.resolve_name(plugin.SIMULATED_INDEX_TARGET)).parameters
    assert {"accept_index", "predict", "num_correct_drafts", "candidates", "target_predict", "bs",
            "spec_steps", "simulate_acc_token_mode"} <= set(index_params)
    # eagle_sample reads SIMULATE_ACC_LEN and the index builder from spec_utils at call time,
    # so the module attributes are what it uses
    source = inspect.getsource(eagle_utils.eagle_sample)
    assert "from sglang.srt.speculative.spec_utils import" in source
    assert "generate_simulated_accept_index(" in source and "if SIMULATE_ACC_LEN > 0" in source
    # the verify path of EAGLEWorkerV2 (EAGLE3, and EAGLE3_DYNAMIC's speculative steps)
    assert "run_eagle_verify(" in inspect.getsource(eagle_worker_v2.EAGLEWorkerV2.verify)
    assert "eagle_sample(verify_input, batch," in inspect.getsource(
        eagle_worker_common.run_eagle_verify)
    assert eagle_worker_common.eagle_sample is eagle_utils.eagle_sample or hasattr(
        eagle_worker_common.eagle_sample, "__wrapped__")


def test_hooks_apply_in_a_fresh_interpreter() -> None:
    """What load_plugins() does in a server process: register, then HookRegistry.apply_hooks."""
    code = f"""
import importlib.util, os
os.environ.update({{{MIX_ENV!r}: '1.3:0.5,4.0:0.5', {SIM_ENV!r}: '3.0'}})
spec = importlib.util.spec_from_file_location('p', {str(plugin_path(MODULE))!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); m.register()
from sglang.srt.speculative import eagle_utils, eagle_worker_common, spec_utils
# (in a dict: HookRegistry rebinds every module attribute that holds an original, __main__'s too)
original = {{'sample': eagle_utils.eagle_sample, 'index': spec_utils.generate_simulated_accept_index}}
from sglang.srt.plugins.hook_registry import HookRegistry
HookRegistry.apply_hooks()
assert eagle_utils.eagle_sample.__wrapped__ is original['sample']
assert eagle_worker_common.eagle_sample is eagle_utils.eagle_sample
assert spec_utils.generate_simulated_accept_index.__wrapped__ is original['index']
print('applied')
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "applied" in done.stdout, done.stderr[-3000:]
    assert "simulated acceptance differs by request" in done.stderr  # the start-up line


def test_the_plugin_package_declares_the_entry_point() -> None:
    project = tomllib.loads((PLUGIN_DIR / "pyproject.toml").read_text())
    points = project["project"]["entry-points"]["sglang.srt.plugins"]
    assert points["dynamic_eagle_test_acceptance_mix"] == f"{MODULE}:register"
    assert MODULE in project["tool"]["setuptools"]["py-modules"]
