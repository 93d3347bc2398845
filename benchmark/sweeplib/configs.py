"""Server command lines of the compared configurations: one base command for all, only the
speculative flags appended to it differ."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

PLAIN, EAGLE3, ADAPTIVE, DYNAMIC, DYNAMIC_FIXED = "plain", "eagle3", "adaptive", "dynamic", "dynamic-fixed"
CONFIG_NAMES: tuple[str, ...] = (PLAIN, EAGLE3, ADAPTIVE, DYNAMIC, DYNAMIC_FIXED)
DYNAMIC_CONFIGS = (DYNAMIC, DYNAMIC_FIXED)  # the EAGLE3_DYNAMIC servers
# EAGLE3_DYNAMIC with the fixed thresholds it shipped with before automatic switching.
FIXED_THRESHOLD_ARGS = ("--speculative-disable-batch-threshold", "24", "--speculative-enable-batch-threshold", "16",
                        "--speculative-switch-patience", "4")
# sglang picks backends and graph sizes, as for users (on an H200: fa3, flashinfer sampling, decode graphs to 256).
DEFAULT_COMMON_ARGS = "--mem-fraction-static 0.80"
LAST_MEMORY_FRACTION = 0.85  # of the last of several servers sharing a GPU (memory_flags)
ADAPTIVE_CONFIG_FILE = "adaptive_config.json"
# sglang's DEFAULT_ADAPTIVE_CONFIG (srt/speculative/adaptive_spec_params.py) without its 7-step candidate, which
# crashed in CUDA-graph capture; a batch uses the entry of the largest key <= its (graph padded) size.
ADAPTIVE_CONFIG_UP_TO_3_STEPS: dict[str, dict[str, object]] = {key: {
    "candidate_steps": steps, "up_hysteresis": 0.0, "down_hysteresis": down, "ceiling_coeff": 0} for key, steps, down in (
    ("1", [1, 3], -0.25), ("8", [0, 1, 3], 0.0), ("32", [0, 1], 0.0), ("64", [0], 0.0))}


@dataclass(frozen=True)
class ServerSetup:
    model_path: str
    draft_model_path: str | None
    load_format: str | None
    host: str
    port: int
    common_args: tuple[str, ...]
    dynamic_args: tuple[str, ...]
    adaptive_config_path: str | None
    spec_shape: tuple[int, int, int] = (3, 1, 4)  # draft steps, topk, draft tokens of every speculative server
    python: str = sys.executable


def server_command(config: str, setup: ServerSetup) -> list[str]:
    """The base command (the same for every configuration), then the flags that distinguish
    `config` from plain decoding."""
    if config not in CONFIG_NAMES:
        raise ValueError(f"unknown configuration {config!r}; known: {', '.join(CONFIG_NAMES)}")
    command = [setup.python, "-m", "sglang.launch_server", "--model-path", setup.model_path,
               "--host", setup.host, "--port", str(setup.port)]
    command += (["--load-format", setup.load_format] if setup.load_format else []) + list(setup.common_args)
    if config == PLAIN:
        return command
    algorithm = "EAGLE3_DYNAMIC" if config in DYNAMIC_CONFIGS else "EAGLE3"
    if not setup.draft_model_path:
        raise ValueError(f"--speculative-algorithm {algorithm} needs a draft model path")
    steps, topk, draft_tokens = setup.spec_shape
    command += ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", setup.draft_model_path,
                *(["--speculative-draft-load-format", setup.load_format] if setup.load_format else []),
                "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
                "--speculative-num-draft-tokens", str(draft_tokens)]
    if config == ADAPTIVE:
        if not setup.adaptive_config_path:
            raise ValueError("the adaptive configuration needs an adaptive config file")
        command += ["--speculative-adaptive", "--speculative-adaptive-config", setup.adaptive_config_path]
    return command + list({DYNAMIC: setup.dynamic_args, DYNAMIC_FIXED: FIXED_THRESHOLD_ARGS}.get(config, ()))


def memory_flags(index: int, count: int, max_total_tokens: int) -> tuple[str, ...]:
    """The ``index``-th of ``count`` servers on one GPU: one KV cap; (index + 1) / count of 0.85 as static memory fraction
    (sglang's sizing counts the servers before it; a first of two at 0.35 got 101,776 of 120,000 tokens, H100)."""
    fraction = LAST_MEMORY_FRACTION * (index + 1) / count
    return ("--mem-fraction-static", f"{fraction:.2f}", "--max-total-tokens", str(max_total_tokens))


def set_flags(args: tuple[str, ...], flags: tuple[str, ...]) -> tuple[str, ...]:
    """``args`` without the flags named in ``flags`` (pairs of flag and value), then ``flags``."""
    names = set(flags[::2])
    return tuple(t for i, t in enumerate(args) if t not in names and not (i and args[i - 1] in names)) + flags


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
    """The server flags of the benchmark and of the kernel profiler."""
    for flag, kwargs in (
        ("--model-path", dict(required=True, help="target model (path or hub id)")),
        ("--draft-model-path", dict(help="EAGLE-3 draft model; needed by every configuration but plain")),
        ("--load-format", dict(help="e.g. dummy; also sets --speculative-draft-load-format")),
        ("--configs", dict(default=",".join(CONFIG_NAMES), help="comma-separated (default %(default)s)")),
        ("--common-args", dict(default=DEFAULT_COMMON_ARGS, help="flags for every server (default: %(default)s)")),
        ("--dynamic-args", dict(default="", help="extra flags for the dynamic server only")),
        ("--server-env", dict(action="append", default=[], metavar="NAME=VALUE",
                              help="environment variable for every server, repeatable")),
        ("--host", dict(default="127.0.0.1")), ("--port", dict(type=int, default=30000)),
        ("--server-timeout-s", dict(type=float, default=300.0, help="longest wait for /health (default %(default)s)")),
        ("--adaptive-config", dict(help="adaptive config JSON (default: one with steps <= 3, written into --out)")),
        ("--spec-steps", dict(type=int, default=3, help="--speculative-num-steps (default %(default)s)")),
        ("--spec-topk", dict(type=int, default=1, help="--speculative-eagle-topk (default %(default)s)")),
        ("--spec-draft-tokens", dict(type=int, default=4, help="--speculative-num-draft-tokens (default 4)")),
    ):
        parser.add_argument(flag, **kwargs)


def server_setup(args: argparse.Namespace, out_dir: Path) -> ServerSetup:
    """The setup of the arguments; the adaptive configuration served without --adaptive-config
    gets the default config, written into ``out_dir``."""
    adaptive_config = args.adaptive_config
    if ADAPTIVE in parse_config_list(args.configs) and adaptive_config is None:
        path = (out_dir / ADAPTIVE_CONFIG_FILE).resolve()
        path.write_text(json.dumps(ADAPTIVE_CONFIG_UP_TO_3_STEPS, indent=2) + "\n")
        adaptive_config = str(path)
    return ServerSetup(args.model_path, args.draft_model_path, args.load_format, args.host, args.port,
                       tuple(shlex.split(args.common_args)), tuple(shlex.split(args.dynamic_args)),
                       adaptive_config, (args.spec_steps, args.spec_topk, args.spec_draft_tokens))
