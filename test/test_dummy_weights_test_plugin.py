"""The test-only dummy-weights plugin (test/gpu/native_ops_plugin/sglang_de_dummy_weights.py)."""

import pytest
import torch
from sglang.srt.model_loader import loader

from plugin_modules import assert_register_changes_nothing_without, load_plugin_module

STD_ENV = "SGLANG_DE_TEST_DUMMY_WEIGHT_STD"


def _load_plugin():
    return load_plugin_module("sglang_de_dummy_weights")


class TinyBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.input_layernorm = torch.nn.Module()
        self.input_layernorm.weight = torch.nn.Parameter(torch.zeros(32))
        self.proj = torch.nn.Linear(32, 48, bias=True)
        self.register_buffer("token_map", torch.arange(64))


@pytest.fixture
def restore_loader(monkeypatch) -> None:
    monkeypatch.setattr(loader, "initialize_dummy_weights", loader.initialize_dummy_weights)


def test_without_env_nothing_changes(restore_loader, monkeypatch) -> None:
    assert_register_changes_nothing_without(STD_ENV, "sglang_de_dummy_weights", loader,
                                            "initialize_dummy_weights", monkeypatch)


def test_with_env_the_loader_draws_spread_weights(restore_loader, monkeypatch) -> None:
    monkeypatch.setenv(STD_ENV, "0.02")
    _load_plugin().register()
    model = TinyBlock()
    loader.initialize_dummy_weights(model)
    assert torch.all(model.input_layernorm.weight == 1.0)
    assert torch.all(model.proj.bias == 0.0)
    assert 0.015 < model.proj.weight.std().item() < 0.025
    assert 0.015 < model.embed.weight.std().item() < 0.025
    assert torch.equal(model.token_map, torch.arange(64))  # integer buffers untouched


def test_same_shapes_get_the_same_values_in_every_server(restore_loader, monkeypatch) -> None:
    monkeypatch.setenv(STD_ENV, "0.02")
    _load_plugin().register()
    first, second = TinyBlock(), TinyBlock()
    loader.initialize_dummy_weights(first)
    loader.initialize_dummy_weights(second)
    assert torch.equal(first.proj.weight, second.proj.weight)


def test_sglangs_own_dummy_weights_are_near_ties(restore_loader, monkeypatch) -> None:
    """Why the plugin exists: sglang's uniform(-1e-3, 1e-3) puts norm weights near 0 as well."""
    monkeypatch.delenv(STD_ENV, raising=False)
    model = TinyBlock()
    loader.initialize_dummy_weights(model)
    assert model.input_layernorm.weight.abs().max().item() <= 1e-3


@pytest.mark.parametrize("value", ["0", "-0.1", "nan", "wide"])
def test_bad_env_value_is_refused(restore_loader, monkeypatch, value: str) -> None:
    monkeypatch.setenv(STD_ENV, value)
    with pytest.raises(ValueError, match=STD_ENV):
        _load_plugin().register()
