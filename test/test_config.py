"""config.py and the launcher's flags: parsing, defaults, the environment hand-off, the environment
variables, validation rules.

No ServerArgs here (see test_server_args.py for the real sglang path); these tests use
a bare argparse parser and stand-in server_args objects.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_dynamic_eagle import config, policy
from sglang_dynamic_eagle.config import ENV_VAR, Config
from sglang_dynamic_eagle.policy import DISABLE_FLAG, ENABLE_FLAG, PATIENCE_FLAG
from sglang_dynamic_eagle.sglang_compat import launcher
from sglang_dynamic_eagle.sglang_compat.startup_errors import StartupError

pytestmark = pytest.mark.usefixtures("clean_flags_env")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="test")
    launcher.add_cli_args(parser)
    return parser


# ---------------------------------------------------------------- defaults and rules


def test_default_is_the_automatic_policy():
    assert config.DEFAULT_CONFIG == Config(
        disable_batch_threshold=None,
        enable_batch_threshold=None,
        switch_patience=policy.DEFAULT_SWITCH_PATIENCE,
    )
    assert config.DEFAULT_CONFIG.automatic
    assert config.DEFAULT_CONFIG == Config(None, None, 4)
    assert config.resolve_flags() == config.DEFAULT_CONFIG
    assert config.resolve_flags(disable_batch_threshold="auto") == config.DEFAULT_CONFIG
    assert config.resolve_flags(disable_batch_threshold=" AUTO ") == config.DEFAULT_CONFIG
    assert json.loads(config.DEFAULT_CONFIG.flags_json())["disable_batch_threshold"] == "auto"


@pytest.mark.parametrize(
    "n, expected_m",
    [(24, 16), (100, 16), (9, 6), (3, 2), (2, 1), (1, 1), (0, 16)],
)
def test_enable_threshold_derived_when_only_disable_given(n, expected_m):
    assert config.resolve_flags(disable_batch_threshold=n).enable_batch_threshold == expected_m


def test_explicit_enable_threshold_is_kept():
    assert config.resolve_flags(8, 8, 1) == Config(8, 8, 1)
    # Only M given: N stays automatic; validate_server_args refuses the pair for EAGLE3_DYNAMIC.
    assert config.resolve_flags(enable_batch_threshold=3) == Config(None, 3, 4)


@given(st.integers(min_value=1, max_value=10_000))
def test_derived_enable_threshold_is_valid_for_every_n(n):
    m = config.derived_enable_threshold(n)
    assert 1 <= m <= n
    assert m <= policy.DEFAULT_ENABLE_BATCH_THRESHOLD
    # The derived flags are accepted by the policy's own config check.
    policy.ThresholdPolicyConfig(n, m, 1, max_speculative_batch=max(n, 1))


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"disable_batch_threshold": -1}, DISABLE_FLAG),
        ({"disable_batch_threshold": "abc"}, DISABLE_FLAG),
        ({"disable_batch_threshold": 2.5}, DISABLE_FLAG),
        ({"disable_batch_threshold": True}, DISABLE_FLAG),
        ({"enable_batch_threshold": -3}, ENABLE_FLAG),
        ({"enable_batch_threshold": "1e3"}, ENABLE_FLAG),
        ({"switch_patience": 0}, PATIENCE_FLAG),
        ({"switch_patience": "four"}, PATIENCE_FLAG),
    ],
)
def test_bad_values_name_the_flag(kwargs, flag):
    with pytest.raises(ValueError) as excinfo:
        config.resolve_flags(**kwargs)
    message = str(excinfo.value)
    assert flag in message
    assert "\n" not in message


# ---------------------------------------------------------------- argparse


def test_cli_parses_all_three_flags():
    args = _parser().parse_args(
        [DISABLE_FLAG, "32", ENABLE_FLAG, "8", PATIENCE_FLAG, "2"]
    )
    assert launcher.flags_from_namespace(args) == Config(32, 8, 2)


def test_cli_absent_flags_parse_to_none_and_resolve_to_defaults():
    args = _parser().parse_args([])
    for spec in config.FLAG_SPECS:
        assert getattr(args, spec.dest) is None, spec.flag
    assert [spec.dest for spec in config.FLAG_SPECS] == [
        "speculative_disable_batch_threshold",
        "speculative_enable_batch_threshold",
        "speculative_switch_patience",
    ]
    assert launcher.flags_from_namespace(args) == config.DEFAULT_CONFIG


def test_add_cli_args_is_idempotent_per_parser():
    parser = _parser()
    launcher.add_cli_args(parser)  # a second call must not raise argparse's conflict error
    assert sum(DISABLE_FLAG in a.option_strings for a in parser._actions) == 1


def test_help_states_defaults_and_algorithm():
    text = _parser().format_help()
    for flag in (DISABLE_FLAG, ENABLE_FLAG, PATIENCE_FLAG):
        assert flag in text
    assert "EAGLE3_DYNAMIC" in text
    assert "'auto' (the default)" in text and "Default: 4" in text
    assert "2*N//3" in text


@pytest.mark.parametrize(
    "argv, flag",
    [
        ([DISABLE_FLAG, "-1"], DISABLE_FLAG),
        ([DISABLE_FLAG, "many"], DISABLE_FLAG),
        ([ENABLE_FLAG, "1.5"], ENABLE_FLAG),
        ([PATIENCE_FLAG, "0"], PATIENCE_FLAG),
    ],
)
def test_cli_bad_value_is_refused_in_one_line_naming_the_flag(argv, flag):
    args = _parser().parse_args(argv)  # argparse keeps the text; the check names the flag
    with pytest.raises(ValueError) as excinfo:
        launcher.flags_from_namespace(args)
    message = str(excinfo.value)
    assert flag in message and "\n" not in message


# ---------------------------------------------------------------- environment hand-off


def test_load_config_defaults_without_env():
    assert ENV_VAR not in os.environ
    assert config.load_config() == config.DEFAULT_CONFIG


def test_load_config_reads_the_flags(monkeypatch):
    monkeypatch.setenv(ENV_VAR, json.dumps({"disable_batch_threshold": 40, "switch_patience": 2}))
    assert config.load_config() == Config(40, 16, 2)
    monkeypatch.setenv(ENV_VAR, json.dumps({"disable_batch_threshold": 6}))
    assert config.load_config() == Config(6, 4, 4)


@pytest.mark.parametrize(
    "raw, needle",
    [
        ("{not json", ENV_VAR),
        ("[1, 2]", ENV_VAR),
        ('{"disable_batch_treshold": 3}', ENV_VAR),
        ('{"disable_batch_threshold": -2}', DISABLE_FLAG),
        ('{"switch_patience": 0}', PATIENCE_FLAG),
        ('{"enable_batch_threshold": "x"}', ENABLE_FLAG),
    ],
)
def test_load_config_bad_flags_are_a_one_line_error(monkeypatch, raw, needle):
    monkeypatch.setenv(ENV_VAR, raw)
    with pytest.raises(ValueError) as excinfo:
        config.load_config()
    assert needle in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


# ---------------------------------------------------------------- environment variables


def test_config_holds_every_flag_and_every_variable():
    fields = {field.name for field in dataclasses.fields(Config)}
    assert fields == {spec.field for spec in config.FLAG_SPECS} | {
        spec.field for spec in config.ENVIRONMENT}
    assert config.DEFAULT_CONFIG == config.load_config({})
    # Only the flags travel in ENV_VAR; the variables are read where the server runs.
    assert set(json.loads(Config(catchup_window=3, sync_check=True).flags_json())) == {
        spec.field for spec in config.FLAG_SPECS}


def test_load_config_reads_every_variable():
    loaded = config.load_config({
        ENV_VAR: json.dumps({"disable_batch_threshold": 6}),
        config.CATCHUP_BUDGET_ENV: "64", config.CATCHUP_WINDOW_ENV: "16",
        config.TRACE_ENV: "/tmp/trace.jsonl", config.SYNC_CHECK_ENV: "1",
    })
    assert loaded == Config(6, 4, 4, catchup_budget_mib=64, catchup_window=16,
                            trace_path="/tmp/trace.jsonl", sync_check=True)
    assert loaded.catchup_budget_bytes == 64 * 2**20
    defaults = config.load_config({config.TRACE_ENV: "", config.SYNC_CHECK_ENV: "true"})
    assert (defaults.catchup_budget_mib, defaults.catchup_window) == (1024, config.MAX_WINDOW)
    assert defaults.trace_path is None and defaults.sync_check is False


@pytest.mark.parametrize(
    "name, value",
    [
        (config.CATCHUP_BUDGET_ENV, "lots"),
        (config.CATCHUP_BUDGET_ENV, "0"),
        (config.CATCHUP_WINDOW_ENV, "0"),
        (config.CATCHUP_WINDOW_ENV, "257"),
        (config.CATCHUP_WINDOW_ENV, "-1"),
    ],
)
def test_a_bad_variable_is_a_one_line_error_naming_it_and_the_fix(name, value):
    with pytest.raises(StartupError) as excinfo:
        config.load_config({name: value})
    message = str(excinfo.value)
    assert message.startswith(f"{name}={value!r} is invalid: set it to ") and "unset it" in message
    assert "\n" not in message


@given(
    st.integers(0, 512),
    st.integers(0, 512),
    st.integers(1, 64),
)
def test_env_round_trip(n, m, k):
    value = Config(n, m, k)
    old = os.environ.get(ENV_VAR)
    try:
        config.export_flags(value)
        assert config.load_config() == value
    finally:
        if old is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = old


def test_from_cli_args_hook_exports_before_serverargs_is_built():
    """The AROUND hook must write ENV_VAR before it calls the original from_cli_args."""
    seen = {}

    def original(cls, args):
        seen["env"] = os.environ.get(ENV_VAR)
        seen["cls"] = cls
        return "server-args"

    args = _parser().parse_args([DISABLE_FLAG, "12", PATIENCE_FLAG, "3"])
    result = launcher.around_from_cli_args(original, "ServerArgsClass", args)
    assert result == "server-args"
    assert seen["cls"] == "ServerArgsClass"
    assert json.loads(seen["env"]) == {
        "disable_batch_threshold": 12,
        "enable_batch_threshold": 8,
        "switch_patience": 3,
    }


def test_from_cli_args_hook_overrides_a_stale_env_value(monkeypatch):
    monkeypatch.setenv(ENV_VAR, json.dumps({"disable_batch_threshold": 99}))
    args = _parser().parse_args([])
    launcher.around_from_cli_args(lambda cls, a: None, object, args)
    assert config.load_config() == config.DEFAULT_CONFIG


def test_after_add_cli_args_hook_adds_flags_and_keeps_result():
    parser = argparse.ArgumentParser()
    assert launcher.after_add_cli_args("result", parser) == "result"
    assert DISABLE_FLAG in parser._option_string_actions


def test_spawned_process_inherits_exported_flags():
    """sglang starts schedulers with multiprocessing 'spawn'; they must see the values."""
    config.export_flags(Config(7, 3, 5))
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        assert pool.submit(config.load_config).result(timeout=120) == Config(7, 3, 5)


# ---------------------------------------------------------------- validate_server_args


def _server_args(**overrides):
    """A stand-in with the ServerArgs fields validate_server_args reads, all 'supported'."""
    fields = dict(
        speculative_algorithm="EAGLE3_DYNAMIC",
        speculative_draft_model_path="/draft",
        enable_dp_attention=False,
        pp_size=1,
        speculative_adaptive=False,
        enable_two_batch_overlap=False,
        enable_pdmux=False,
        disaggregation_mode="null",
        enable_lora=None,
        lora_paths=None,
        speculative_eagle_topk=None,
        enable_attn_tp_input_scattered=False,
        speculative_use_rejection_sampling=False,
        use_ray=False,
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


def test_validate_accepts_supported_configuration():
    launcher.validate_server_args(_server_args())
    launcher.validate_server_args(_server_args(speculative_eagle_topk=1))


@pytest.mark.parametrize(
    "overrides, needle",
    [
        ({"speculative_draft_model_path": None}, "--speculative-draft-model-path"),
        ({"enable_dp_attention": True}, "--enable-dp-attention"),
        ({"pp_size": 2}, "--pp-size"),
        ({"speculative_adaptive": True}, "--speculative-adaptive"),
        ({"enable_two_batch_overlap": True}, "--enable-two-batch-overlap"),
        ({"enable_pdmux": True}, "--enable-pdmux"),
        ({"disaggregation_mode": "decode"}, "--disaggregation-mode"),
        ({"enable_lora": True}, "--enable-lora"),
        ({"lora_paths": ["a=/lora"]}, "--lora-paths"),
        ({"enable_attn_tp_input_scattered": True}, "--enable-attn-tp-input-scattered"),
        ({"speculative_use_rejection_sampling": True}, "--speculative-use-rejection-sampling"),
        ({"use_ray": True}, "--use-ray"),
    ],
)
def test_validate_rejects_unsupported(overrides, needle):
    with pytest.raises(ValueError) as excinfo:
        launcher.validate_server_args(_server_args(**overrides))
    assert needle in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


def test_trees_start_with_their_whole_shape():
    launcher.validate_server_args(_server_args(speculative_num_steps=5, speculative_eagle_topk=4,
                                            speculative_num_draft_tokens=8))
    with pytest.raises(ValueError, match="without both"):
        launcher.validate_server_args(_server_args(speculative_eagle_topk=4))


def test_validate_rejects_enable_above_disable(monkeypatch):
    monkeypatch.setenv(ENV_VAR, json.dumps({"disable_batch_threshold": 4, "enable_batch_threshold": 8}))
    with pytest.raises(ValueError, match=ENABLE_FLAG):
        launcher.validate_server_args(_server_args())
    # N == 0 (always speculate) ignores M.
    monkeypatch.setenv(ENV_VAR, json.dumps({"disable_batch_threshold": 0, "enable_batch_threshold": 8}))
    launcher.validate_server_args(_server_args())


def test_validate_rejects_bad_env(monkeypatch):
    monkeypatch.setenv(ENV_VAR, json.dumps({"switch_patience": -1}))
    with pytest.raises(ValueError, match=PATIENCE_FLAG):
        launcher.validate_server_args(_server_args())


def test_an_unknown_setting_of_this_package_is_named_in_a_warning(caplog) -> None:
    """A variable the package no longer reads (or a typo) is not silently ignored."""
    import logging

    from sglang_dynamic_eagle.config import load_config

    with caplog.at_level(logging.WARNING):
        load_config({"SGLANG_DYNAMIC_EAGLE_DRAFT_PREFILL": "full", "SGLANG_OTHER": "1"})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "SGLANG_DYNAMIC_EAGLE_DRAFT_PREFILL" in warnings[0]
