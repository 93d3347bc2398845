"""Server command lines of the compared configurations: one base command for all, only the
speculative flags appended to it differ."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

PLAIN = "plain"
EAGLE3 = "eagle3"
ADAPTIVE = "adaptive"
DYNAMIC = "dynamic"
DYNAMIC_FIXED = "dynamic-fixed"
CONFIG_NAMES: tuple[str, ...] = (PLAIN, EAGLE3, ADAPTIVE, DYNAMIC, DYNAMIC_FIXED)

# EAGLE3_DYNAMIC with the fixed thresholds it shipped with before automatic switching, next to
# the default (automatic) configuration.
FIXED_THRESHOLD_ARGS = ("--speculative-disable-batch-threshold", "24", "--speculative-enable-batch-threshold", "16",
                        "--speculative-switch-patience", "4")

# The GPU machine's recipe (shared/gpu/README.md): FA3 is not in the runtime kit, flashinfer
# attention would JIT-compile on every fresh machine, and prefill CUDA-graph capture costs ~60 s
# per server start.
DEFAULT_COMMON_ARGS = (
    "--attention-backend triton --sampling-backend pytorch --disable-prefill-cuda-graph "
    "--mem-fraction-static 0.80 --cuda-graph-max-bs-decode 128"
)

# sglang's DEFAULT_ADAPTIVE_CONFIG (srt/speculative/adaptive_spec_params.py) with its 7-step
# candidate dropped: that default crashed in CUDA-graph capture while building the steps=7
# state. Keys are batch sizes; a batch uses the entry of the largest key <= its (CUDA-graph
# padded) size.
ADAPTIVE_CONFIG_UP_TO_3_STEPS: dict[str, dict[str, object]] = {
    "1": {"candidate_steps": [1, 3], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}


@dataclass(frozen=True)
class SpeculativeShape:
    """The EAGLE draft shape shared by every speculative configuration."""

    num_steps: int = 3
    eagle_topk: int = 1
    num_draft_tokens: int = 4


@dataclass(frozen=True)
class ServerSetup:
    """Everything needed to build the server command of any configuration."""

    model_path: str
    draft_model_path: str | None
    load_format: str | None
    host: str
    port: int
    common_args: tuple[str, ...]
    dynamic_args: tuple[str, ...]
    adaptive_config_path: str | None
    spec_shape: SpeculativeShape
    python: str = sys.executable


def server_command(config: str, setup: ServerSetup) -> list[str]:
    """The base command (the same for every configuration), then the flags that distinguish
    `config` from plain decoding."""
    command = [setup.python, "-m", "sglang.launch_server", "--model-path", setup.model_path,
               "--host", setup.host, "--port", str(setup.port)]
    command += ["--load-format", setup.load_format] if setup.load_format else []
    command += list(setup.common_args)
    if config not in CONFIG_NAMES:
        raise ValueError(f"unknown configuration {config!r}; known: {', '.join(CONFIG_NAMES)}")
    if config == PLAIN:
        return command
    algorithm = "EAGLE3_DYNAMIC" if config in (DYNAMIC, DYNAMIC_FIXED) else "EAGLE3"
    if not setup.draft_model_path:
        raise ValueError(f"--speculative-algorithm {algorithm} needs a draft model path")
    command += ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", setup.draft_model_path]
    command += ["--speculative-draft-load-format", setup.load_format] if setup.load_format else []
    shape = setup.spec_shape
    command += ["--speculative-num-steps", str(shape.num_steps), "--speculative-eagle-topk",
                str(shape.eagle_topk), "--speculative-num-draft-tokens", str(shape.num_draft_tokens)]
    if config == ADAPTIVE:
        if not setup.adaptive_config_path:
            raise ValueError("the adaptive configuration needs an adaptive config file")
        command += ["--speculative-adaptive", "--speculative-adaptive-config", setup.adaptive_config_path]
    return command + list({DYNAMIC: setup.dynamic_args, DYNAMIC_FIXED: FIXED_THRESHOLD_ARGS}.get(config, ()))


def write_adaptive_config(path: Path) -> None:
    path.write_text(json.dumps(ADAPTIVE_CONFIG_UP_TO_3_STEPS, indent=2) + "\n")


def parse_config_list(text: str) -> list[str]:
    """'plain,eagle3' as a list of known configuration names, in the given order."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or any(name not in CONFIG_NAMES for name in names):
        raise ValueError(f"bad configuration list {text!r}; choose from {', '.join(CONFIG_NAMES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"configuration listed twice in {text!r}")
    return names


def parse_env_assignments(assignments: list[str]) -> dict[str, str]:
    """The servers' environment from repeated --server-env NAME=VALUE."""
    env = {}
    for name, sep, value in (assignment.partition("=") for assignment in assignments):
        if not sep or not name:
            raise ValueError(f"--server-env expects NAME=VALUE, got {name + sep + value!r}")
        env[name] = value
    return env


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The server flags of the sweep and of the kernel profiler."""
    for flag, kwargs in (
        ("--model-path", dict(required=True, help="target model (path or hub id)")),
        ("--draft-model-path", dict(help="EAGLE-3 draft model; needed by every configuration but plain")),
        ("--load-format", dict(help="e.g. dummy; also sets --speculative-draft-load-format")),
        ("--configs", dict(default=",".join(CONFIG_NAMES), help="comma-separated, run in the given order "
                                                                "(default %(default)s)")),
        ("--common-args", dict(default=DEFAULT_COMMON_ARGS, help="flags for every server (default: %(default)s)")),
        ("--dynamic-args", dict(default="", help="extra flags for the dynamic server only")),
        ("--server-env", dict(action="append", default=[], metavar="NAME=VALUE",
                              help="environment variable for every server, repeatable")),
        ("--host", dict(default="127.0.0.1")), ("--port", dict(type=int, default=30000)),
        ("--server-timeout-s", dict(type=float, default=300.0, help="longest wait for /health (default %(default)s)")),
        ("--adaptive-config", dict(help="adaptive config JSON (default: one with steps <= 3, written into --out)")),
        ("--spec-steps", dict(type=int, default=3, help="--speculative-num-steps (default %(default)s)")),
        ("--spec-topk", dict(type=int, default=1, help="--speculative-eagle-topk (default %(default)s)")),
        ("--spec-draft-tokens", dict(type=int, default=4,
                                     help="--speculative-num-draft-tokens (default %(default)s)")),
    ):
        parser.add_argument(flag, **kwargs)


ADAPTIVE_CONFIG_FILE = "adaptive_config.json"


def adaptive_config_path(args: argparse.Namespace, config_names: list[str], out_dir: Path) -> str | None:
    """The adaptive configuration's config file: --adaptive-config, or (when the adaptive
    configuration is served without one) the default, written into ``out_dir``."""
    if ADAPTIVE not in config_names or args.adaptive_config is not None:
        return args.adaptive_config
    path = (out_dir / ADAPTIVE_CONFIG_FILE).resolve()
    write_adaptive_config(path)
    return str(path)


def server_setup(args: argparse.Namespace, adaptive_config: str | None = None) -> ServerSetup:
    return ServerSetup(args.model_path, args.draft_model_path, args.load_format, args.host, args.port,
                       tuple(shlex.split(args.common_args)), tuple(shlex.split(args.dynamic_args)),
                       adaptive_config, SpeculativeShape(args.spec_steps, args.spec_topk, args.spec_draft_tokens))
