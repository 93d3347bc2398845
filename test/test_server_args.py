"""sglang's real argument path on CPU: prepare_server_args -> ServerArgs.__post_init__.

Expectations marked ``LEAD:`` encode behaviour of spec_algo.DynamicEagleSpecAlgo
.handle_server_args (not of the flags); they are written from the project brief.
"""

from __future__ import annotations

import inspect
import json
import logging
import os

import pytest

from sglang_dynamic_eagle import config
from sglang_dynamic_eagle.config import ENV_VAR, Config
from sglang_dynamic_eagle.policy import DISABLE_FLAG, ENABLE_FLAG, PATIENCE_FLAG
from sglang_dynamic_eagle.sglang_compat.startup_errors import StartupError

pytestmark = pytest.mark.usefixtures("clean_flags_env")

CHAIN = [
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
]


@pytest.fixture(scope="module")
def draft(tiny_models):
    return ["--speculative-draft-model-path", tiny_models.draft]


def _spec_params(server_args):
    return (
        server_args.speculative_num_steps,
        server_args.speculative_eagle_topk,
        server_args.speculative_num_draft_tokens,
    )


def _both(prepare, draft, *argv, model="llama"):
    eagle3 = prepare("--speculative-algorithm", "EAGLE3", *draft, *argv, model=model)
    dynamic = prepare("--speculative-algorithm", "EAGLE3_DYNAMIC", *draft, *argv, model=model)
    return eagle3, dynamic


# ---------------------------------------------------------------- resolution


def test_chain_params_resolve_like_eagle3(prepare, draft):
    eagle3, dynamic = _both(prepare, draft, *CHAIN)
    assert dynamic.speculative_algorithm == "EAGLE3_DYNAMIC"
    assert _spec_params(dynamic) == _spec_params(eagle3) == (3, 1, 4)


def test_defaults_resolve_like_eagle3_for_generic_target(prepare, draft):
    # sglang's generic EAGLE default (3, 1, 4) is a chain, so both must agree.
    eagle3, dynamic = _both(prepare, draft, model="qwen2")
    assert _spec_params(eagle3) == (3, 1, 4)
    assert _spec_params(dynamic) == _spec_params(eagle3)


def test_defaults_for_llama_target_are_eagle3s_tree(prepare, draft):
    """sglang picks (5 steps, topk 4, 8 tokens) for LlamaForCausalLM under EAGLE3, and
    EAGLE3_DYNAMIC without shape flags takes the same tree."""
    eagle3, dynamic = _both(prepare, draft)
    assert _spec_params(dynamic) == _spec_params(eagle3) == (5, 4, 8)
    # A partial chain is still completed as a chain.
    chain = prepare("--speculative-algorithm", "EAGLE3_DYNAMIC", *draft, "--speculative-num-steps", "2")
    assert _spec_params(chain) == (2, 1, 3)


@pytest.mark.parametrize(
    "argv, shape",
    [
        (["--speculative-num-steps", "2"], (2, 1, 3)),
        (["--speculative-num-draft-tokens", "6"], (5, 1, 6)),
        (["--speculative-eagle-topk", "1"], (3, 1, 4)),
        (["--speculative-num-steps", "4", "--speculative-eagle-topk", "1"], (4, 1, 5)),
    ],
    ids=["steps only", "draft tokens only", "topk only", "steps and topk"],
)
def test_a_partial_chain_is_completed(prepare, draft, argv, shape):
    """sglang's EAGLE3 fails on some of these (a TypeError for steps alone); EAGLE3_DYNAMIC
    completes the chain: draft tokens = steps + 1, topk 1."""
    dynamic = prepare("--speculative-algorithm", "EAGLE3_DYNAMIC", *draft, *argv)
    assert _spec_params(dynamic) == shape


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--speculative-num-steps", "0", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", "1"], "--speculative-num-steps 0"),
        (["--speculative-num-draft-tokens", "1"], "--speculative-num-draft-tokens 1"),
    ],
    ids=["zero steps", "one draft token"],
)
def test_zero_draft_steps_are_refused_in_one_line(prepare, draft, argv, named):
    with pytest.raises(ValueError) as excinfo:
        prepare("--speculative-algorithm", "EAGLE3_DYNAMIC", *draft, *argv)
    message = str(excinfo.value)
    assert named in message and "--speculative-num-steps 1 or more" in message
    assert "\n" not in message


def test_max_running_requests_not_capped(prepare, draft):
    """LEAD: EAGLE3 caps max_running_requests at 48; EAGLE3_DYNAMIC does not."""
    eagle3, dynamic = _both(prepare, draft, *CHAIN)
    assert eagle3.max_running_requests == 48
    assert dynamic.max_running_requests is None or dynamic.max_running_requests > 48


def test_user_max_running_requests_is_kept(prepare, draft):
    eagle3, dynamic = _both(prepare, draft, *CHAIN, "--max-running-requests", "200")
    assert eagle3.max_running_requests == dynamic.max_running_requests == 200


def test_bad_catchup_budget_fails_at_startup(prepare, draft, monkeypatch):
    monkeypatch.setenv("SGLANG_DYNAMIC_EAGLE_CATCHUP_MIB", "lots")
    with pytest.raises(ValueError, match="SGLANG_DYNAMIC_EAGLE_CATCHUP_MIB='lots' is invalid"):
        prepare("--speculative-algorithm", "EAGLE3_DYNAMIC", *draft, *CHAIN)


def test_lowercase_algorithm_name(prepare, draft):
    server_args = prepare("--speculative-algorithm", "eagle3_dynamic", *draft, *CHAIN)
    assert server_args.speculative_algorithm == "EAGLE3_DYNAMIC"


# ---------------------------------------------------------------- flags reach load_config()


def test_flags_land_in_load_config(prepare, draft):
    prepare(
        "--speculative-algorithm", "EAGLE3_DYNAMIC", *draft, *CHAIN,
        DISABLE_FLAG, "32", ENABLE_FLAG, "8", PATIENCE_FLAG, "2",
    )
    assert config.load_config() == Config(32, 8, 2)
    assert json.loads(os.environ[ENV_VAR]) == {
        "disable_batch_threshold": 32,
        "enable_batch_threshold": 8,
        "switch_patience": 2,
    }


def test_only_disable_threshold_given(prepare, draft):
    prepare("--speculative-algorithm", "EAGLE3_DYNAMIC", *draft, *CHAIN, DISABLE_FLAG, "12")
    assert config.load_config() == Config(12, 8, 4)


def test_no_flags_give_defaults_even_over_stale_env(prepare, draft, monkeypatch):
    monkeypatch.setenv(ENV_VAR, json.dumps({"disable_batch_threshold": 99}))
    prepare("--speculative-algorithm", "EAGLE3_DYNAMIC", *draft, *CHAIN)
    assert config.load_config() == config.DEFAULT_CONFIG


def test_flags_from_config_file(prepare, draft, tmp_path):
    """sglang's --config YAML goes through the same parser, so our flags work there too."""
    config_file = tmp_path / "server.yaml"
    config_file.write_text(
        "speculative-algorithm: EAGLE3_DYNAMIC\n"
        "speculative-disable-batch-threshold: 20\n"
        "speculative-switch-patience: 6\n"
    )
    prepare("--config", str(config_file), *draft, *CHAIN)
    assert config.load_config() == Config(20, 13, 6)


def test_zero_disables_switching_and_ignores_enable(prepare, draft):
    prepare(
        "--speculative-algorithm", "EAGLE3_DYNAMIC", *draft, *CHAIN,
        DISABLE_FLAG, "0", ENABLE_FLAG, "64",
    )
    assert config.load_config() == Config(0, 64, 4)


def test_flags_without_our_algorithm_are_accepted(prepare, draft):
    # M > N is only an error with EAGLE3_DYNAMIC; the values are ignored otherwise.
    server_args = prepare(
        "--speculative-algorithm", "EAGLE3", *draft, *CHAIN,
        DISABLE_FLAG, "4", ENABLE_FLAG, "8",
    )
    assert server_args.speculative_algorithm == "EAGLE3"


def test_python_api_path_reads_env(tiny_models, loaded_plugins, monkeypatch):
    """Engine(**kwargs) builds ServerArgs directly: no CLI hook, the env var is the input."""
    from sglang.srt.server_args import ServerArgs

    monkeypatch.setenv(ENV_VAR, json.dumps({"disable_batch_threshold": 4, "enable_batch_threshold": 8}))
    kwargs = dict(
        model_path=tiny_models.llama,
        device="cpu",
        speculative_algorithm="EAGLE3_DYNAMIC",
        speculative_draft_model_path=tiny_models.draft,
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
    )
    with pytest.raises(ValueError, match=ENABLE_FLAG):
        ServerArgs(**kwargs)
    monkeypatch.setenv(ENV_VAR, json.dumps({"disable_batch_threshold": 40}))
    ServerArgs(**kwargs)
    assert config.load_config() == Config(40, 16, 4)


# ---------------------------------------------------------------- bad input at startup


BAD = [
    pytest.param([], "--speculative-draft-model-path", id="no-draft"),
    pytest.param([DISABLE_FLAG, "4", ENABLE_FLAG, "8"], ENABLE_FLAG, id="enable-above-disable"),
    pytest.param(
        ["--enable-dp-attention", "--tp-size", "2", "--dp-size", "2"],
        "--enable-dp-attention",
        id="dp-attention",
    ),
    pytest.param(["--pp-size", "2"], "--pp-size", id="pp"),
    pytest.param(["--speculative-adaptive"], "--speculative-adaptive", id="adaptive"),
    pytest.param(["--enable-two-batch-overlap"], "--enable-two-batch-overlap", id="tbo"),
    pytest.param(["--enable-pdmux"], "--enable-pdmux", id="pdmux"),
    pytest.param(["--disaggregation-mode", "decode"], "--disaggregation-mode", id="pd-decode"),
    pytest.param(["--disaggregation-mode", "prefill"], "--disaggregation-mode", id="pd-prefill"),
    pytest.param(["--enable-lora"], "--enable-lora", id="enable-lora"),
    pytest.param(["--lora-paths", "adapter=/nonexistent/lora"], "--lora-paths", id="lora-paths"),
    pytest.param(["--speculative-eagle-topk", "4"], "--speculative-eagle-topk 4 without both", id="topk-alone"),
    pytest.param(["--speculative-eagle-topk", "4", "--speculative-num-steps", "5"],
                 "--speculative-num-draft-tokens", id="tree-without-draft-tokens"),
    pytest.param(["--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"],
                 "--speculative-num-steps", id="tree-without-steps"),
    pytest.param(
        ["--enable-attn-tp-input-scattered"], "--enable-attn-tp-input-scattered", id="attn-tp-scattered"
    ),
    pytest.param(
        ["--speculative-use-rejection-sampling"],
        "--speculative-use-rejection-sampling",
        id="rejection-sampling",
    ),
    pytest.param(["--use-ray"], "--use-ray", id="ray"),
]


@pytest.mark.parametrize("argv, flag", BAD)
def test_bad_input_fails_at_startup(prepare, tiny_models, argv, flag):
    draft = [] if argv == [] else ["--speculative-draft-model-path", tiny_models.draft]
    with pytest.raises(ValueError) as excinfo:
        prepare("--speculative-algorithm", "EAGLE3_DYNAMIC", *draft, *argv)
    message = str(excinfo.value)
    assert flag in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                      "--speculative-num-draft-tokens", "8"], id="topk-4"),
        pytest.param(["--enable-attn-tp-input-scattered"], id="attn-tp-scattered"),
        pytest.param(["--enable-two-batch-overlap"], id="tbo"),
    ],
)
def test_same_input_is_fine_for_eagle3(prepare, draft, argv):
    """Control: the refusals above come from EAGLE3_DYNAMIC, not from sglang itself."""
    prepare("--speculative-algorithm", "EAGLE3", *draft, *argv)


@pytest.mark.parametrize("flag, value", [(DISABLE_FLAG, "-1"), (DISABLE_FLAG, "ten"),
                                         (ENABLE_FLAG, "2.5"), (PATIENCE_FLAG, "0")])
def test_bad_flag_value_is_a_one_line_startup_error(prepare, draft, flag, value):
    """A StartupError: the launcher prints it as one line, without argparse's usage text."""
    with pytest.raises(StartupError) as excinfo:
        prepare("--speculative-algorithm", "EAGLE3_DYNAMIC", *draft, flag, value)
    message = str(excinfo.value)
    assert flag in message and "\n" not in message


# ---------------------------------------------------------------- the draft's window


class _Lines(logging.Handler):
    """Messages of sglang's and this package's loggers (sglang's argument path configures the
    root logger, which drops pytest's caplog handler)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def logged():
    handler = _Lines()
    loggers = [logging.getLogger(name) for name in ("sglang", "sglang_dynamic_eagle")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    yield handler.lines
    for logger, level in zip(loggers, levels):
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_draft_window_is_said_to_apply_once_after_sglangs_warning(prepare, draft, logged):
    args = prepare("--speculative-algorithm", "EAGLE3_DYNAMIC", *draft,
                   "--speculative-draft-window-size", "64")
    assert args.speculative_draft_window_size == 64
    warned = [i for i, m in enumerate(logged) if "--speculative-draft-window-size has no effect" in m]
    said = [i for i, m in enumerate(logged) if "--speculative-draft-window-size 64 applies" in m]
    assert len(warned) == 1 and len(said) == 1 and said[0] > warned[0], logged


def test_no_draft_window_no_line(prepare, draft, logged):
    prepare("--speculative-algorithm", "EAGLE3_DYNAMIC", *draft)
    assert logged and not [m for m in logged if "draft-window-size" in m]


def test_sglangs_eagle3_draft_reads_the_window_whatever_the_algorithm():
    """What the line above says: the draft class takes the window from the resolved arguments,
    not from the algorithm's name (registry: server)."""
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    source = inspect.getsource(LlamaForCausalLMEagle3.__init__)
    assert "get_spec().speculative_draft_window_size" in source
    assert "speculative_algorithm" not in source
