"""The benchmark's server command lines (benchmark/sweeplib/configs.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib import configs  # noqa: E402
from benchmark_helpers import SPECULATIVE_PREFIX, setup_for_tests, flag_values  # noqa: E402


def test_server_flags_identical_apart_from_speculative_ones():
    setup = setup_for_tests()
    commands = {name: configs.server_command(name, setup) for name in configs.CONFIG_NAMES}
    prefixes = {name: command[:command.index("--model-path")] for name, command in commands.items()}
    assert len(set(map(tuple, prefixes.values()))) == 1
    non_speculative = {
        name: {k: v for k, v in flag_values(command).items() if not k.startswith(SPECULATIVE_PREFIX)}
        for name, command in commands.items()
    }
    reference = non_speculative[configs.PLAIN]
    for name, flags in non_speculative.items():
        assert flags == reference, name
    assert not any(k.startswith(SPECULATIVE_PREFIX) for k in flag_values(commands[configs.PLAIN]))
    for common in setup.common_args:
        if common.startswith("--"):
            assert common in reference


def test_speculative_flags_per_configuration():
    setup = setup_for_tests()
    flags = {name: flag_values(configs.server_command(name, setup)) for name in configs.CONFIG_NAMES}
    draft_shape = {
        "--speculative-draft-model-path": (setup.draft_model_path,),
        "--speculative-draft-load-format": ("dummy",),
        "--speculative-num-steps": ("3",),
        "--speculative-eagle-topk": ("1",),
        "--speculative-num-draft-tokens": ("4",),
    }
    for name in (configs.EAGLE3, configs.ADAPTIVE, configs.DYNAMIC):
        for flag, value in draft_shape.items():
            assert flags[name][flag] == value, (name, flag)
    assert flags[configs.EAGLE3]["--speculative-algorithm"] == ("EAGLE3",)
    assert flags[configs.ADAPTIVE]["--speculative-algorithm"] == ("EAGLE3",)
    assert flags[configs.ADAPTIVE]["--speculative-adaptive"] == ()
    assert flags[configs.ADAPTIVE]["--speculative-adaptive-config"] == (setup.adaptive_config_path,)
    assert flags[configs.DYNAMIC]["--speculative-algorithm"] == ("EAGLE3_DYNAMIC",)
    assert flags[configs.DYNAMIC]["--speculative-disable-batch-threshold"] == ("24",)
    assert "--speculative-adaptive" not in flags[configs.EAGLE3]
    assert "--speculative-disable-batch-threshold" not in flags[configs.EAGLE3]
    fixed = flags[configs.DYNAMIC_FIXED]
    assert fixed["--speculative-algorithm"] == ("EAGLE3_DYNAMIC",)
    assert (fixed["--speculative-disable-batch-threshold"], fixed["--speculative-enable-batch-threshold"],
            fixed["--speculative-switch-patience"]) == (("24",), ("16",), ("4",))
    for flag, value in draft_shape.items():
        assert fixed[flag] == value, flag


def test_draft_load_format_only_with_a_load_format():
    command = configs.server_command(configs.EAGLE3, setup_for_tests(load_format=None))
    assert "--speculative-draft-load-format" not in command
    assert "--load-format" not in command


def test_speculative_configuration_without_draft_is_refused():
    with pytest.raises(ValueError):
        configs.server_command(configs.DYNAMIC, setup_for_tests(draft_model_path=None))


def test_config_list_parsing():
    assert configs.parse_config_list("adaptive, dynamic") == ["adaptive", "dynamic"]
    for bad in ("plain,unknown", "", "plain,plain"):
        with pytest.raises(ValueError):
            configs.parse_config_list(bad)


def test_adaptive_config_file_is_written_for_the_adaptive_server_only_and_stops_at_3_steps(tmp_path):
    parser = argparse.ArgumentParser()
    configs.add_server_arguments(parser)
    setup = configs.server_setup(parser.parse_args(["--model-path", "m", "--configs", "plain,adaptive"]), tmp_path)
    loaded = json.loads(Path(setup.adaptive_config_path).read_text())
    all_steps = set()
    for key, entry in loaded.items():
        assert key.isdigit()
        steps = entry["candidate_steps"]
        assert steps and all(isinstance(s, int) and s >= 0 for s in steps)
        all_steps.update(steps)
    assert max(all_steps) == 3 and 0 in all_steps
    without = configs.server_setup(parser.parse_args(["--model-path", "m", "--configs", "plain"]), tmp_path / "x")
    assert without.adaptive_config_path is None and not (tmp_path / "x").exists()


def test_servers_sharing_a_gpu_get_one_kv_cap_and_equal_shares_of_the_memory_by_start_order():
    flags = [flag_values(list(configs.memory_flags(index, 3, 120000))) for index in range(3)]
    assert [f["--mem-fraction-static"] for f in flags] == [("0.28",), ("0.57",), ("0.85",)]
    assert {f["--max-total-tokens"] for f in flags} == {("120000",)}
    pair = [float(configs.memory_flags(index, 2, 1)[1]) for index in range(2)]
    assert pair == [0.42, 0.85]  # the first of two 8B-shaped servers on an H100 needs more than 0.40
