"""The test-only negative-control plugin (test/gpu/native_ops_plugin/sglang_de_broken_plain_step.py)."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from sglang_dynamic_eagle.engine import plain_step

from plugin_modules import assert_register_changes_nothing_without, load_plugin_module, plugin_path

PLUGIN_PATH = plugin_path("sglang_de_broken_plain_step")
BREAK_ENV = "SGLANG_DE_TEST_BREAK_PLAIN_STEP"


def _load_plugin():
    return load_plugin_module("sglang_de_broken_plain_step")


@pytest.fixture
def restore_plain_step(monkeypatch) -> None:
    monkeypatch.setattr(plain_step, "turn_into_decode_batch", plain_step.turn_into_decode_batch)
    monkeypatch.setattr(plain_step.PlainDecodeStep, "_sample", plain_step.PlainDecodeStep._sample)


def decode_batch() -> SimpleNamespace:
    bonus = torch.tensor([11, 12])
    return SimpleNamespace(
        seq_lens=torch.tensor([3, 5]),
        seq_lens_cpu=None,
        seq_lens_sum=None,
        reqs=[None, None],
        req_pool_indices=torch.tensor([0, 1]),
        spec_info=SimpleNamespace(bonus_tokens=bonus),
    )


REQ_TO_TOKEN = torch.arange(20).reshape(2, 10) + 100


def test_without_env_nothing_changes(restore_plain_step, monkeypatch) -> None:
    assert_register_changes_nothing_without(BREAK_ENV, "sglang_de_broken_plain_step", plain_step,
                                            "turn_into_decode_batch", monkeypatch)


def test_kv_slot_writes_each_plain_token_into_the_previous_positions_slot(
    restore_plain_step, monkeypatch
) -> None:
    correct = decode_batch()
    plain_step.turn_into_decode_batch(correct, REQ_TO_TOKEN)
    assert correct.out_cache_loc.tolist() == [103, 115]

    monkeypatch.setenv(BREAK_ENV, "kv-slot")
    _load_plugin().register()
    broken = decode_batch()
    plain_step.turn_into_decode_batch(broken, REQ_TO_TOKEN)
    assert broken.out_cache_loc.tolist() == [102, 114]
    assert broken.seq_lens.tolist() == correct.seq_lens.tolist() == [4, 6]
    assert broken.input_ids.tolist() == [11, 12]


def test_greedy_samples_plain_steps_greedily_and_restores_the_batchs_setting(
    restore_plain_step, monkeypatch
) -> None:
    """Only the sampler's call sees a greedy batch: the logprobs after it are computed with the
    request's setting, and the runner's sampler is restored."""
    seen = []

    def sampler(logits, sampling_info, *args):
        seen.append(("sampler", sampling_info.is_all_greedy))
        return "ids"

    runner = SimpleNamespace(sampler=sampler)
    step = SimpleNamespace(_target_worker=SimpleNamespace(model_runner=runner))

    def sample_then_logprobs(self, batch, forward_batch, logits_output):
        ids = self._target_worker.model_runner.sampler(logits_output, forward_batch.sampling_info, False)
        seen.append(("logprobs", forward_batch.sampling_info.is_all_greedy))
        return ids

    monkeypatch.setattr(plain_step.PlainDecodeStep, "_sample", sample_then_logprobs)
    monkeypatch.setenv(BREAK_ENV, "greedy")
    _load_plugin().register()
    forward_batch = SimpleNamespace(sampling_info=SimpleNamespace(is_all_greedy=False))
    assert plain_step.PlainDecodeStep._sample(step, None, forward_batch, None) == "ids"
    assert seen == [("sampler", True), ("logprobs", False)]
    assert forward_batch.sampling_info.is_all_greedy is False and runner.sampler is sampler
    assert plain_step.turn_into_decode_batch.__name__ == "turn_into_decode_batch"


def test_a_bad_value_is_refused(restore_plain_step, monkeypatch) -> None:
    monkeypatch.setenv(BREAK_ENV, "everything")
    with pytest.raises(ValueError, match=BREAK_ENV):
        _load_plugin().register()


def test_registers_in_a_fresh_interpreter() -> None:
    """sglang's launcher calls plugins before it has imported its scheduler modules."""
    code = (
        "import importlib.util, os; os.environ[%r] = 'kv-slot'; "
        "spec = importlib.util.spec_from_file_location('p', %r); "
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); m.register(); "
        "from sglang_dynamic_eagle.engine import plain_step; "
        "assert plain_step.turn_into_decode_batch.__name__ == 'write_kv_one_slot_early'"
    ) % (BREAK_ENV, str(PLUGIN_PATH))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
