"""Shared helpers for GPU tests: start sglang servers, talk to them over HTTP.

These tests need a CUDA GPU and sglang 0.5.17 with this package installed
(``bash test/gpu/run.sh`` sets that up from an offline sglang install).
The 8B-shaped model folders come from ``SGLANG_DE_MODELS``, else ``$SGLANG_OFFLINE_ENV/models``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from token_comparison import (
    TOP_LOGPROBS,
    bf16_flip_margin,
    compare_outputs,
    flip_allowance,
    reference_verdict,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "benchmark"))
from sweeplib import server as lifecycle  # noqa: E402  (the benchmark's server lifecycle)

_MODELS_FOLDER = os.environ.get("SGLANG_DE_MODELS") or (
    os.path.join(os.environ["SGLANG_OFFLINE_ENV"], "models")
    if os.environ.get("SGLANG_OFFLINE_ENV") else None)
MODEL_FOLDERS: Optional[Path] = Path(_MODELS_FOLDER) if _MODELS_FOLDER else None
TINY_PAIR = REPO_ROOT / "models" / "tiny-pair"
TINY_PAIR_DTYPE = os.environ.get("TINY_PAIR_DTYPE", "float32")
# EAGLE3_DYNAMIC fixed thresholds for the switching tests: small enough that a handful of
# requests crosses them.
FIXED_THRESHOLD_FLAGS = [
    "--speculative-disable-batch-threshold", "2",
    "--speculative-enable-batch-threshold", "2",
    "--speculative-switch-patience", "2",
]
# Server logs (server_<name>.log) go here; run.sh points it at its output folder.
LOG_DIR = Path(os.environ.get("SGLANG_DE_LOG_DIR", "/tmp"))
# The tiny EAGLE3_DYNAMIC server's own triton cache, emptied before it starts: every kernel it
# compiles (at start-up or while serving) leaves an entry there.
TINY_DYNAMIC_TRITON_CACHE = LOG_DIR / "triton-cache-tiny_dynamic"
# test/gpu/native_ops_plugin: float32 servers need it (sglang's CUDA rmsnorm takes no float32).
NATIVE_OPS_ENV = "SGLANG_DE_TEST_NATIVE_OPS"
NATIVE_OPS_PLUGIN = "dynamic_eagle_test_native_ops"
# The same package's dummy-weights plugin: matrices from normal(0, 0.02), norm weights 1, so a
# dummy model's logits spread over about one unit and the tie rule below can tell tokens apart
# (sglang's own dummy weights put every top-2 margin below 3e-6).
DUMMY_WEIGHTS_ENV = "SGLANG_DE_TEST_DUMMY_WEIGHT_STD"
DUMMY_WEIGHTS_PLUGIN = "dynamic_eagle_test_dummy_weights"
DUMMY_WEIGHT_STD = "0.02"
START_TIMEOUT_S = 420

# Each tiny server holds a KV pool of this many tokens (the capacity test's 128 requests of at
# most 500 positions need 64 000) and leaves the rest of the GPU to the others, so that the
# servers a run uses start together instead of each sizing its pools from what the ones before
# it left free.
TINY_KV_TOKENS = 131072
TINY_MEMORY_ARGS = ["--mem-fraction-static", "0.9", "--max-total-tokens", str(TINY_KV_TOKENS)]

COMMON_SERVER_ARGS = [
    "--attention-backend", "triton",
    "--sampling-backend", "pytorch",
    "--disable-prefill-cuda-graph",
    "--cuda-graph-max-bs-decode", "128",
]
# The flags above that replace what sglang picks by itself on Hopper (fa3 attention, flashinfer
# sampling, prefill CUDA graphs): flag -> how many values follow it.
BACKEND_FLAGS = {"--attention-backend": 1, "--sampling-backend": 1, "--disable-prefill-cuda-graph": 0}


# Which backends the suites' servers run: "pinned" (COMMON_SERVER_ARGS) or "sglang" (sglang's own
# choices: on Hopper fa3 attention, flashinfer sampling, prefill CUDA graphs; the float32 tiny pair
# keeps triton attention, fa3 has no float32). Without the variable, a suite's own default: sglang's
# for the 8B-shaped suite (it passed with them on an H200, 2026-12-05) and for the tiny-pair suite,
# the tiny pair's checks and the sampling tests (all passed with them on an H100, 2026-12-05);
# pinned for the others (configurations, soak, acceptance mixtures) until they have run with sglang's.
BACKENDS_ENV = "SGLANG_DE_TEST_BACKENDS"


def backend_args(*, float32: bool = False, default: str = "pinned") -> List[str]:
    """COMMON_SERVER_ARGS as SGLANG_DE_TEST_BACKENDS asks, else as ``default`` (comment above)."""
    choice = os.environ.get(BACKENDS_ENV, default)
    if choice not in ("pinned", "sglang"):
        raise ValueError(f"{BACKENDS_ENV}={choice!r}: use pinned or sglang")
    if choice == "pinned":
        return list(COMMON_SERVER_ARGS)
    return (["--attention-backend", "triton"] if float32 else []) + with_sglang_defaults(COMMON_SERVER_ARGS)


def with_sglang_defaults(args: List[str]) -> List[str]:
    """``args`` without BACKEND_FLAGS: the server runs what sglang chooses on its GPU."""
    kept, skip = [], 0
    for arg in args:
        if skip:
            skip -= 1
        elif arg in BACKEND_FLAGS:
            skip = BACKEND_FLAGS[arg]
        else:
            kept.append(arg)
    return kept


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post(self, path: str, payload: dict, timeout: float = 600) -> dict:
        request = urllib.request.Request(
            self.url + path,
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def get(self, path: str, timeout: float = 60) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            return json.loads(response.read())

    def flush_cache(self) -> None:
        """Empty the radix cache (sglang answers in plain text); sglang waits up to the timeout
        for the last requests to leave the scheduler, and refuses while any runs."""
        request = urllib.request.Request(self.url + "/flush_cache?timeout=30", data=b"", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                text = response.read().decode(errors="replace")
        except urllib.error.HTTPError as error:  # 400: still busy at the timeout
            text = f"HTTP {error.code}: {error.read().decode(errors='replace')}"
        assert "Cache flushed" in text, f"{self.name}: /flush_cache answered {text!r}"

    def generate(
        self,
        input_ids: Sequence[int],
        max_new_tokens: int,
        *,
        top_logprobs_num: int = 0,
        sampling: Optional[Dict[str, float]] = None,
        return_logprob: bool = False,
    ) -> dict:
        """Greedy unless ``sampling`` is given: then its parameters replace the temperature
        (``{}``: sglang's defaults, temperature 1.0)."""
        payload = {
            "input_ids": list(input_ids),
            "sampling_params": {
                **({"temperature": 0.0} if sampling is None else sampling),
                "max_new_tokens": max_new_tokens,
                "ignore_eos": True,
            },
        }
        if top_logprobs_num or return_logprob:
            payload.update(return_logprob=True, top_logprobs_num=top_logprobs_num)
        return self.post("/generate", payload)

    def dynamic_counters(self) -> Dict[str, float]:
        info = self.get("/server_info")
        states = info.get("internal_states") or [{}]
        return states[0].get("dynamic_eagle", {})

    def internal_state(self) -> dict:
        info = self.get("/server_info")
        return (info.get("internal_states") or [{}])[0]

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(line for line in text[-lines:] if "server_args=" not in line)


def _lifecycle_view(server: Server) -> lifecycle.RunningServer:
    return lifecycle.RunningServer(server.name, server.process, server.log_path, server.url)


def start_server(name: str, args: List[str], env: Optional[Dict[str, str]] = None) -> Server:
    """The benchmark's server start (its own process group, log to LOG_DIR/server_<name>.log)."""
    port = free_port()
    log_path = LOG_DIR / f"server_{name}.log"
    command = [sys.executable, "-m", "sglang.launch_server", "--port", str(port), *args]
    running = lifecycle.start_server(name, command, env or {}, log_path,
                                     lifecycle.base_url_of("127.0.0.1", port))
    return Server(name=name, port=port, process=running.process, log_path=log_path)


def wait_healthy(server: Server) -> None:
    lifecycle.wait_until_healthy(_lifecycle_view(server), START_TIMEOUT_S, tail_lines=60)


def stop_server(server: Server) -> None:
    """Stops the server's whole process group and waits until it is gone (its GPU memory free)."""
    lifecycle.stop_server(_lifecycle_view(server))


@contextlib.contextmanager
def running_servers(
    specs: Dict[str, List[str]],
    env: Optional[Dict[str, str]] = None,
    server_envs: Optional[Dict[str, Dict[str, str]]] = None,
) -> Iterator[Dict[str, Server]]:
    """Start servers one after another on the shared GPU, yield them by name. ``env`` goes to
    every server, ``server_envs[name]`` to one.

    sglang sizes its memory from what is free when it starts, so starts are
    sequential: give later servers a larger --mem-fraction-static (a fraction
    of what the earlier ones left free).
    """
    servers: Dict[str, Server] = {}
    try:
        for name, args in specs.items():
            servers[name] = start_server(name, args, {**(env or {}), **(server_envs or {}).get(name, {})})
            wait_healthy(servers[name])
        yield servers
    finally:
        for server in servers.values():
            stop_server(server)


# sglang's own EAGLE3 tree for Llama targets: 5 steps, topk 4, 8 draft tokens.
TREE_SHAPE = [
    "--speculative-num-steps", "5",
    "--speculative-eagle-topk", "4",
    "--speculative-num-draft-tokens", "8",
]


SERVERS_MARKER = "uses_servers"


def servers_used_by(items: Iterable, specs: Dict[str, List[str]]) -> List[str]:
    """Those of ``specs``' servers that the given tests name in their ``uses_servers``
    markers, in the tests' order."""
    names: List[str] = []
    for item in items:
        for marker in item.iter_markers(SERVERS_MARKER):
            names += [name for name in marker.args if name in specs and name not in names]
    return names


class LazyServers:
    """Servers started together by ``start`` (those the selected tests name) or on first use
    (``servers[name]``), and stopped together by ``stop_all``, so that a run of some of the
    tests starts only the servers those tests use. A server that failed to start is stopped,
    and its error is raised to each test that asks for it, not to the others."""

    def __init__(
        self,
        specs: Dict[str, List[str]],
        env: Optional[Dict[str, str]] = None,
        server_envs: Optional[Dict[str, Dict[str, str]]] = None,
    ) -> None:
        self._specs = specs
        self._env = env or {}
        self._server_envs = server_envs or {}
        self._started: Dict[str, Server] = {}
        self._failed: Dict[str, lifecycle.ServerError] = {}

    def __getitem__(self, name: str) -> Server:
        self.start([name])
        if name in self._failed:
            raise self._failed[name]
        return self._started[name]

    def start(self, names: Sequence[str]) -> None:
        """Starts those of the named servers that neither run nor failed yet, all at once, and
        waits until each is healthy (their specs must not size memory from what the others
        leave free)."""
        starting = [name for name in dict.fromkeys(names)
                    if name not in self._started and name not in self._failed]
        for name in starting:
            self._started[name] = start_server(name, self._specs[name],
                                               {**self._env, **self._server_envs.get(name, {})})
        for name in starting:
            try:
                wait_healthy(self._started[name])
            except lifecycle.ServerError as error:
                self._failed[name] = error
                stop_server(self._started.pop(name))

    def stop(self, name: str) -> None:
        """Stops one server if it runs, freeing its GPU memory for the next start."""
        server = self._started.pop(name, None)
        if server is not None:
            stop_server(server)

    def stop_all(self) -> None:
        for server in self._started.values():
            stop_server(server)
        self._started.clear()


def eagle3_args(draft_path: Path, *, dummy: bool) -> List[str]:
    args = [
        "--speculative-draft-model-path", str(draft_path),
        "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4",
    ]
    if dummy:
        args += ["--speculative-draft-load-format", "dummy"]
    return args


def tiny_pair_args(pair: Path = TINY_PAIR, backends: str = "pinned") -> Tuple[List[str], List[str]]:
    """Server arguments of a tiny trained target (the committed pair unless ``pair`` names
    another folder written by models/train_tiny_pair.py), and of its EAGLE-3 draft (chain
    3/1/4); ``backends``: the default of ``backend_args``."""
    target = ["--model-path", str(pair / "target"), "--dtype", TINY_PAIR_DTYPE,
              *backend_args(float32=TINY_PAIR_DTYPE == "float32", default=backends),
              "--cuda-graph-max-bs-decode", "32"]
    return target, eagle3_args(pair / "draft", dummy=False)


def dummy8b_args(model_folders: Path, backends: str = "pinned") -> Tuple[List[str], List[str]]:
    """Server arguments of the 8B-shaped dummy target, and of the dummy EAGLE-3 draft for it;
    ``backends``: the default of ``backend_args``."""
    target = ["--model-path", str(model_folders / "llama8b"), "--load-format", "dummy",
              *backend_args(default=backends)]
    return target, eagle3_args(model_folders / "eagle3-llama8b", dummy=True)


def dummy_weights_env() -> Dict[str, str]:
    """Environment of every dummy-weight test server (see DUMMY_WEIGHTS_ENV)."""
    from importlib.metadata import entry_points

    if DUMMY_WEIGHTS_PLUGIN not in {ep.name for ep in entry_points(group="sglang.srt.plugins")}:
        raise RuntimeError(
            "dummy-weight test servers need the test plugin: pip install --no-deps "
            "--no-build-isolation -e test/gpu/native_ops_plugin"
        )
    return {DUMMY_WEIGHTS_ENV: DUMMY_WEIGHT_STD}


def tiny_pair_server_env() -> Dict[str, str]:
    """Environment of the tiny-pair servers.

    Triton's tl.dot rounds float32 inputs to TF32 by default, and the attention kernels of a
    verify step (extend) and of a plain decode step differ: exact float32 makes both agree.
    Serving float32 at all needs the test-only native-ops plugin (installed by run.sh).
    """
    env = {"TRITON_F32_DEFAULT": "ieee"}
    if TINY_PAIR_DTYPE == "float32":
        from importlib.metadata import entry_points

        if NATIVE_OPS_PLUGIN not in {ep.name for ep in entry_points(group="sglang.srt.plugins")}:
            raise RuntimeError(
                "float32 tiny-pair servers need the test plugin: pip install --no-deps "
                "--no-build-isolation -e test/gpu/native_ops_plugin (or set TINY_PAIR_DTYPE=bfloat16)"
            )
        env[NATIVE_OPS_ENV] = "1"
    return env


def make_prompts(count: int, seed: int) -> List[Dict]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        length = rng.choice([8, 32, 128, 512])
        prompts.append(
            {
                "input_ids": [rng.randrange(3, 8000) for _ in range(length)],
                "max_new_tokens": rng.choice([16, 40, 80, 128]),
            }
        )
    return prompts


def send_in_waves(server, prompts: Sequence[Dict], wave_size: int, **kwargs) -> List[dict]:
    """Send prompts wave by wave: each wave starts at `wave_size` running
    requests and drains to one, so the batch crosses both thresholds."""
    outputs: List[dict] = []
    with ThreadPoolExecutor(max_workers=wave_size) as pool:
        for start in range(0, len(prompts), wave_size):
            wave = prompts[start : start + wave_size]
            outputs += list(
                pool.map(
                    lambda p: server.generate(p["input_ids"], p["max_new_tokens"], **kwargs),
                    wave,
                )
            )
    return outputs


def send_cold(server, prompts: Sequence[Dict], wave_size: int, **kwargs) -> List[dict]:
    """``send_in_waves`` after emptying the server's radix cache, so that every pass over the
    same prompts prefills them whole (a cached prefix makes the last position an extend of
    one token: other numerics)."""
    server.flush_cache()
    return send_in_waves(server, prompts, wave_size, **kwargs)


def reference_flip_count(reference, prompts: Sequence[Dict], wave_size: int, expected: Sequence[dict],
                         flip_margin: float, label: str) -> Tuple[List[dict], int]:
    """The reference's outputs and its bf16 flips against ``expected``: the worse of two cold
    passes. Its count moves between passes over the same prompts (which requests share a prefill
    batch depends on when they arrive, and the batch's shape moves bf16 near-ties: EAGLE3 on fa3
    with prefill graphs gave 16, then 8 in two runs, and 10, then 24 in two passes of one run)."""
    outputs = send_cold(reference, prompts, wave_size)
    first = compare_outputs(outputs, expected, flip_margin)
    again = compare_outputs(send_cold(reference, prompts, wave_size), expected, flip_margin)
    counts = [len(first.flips), len(again.flips)]
    print(f"{label}: {reference.name} against plain: {first.summary()}; again {again.summary()}")
    return outputs, max(counts)


def assert_lossless_across_switches(
    dynamic: Server, plain: Server, prompts: Sequence[Dict], wave_size: int, label: str,
    min_switches: int = 10, reference: Optional[Server] = None,
    judged_by_reference: bool = False,
) -> Dict[str, float]:
    """Send ``prompts`` in waves to both servers; the dynamic server must switch at least
    ``min_switches`` times each way and match the plain server (bf16 rule of
    ``token_comparison``). With a ``reference`` server (sglang's EAGLE3 of the same pair), its
    outputs are compared with plain too, and the dynamic server may show at most
    ``flip_allowance`` more bf16 flips than the worse of two passes of it.
    ``judged_by_reference`` (a reference needed): for a target whose outputs move beyond the bf16 rule with the batch's shape (an MoE),
    the dynamic server must be within the reference by ``token_comparison.ReferenceVerdict``
    instead of the bf16 rule. Returns the dynamic server's counters."""
    assert reference is not None or not judged_by_reference, "judged_by_reference needs a reference"
    before = dynamic.dynamic_counters()
    outputs = send_cold(dynamic, prompts, wave_size)
    after = dynamic.dynamic_counters()
    expected = send_cold(plain, prompts, wave_size, top_logprobs_num=TOP_LOGPROBS)
    flip_margin = bf16_flip_margin(expected)
    comparison = compare_outputs(outputs, expected, flip_margin)
    switches = {key: after[key] - before.get(key, 0)
                for key in ("switches_to_plain", "switches_to_speculative")}
    print(f"{label}: {len(prompts)} prompts, switches {switches}, flip margin {flip_margin:.5f}, "
          f"against plain: {comparison.summary()}; counters {after}")
    assert min(switches.values()) >= min_switches
    if reference is None:
        assert not comparison.failures
        return after
    if judged_by_reference:
        reference_outputs = send_cold(reference, prompts, wave_size)
        print(f"{label}: {reference.name} against plain: "
              f"{compare_outputs(reference_outputs, expected, flip_margin).summary()}")
        verdict = reference_verdict(outputs, reference_outputs, expected)
        print(f"{label}: against {reference.name}: {verdict.summary()}")
        assert verdict.within
    else:
        _, reference_flips = reference_flip_count(reference, prompts, wave_size, expected,
                                                  flip_margin, label)
        assert len(comparison.flips) <= reference_flips + flip_allowance(reference_flips)
        assert not comparison.failures
    return after
