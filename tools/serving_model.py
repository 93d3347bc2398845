"""A model of one sglang server under open-loop traffic, to judge a switching policy where its
decisions feed back into the load: a slow mode lets the queue grow, the batch fills to the KV
pool, and requests wait longer for their first token. A replay of a recorded trace cannot show
that (its batches are the recorded ones, whatever the policy decides); this model can, on
traffic no GPU run has seen. It is a model, not a measurement: its numbers say what the policy
does under the step model below, and where the policy and the model disagree with a GPU run
the GPU run wins.

The server (sglang 0.5.17's scheduler, simplified): each loop runs either one prefill batch
(waiting requests admitted in arrival order while the running batch is under its cap, the
prefill under ``chunk_tokens`` and the KV pool holds their prompts plus a reserve of
``new_token_ratio`` of their outputs) or one decode step of every running request. As in
sglang's overlap loop (its default), the next item is chosen when the current one begins, so a
request arriving at a busy server waits out the running item and the one already chosen
(``ServerShape.overlap``). A request's first token comes with its prefill, before the draft's
part on EAGLE3_DYNAMIC in the overlap loop (``ServerShape.early_first_token``). A system prompt shared by a group of requests (``shared-R``)
is prefilled by the first of them and then found in the prefix cache (never evicted); the pool
holds it once while a running request uses it; attention still reads it for every request. Costs (milliseconds, named quantities of the GPU and model):

    plain step  = plain_fixed + plain_per_request * b + K * target_kv_bytes / bandwidth,
                  plus plain_mode_extra on a server that speculates (the work around its plain step)
    spec step   = spec_fixed + spec_per_request * b + K * (target + (draft_steps + 1) * draft)
                  KV bytes / bandwidth
    prefill     = prefill_fixed + tokens * 2 * params / achieved_flops, times (1 + the draft's
                  share) on a server that speculates (EAGLE-3's draft extends every prefill)
    catch-up    = catchup_fixed + catchup_per_token * tokens, plus ``catchup_compile`` the first
                  time its token count is a multiple of 16 and the first time it is not (a
                  compile at a new shape: triton specialises integer arguments by divisibility by
                  16; on an H100, 2026-12-05, two catch-ups of 288 tokens took 49.6 ms where
                  1,785 tokens later took 2.0 ms; ``--catchup-compile-ms``, default 0)

with b the batch, K its KV tokens, every step time drawn with ``noise`` (relative spread); the
policy's start-up calibration is each step's graph replay (``GpuCosts.replay_ms``: a share of
the step, or on triton a flat speculative replay with the host work left to the fit). A
speculative step yields, per request, 1 + the drafts its chain accepts: each of
``draft_steps`` drafts accepted with the probability that gives the request's mean acceptance
(or, ``--draws simulated``, as the GPU benchmark's simulated acceptance). The traffic is the GPU
benchmark's named workloads (``benchmark/sweeplib/workloads.py``), sent as
``sglang.bench_serving`` sends them (``Client``), after its warm-up workload; the policy is fed
as the worker feeds it.

    python3 tools/serving_model.py --workloads poisson-40@8,poisson-10@12,load-step --costs fa3
    python3 tools/serving_model.py --workloads poisson-30,closed-64 --acceptance 1.3:0.5,4.0:0.5 --costs triton
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from sglang_dynamic_eagle.policy.replay import FEEDBACK_LAG_STEPS, throughput_policy_for
from sglang_dynamic_eagle.policy.types import DecodeMode, StepObservation
from paired_requests import slow_clusters  # noqa: E402  (tools/: request-by-request comparison of first tokens)

PLAIN, SPEC = DecodeMode.PLAIN, DecodeMode.SPECULATIVE


def graph_sizes(speculative: bool, max_bs: int = 256) -> List[int]:
    """The decode CUDA graph sizes sglang captures without a flag (to 256 on an H200): its own
    list for a plain server or for EAGLE's graphs."""
    from sglang.srt.server_args import ServerArgs

    view = SimpleNamespace(disable_cuda_graph_padding=False,
                           speculative_algorithm="EAGLE3" if speculative else None)
    return ServerArgs._generate_decode_cuda_graph_batch_sizes(view, max_bs)


PLAIN_GRAPHS, SPEC_GRAPHS = graph_sizes(False), graph_sizes(True)


@dataclass(frozen=True)
class GpuCosts:
    """One GPU serving one target and draft (defaults: an H200, an 8B-shaped Llama target with
    an EAGLE-3 draft, fa3 attention; step terms from the start-up calibration of such a server,
    KV bytes from the shapes, the draft prefill share as measured on traffic: 4-9%)."""

    plain_fixed_ms: float = 4.7
    plain_per_request_ms: float = 0.03
    spec_fixed_ms: float = 8.4
    spec_per_request_ms: float = 0.06
    target_kv_bytes: float = 131072.0  # 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes
    draft_kv_bytes: float = 4096.0  # one layer
    draft_steps: int = 3
    bandwidth_gbps: float = 4000.0
    params: float = 8.0e9
    # Prefill matmul rate: the one number set from a run. Plain decoding served 16.9 req/s of
    # the mixed-length overload (Poisson 40/s, triton; benchmark/results/2026-12-04-h200-
    # dummy8b-traffic-policy-v2, run b); the model serves 16.8 with this.
    achieved_tflops: float = 400.0
    prefill_fixed_ms: float = 3.0
    draft_prefill_share: float = 0.06
    # GPU work a speculating server adds around each plain step (the batch rewritten into a
    # one-token decode batch, the step's tokens and hidden states stashed for the catch-up).
    plain_mode_extra_ms: float = 0.0
    catchup_fixed_ms: float = 1.5
    catchup_per_token_ms: float = 0.0008
    catchup_compile_ms: float = 0.0
    noise: float = 0.03
    # What the start-up replay of a step's CUDA graph times (the policy's prior): this share of
    # the step, the rest host work; or, where set, a flat replay of the speculative step.
    replay_share: float = 0.9
    spec_replay_ms: Optional[float] = None

    def replay_ms(self, speculative: bool, b: int) -> float:
        if speculative and self.spec_replay_ms is not None:
            return self.spec_replay_ms
        step = self.spec_ms(b, 0) if speculative else self.plain_ms(b, 0)
        return self.replay_share * step

    def plain_ms(self, b: int, kv: float) -> float:
        return self.plain_fixed_ms + self.plain_per_request_ms * b + kv * self.target_kv_bytes / self.bandwidth_gbps / 1e6

    def spec_ms(self, b: int, kv: float) -> float:
        kv_bytes = self.target_kv_bytes + (self.draft_steps + 1) * self.draft_kv_bytes
        return self.spec_fixed_ms + self.spec_per_request_ms * b + kv * kv_bytes / self.bandwidth_gbps / 1e6

    def prefill_ms(self, tokens: int, speculative: bool) -> float:
        ms = self.prefill_fixed_ms + tokens * 2 * self.params / (self.achieved_tflops * 1e9)
        return ms * (1 + self.draft_prefill_share) if speculative else ms

    def catchup_ms(self, tokens: int) -> float:
        return self.catchup_fixed_ms + self.catchup_per_token_ms * tokens if tokens > 0 else 0.0


# The same server on triton attention, fitted to timed steps of the committed Poisson trace: a
# speculative step is its graph's replay (5.6 ms) plus 2.4 ms and 0.31 ms per request of host
# work (tree building and verify per request) the replay leaves out.
COSTS = {"fa3": GpuCosts(),
         "triton": GpuCosts(plain_fixed_ms=5.2, plain_per_request_ms=0.016, spec_fixed_ms=8.0,
                            spec_per_request_ms=0.31, spec_replay_ms=5.6),
         # One H100 80GB HBM3 (fa3, sglang's defaults), fitted to the timed steps of the two
         # 2026-12-05 runs (benchmark/results/2026-12-05-h100-dummy8b-three-servers-mixture-prior:
         # 1,238 plain, 17,663 speculative), the KV read at its bytes over the H100's 3.35 TB/s.
         "h100-fa3": GpuCosts(plain_fixed_ms=6.64, plain_per_request_ms=0.011, spec_fixed_ms=7.82,
                              spec_per_request_ms=0.048, bandwidth_gbps=3350.0),
         # One H100 on triton attention: the server's own fit after its 10 req/s run
         # (benchmark/results/2026-12-06-h100-dummy8b-triton-traffic-flashinfer-table-all-three,
         # speculative_cost / plain_cost in tri/results.json.xz: 12.9 / 16.7 / 23.3 / 31.4 ms at
         # 8 / 16 / 32 / 48 requests, plain 6.6-6.9); the replay at bucket 1 less its host terms; the prefill
         # rate set so that plain serves the 40 req/s overload near the 18.1 req/s it served there;
         # the work around a plain step as its GPU trace at 40 requests showed (45 us: 27 of
         # kernels, 18 of GPU idle; benchmark/results/2026-12-06-h100-dummy8b-triton-plain-mode-cost).
         "h100-triton": GpuCosts(plain_fixed_ms=6.5, plain_per_request_ms=0.008, spec_fixed_ms=9.2,
                                 spec_per_request_ms=0.46, spec_replay_ms=7.3, bandwidth_gbps=3350.0,
                                 achieved_tflops=470.0, plain_mode_extra_ms=0.045)}
# The same with a verify's attention through sglang's split-KV kernel (SGLANG_DYNAMIC_EAGLE_SPLITKV_VERIFY,
# the default for chains on triton): the speculative step as the server fitted it after its
# overload run (benchmark/results/2026-12-07-h100-dummy8b-triton-splitkv-verify-in-server,
# acc3.0/results.json, speculative_cost: 7.35 ms + 0.14 ms a request at context 0 over the buckets
# it measured, 1-104), against the prefill kernel's 9.2 + 0.46.
COSTS["h100-triton-splitkv"] = replace(COSTS["h100-triton"], spec_fixed_ms=7.35, spec_per_request_ms=0.14)


@dataclass(frozen=True)
class ServerShape:
    kv_capacity_tokens: int = 120_000
    max_running: int = 2048
    chunk_tokens: int = 8192
    new_token_ratio: float = 0.3  # share of a running request's remaining output kept free
    catchup_window: int = 256
    catchup_max_tokens: int = 8192
    # How a verify's accepted drafts are drawn: "chain" (each draft accepted with a fixed
    # probability until one is not, as from a draft model) or "simulated" (as the GPU benchmark's
    # simulated acceptance: the floor or ceiling of the mean, one draw per verify for the whole
    # batch as sglang's SGLANG_SIMULATE_ACC_LEN, one per request with the test plugin's mixtures).
    acceptance_draws: str = "chain"
    # sglang's overlap loop (its default) chooses the next item while the GPU runs the current
    # one: an arrival is seen only when the item after the running one is chosen, so it waits out
    # the running item and then the one already chosen (False: --disable-overlap-schedule).
    overlap: bool = True
    # EAGLE3_DYNAMIC sends a prefill's first token before the draft's extend (the server's
    # engine.early_first_token, overlap loop only): the draft's share delays the next item, not
    # the first token (False: sglang's order, as EAGLE3 and the runs before 2026-12-06).
    early_first_token: bool = True


@dataclass
class Request:
    arrival_ms: float
    input_len: int
    output_len: int
    acceptance: float  # mean tokens per verify (bonus included)
    emitted: int = 0
    first_ms: Optional[float] = None
    done_ms: Optional[float] = None
    verifies: int = 0
    accepted: int = 0  # tokens of its verifies (bonus included)
    prefix: Optional[Tuple[int, int]] = None  # (segment, group) of a shared system prompt
    prefix_len: int = 0  # its system prompt's tokens (the first of input_len)
    cached: int = 0  # prompt tokens found in the prefix cache at its prefill


def _mixture(text: str) -> Tuple[np.ndarray, np.ndarray]:
    """``MEAN[:SHARE],...`` (the acceptance test plugin's syntax) as (means, probabilities)."""
    pairs = [part.split(":") for part in text.split(",")]
    means = np.array([float(p[0]) for p in pairs])
    shares = np.array([float(p[1]) if len(p) > 1 else 1.0 for p in pairs])
    return means, shares / shares.sum()


class Client:
    """What ``sglang.bench_serving`` sends for one workload (``benchmark/sweeplib/workloads.py``):
    its segments one after another, each after the previous one's last answer and its idle gap;
    Poisson arrivals at a finite rate, all at once at an infinite one, or a closed loop of
    ``concurrency`` requests. Lengths uniform in [range_ratio x max, max], as bench_serving's
    random dataset; each request's acceptance drawn from ``acceptance`` (a mixture). A segment
    with ``groups`` (``shared-R``) is bench_serving's generated-shared-prefix dataset: each group
    one system prompt (its length drawn once), as many requests per group, in random order, each
    its group's system prompt and then a question of ``input_len``. The ``warmup`` segments go
    first, unrecorded, as the benchmark warms every server up once."""

    def __init__(self, segments, acceptance: str, seed: int, warmup=()) -> None:
        self.rng = np.random.default_rng(seed)
        self.unrecorded = sum(s.prompts for s in warmup)
        segments = tuple(warmup) + tuple(segments)
        self.segments = [s for s in segments if s.prompts] + [None]
        self.idle_ms = [s.idle_s * 1000.0 for s in segments if s.prompts]
        self.means, self.shares = _mixture(acceptance)
        self.requests: List[Request] = []
        self.queue: deque = deque()  # (arrival_ms, request) not yet sent
        self.open = 0  # requests of the current segment not yet answered
        self.index = -1
        self.prefix_lens: Dict[Tuple[int, int], int] = {}

    def _request(self, segment, arrival_ms: float) -> Request:
        def length(top: int) -> int:
            return int(self.rng.integers(max(1, int(top * segment.range_ratio)), top + 1))
        acceptance = float(self.rng.choice(self.means, p=self.shares))
        request = Request(arrival_ms, length(segment.input_len), length(segment.output_len), acceptance)
        if segment.groups:
            request.prefix = (self.index, self.groups.pop())
            if request.prefix not in self.prefix_lens:
                self.prefix_lens[request.prefix] = length(segment.prefix_len)
            request.prefix_len = self.prefix_lens[request.prefix]
            request.input_len += request.prefix_len
        self.requests.append(request)
        return request

    def _start(self, now: float) -> None:
        self.index += 1
        segment = self.segments[self.index]
        if segment is None:
            return
        self.segment, self.left, self.open = segment, segment.prompts, segment.prompts
        if segment.groups:
            self.groups = list(self.rng.permutation(np.repeat(np.arange(segment.groups),
                                                              segment.prompts // segment.groups)))
        if segment.concurrency:
            for _ in range(min(segment.concurrency, segment.prompts)):
                self.queue.append(self._request(segment, now))
            self.left -= len(self.queue)
        else:
            gaps = (self.rng.exponential(1000.0 / segment.rate, segment.prompts)
                    if math.isfinite(segment.rate) else np.zeros(segment.prompts))
            for t in now + np.cumsum(gaps):
                self.queue.append(self._request(segment, float(t)))
            self.left = 0

    def arrivals(self, now: float) -> List[Request]:
        if self.index < 0:
            self._start(now)
        out = []
        while self.queue and self.queue[0].arrival_ms <= now:
            out.append(self.queue.popleft())
        return out

    def next_arrival(self) -> Optional[float]:
        return self.queue[0].arrival_ms if self.queue else None

    def finished(self, now: float) -> None:
        """One request of the current segment answered at ``now``."""
        self.open -= 1
        if self.segment.concurrency and self.left > 0:
            self.queue.append(self._request(self.segment, now))
            self.left -= 1
        if self.open == 0:
            self._start(now + self.idle_ms[self.index])

    @property
    def recorded(self) -> List[Request]:
        return self.requests[self.unrecorded:]

    @property
    def done(self) -> bool:
        return self.segments[self.index] is None if self.index >= 0 else False


def _draft_probability(mean: float, steps: int) -> float:
    """p with 1 + p + ... + p^steps = mean (a chain accepts drafts in order)."""
    low, high = 0.0, 1.0
    for _ in range(50):
        p = (low + high) / 2
        low, high = (p, high) if sum(p ** i for i in range(steps + 1)) < mean else (low, p)
    return (low + high) / 2


@dataclass
class Served:
    requests: List[Request]
    speculative_steps: int = 0
    decode_steps: int = 0
    switches: int = 0

    def metrics(self) -> Dict[str, float]:
        done = [r for r in self.requests if r.done_ms is not None]
        ttft = [r.first_ms - r.arrival_ms for r in done]
        e2e = [r.done_ms - r.arrival_ms for r in done]
        tpot = [(r.done_ms - r.first_ms) / (r.output_len - 1) for r in done if r.output_len > 1]
        span = max(r.done_ms for r in done) - min(r.arrival_ms for r in done)
        return {"tok_s": 1000.0 * sum(r.output_len for r in done) / span,
                **{f"{name}_p{q}": float(np.percentile(values, q)) for name, values in
                   (("ttft", ttft), ("tpot", tpot or [0.0]), ("e2e", e2e)) for q in (50, 99)},
                "spec_share": self.speculative_steps / max(1, self.decode_steps),
                "switches": self.switches}


def serve(client: Client, decide: Callable[[StepObservation], DecodeMode], costs: GpuCosts,
          shape: ServerShape, speculative_server: bool, seed: int = 0, policy=None) -> Served:
    """Serve ``client``'s requests; ``decide`` picks each decode step's mode; ``policy`` (if
    given) is fed back step times, verifies and catch-ups as the worker feeds it."""
    rng = np.random.default_rng(seed)
    out = Served(client.requests)
    waiting: deque = deque()
    running: List[Request] = []
    chains: Dict[float, float] = {}
    prefixes: Dict[Tuple[int, int], int] = {}  # system prompts in the prefix cache: their tokens
    now, plain_run, previous = 0.0, 0, None
    chosen_at = 0.0  # when the item that runs next was chosen (overlap: as the one before began)
    timings: deque = deque()
    compiled: set = set()  # catch-up shapes compiled so far (token count a multiple of 16 or not)

    def jitter(ms: float) -> float:
        return ms * float(np.exp(rng.normal(0.0, costs.noise)))

    def finish(batch: List[Request]) -> List[Request]:
        kept = []
        for r in batch:
            if r.emitted >= r.output_len:
                r.done_ms = now
                client.finished(now)
            else:
                kept.append(r)
        return kept

    while True:
        waiting.extend(client.arrivals(chosen_at if shape.overlap else now))
        if not waiting and not running:
            if client.done and client.next_arrival() is None:
                break
            now = max(now, client.next_arrival())  # idle: the loop sees the arrival at once
            chosen_at = now
            continue
        chosen_at = now  # this item starts now, and the next one is chosen now
        # KV pool: each request's own tokens, and once each system prompt a running request uses
        # (a cached one that none uses is evictable: free for admission, still a prefix hit).
        held = {r.prefix: r.prefix_len for r in running if r.prefix is not None}
        kv_used = sum(r.input_len - r.prefix_len + r.emitted for r in running) + sum(held.values())
        reserve = sum(shape.new_token_ratio * (r.output_len - r.emitted) for r in running)
        batch, tokens, stored = [], 0, 0
        while waiting and len(running) + len(batch) < shape.max_running:
            r = waiting[0]
            r.cached = r.prefix_len if r.prefix in prefixes else 0  # a prefix hit is not prefilled again
            charged = r.prefix is None or r.prefix in held or any(q.prefix == r.prefix for q in batch)
            own = r.input_len - (r.prefix_len if charged else 0)
            if batch and tokens + r.input_len - r.cached > shape.chunk_tokens:
                break
            if kv_used + reserve + stored + own + shape.new_token_ratio * r.output_len > shape.kv_capacity_tokens:
                break
            batch.append(waiting.popleft())
            tokens += r.input_len - r.cached
            stored += own
            reserve += shape.new_token_ratio * r.output_len
        if batch:
            prefill = jitter(costs.prefill_ms(tokens, speculative_server))
            early = speculative_server and shape.early_first_token and shape.overlap
            first = now + (prefill / (1 + costs.draft_prefill_share) if early else prefill)
            now += prefill
            for r in batch:
                r.first_ms, r.emitted = first, 1
                if r.prefix is not None:
                    prefixes[r.prefix] = r.prefix_len
            running += finish(batch)
            continue
        b, kv = len(running), sum(r.input_len + r.emitted for r in running)
        obs = StepObservation(batch_size=b, kv_tokens=kv, queued=len(waiting),
                              verifies=[r.verifies for r in running],
                              accepted=[r.accepted for r in running],
                              remaining=[r.output_len - r.emitted for r in running],
                              step=out.decode_steps + 1)
        mode = decide(obs)
        out.decode_steps += 1
        out.switches += int(previous is not None and mode is not previous)
        previous = mode
        if mode is SPEC:
            catchup = min(b * min(plain_run, shape.catchup_window), shape.catchup_max_tokens)
            if catchup:
                ms = jitter(costs.catchup_ms(catchup))
                shape_class = catchup % 16 == 0
                if shape_class not in compiled:  # a shape not seen before compiles
                    compiled.add(shape_class)
                    ms += costs.catchup_compile_ms
                now += ms
                if hasattr(policy, "add_catchup"):
                    policy.add_catchup(catchup, ms)
            plain_run = 0
            step_ms = jitter(costs.spec_ms(b, kv))
            drafts, before = [], []
            shared = (shape.acceptance_draws == "simulated"
                      and len({r.acceptance for r in running}) == 1 and rng.random())
            for r in running:
                if shape.acceptance_draws == "simulated":
                    mean = min(float(costs.draft_steps + 1), r.acceptance)
                    k = int(mean) - 1 + int((shared if shared is not False else rng.random())
                                            < mean - int(mean))
                else:
                    if r.acceptance not in chains:
                        chains[r.acceptance] = _draft_probability(r.acceptance, costs.draft_steps)
                    k = 0
                    while k < costs.draft_steps and rng.random() < chains[r.acceptance]:
                        k += 1
                drafts.append(k)
                before.append(r.verifies)
                r.verifies += 1
                r.accepted += k + 1
                r.emitted = min(r.output_len, r.emitted + k + 1)
            if hasattr(policy, "add_verify"):
                policy.add_verify(drafts, before)
            out.speculative_steps += 1
        else:
            plain_run += 1
            step_ms = jitter(costs.plain_ms(b, kv) + (costs.plain_mode_extra_ms if speculative_server else 0.0))
            for r in running:
                r.emitted += 1
        now += step_ms
        timings.append((obs.step, mode, b, kv, step_ms))
        while hasattr(policy, "add_step_time") and timings and timings[0][0] <= obs.step - FEEDBACK_LAG_STEPS:
            policy.add_step_time(*timings.popleft())
        running = finish(running)
    out.requests = client.recorded
    return out


def dynamic_policy(costs: GpuCosts, shape: ServerShape, replay_scale: float = 1.0):
    """The automatic policy as such a server builds it: its graphs timed at start-up
    (``GpuCosts.replay_ms``, read at ``replay_scale`` times), KV priors from bytes and bandwidth."""
    per_kv_token_bytes = {PLAIN: costs.target_kv_bytes,
                          SPEC: costs.target_kv_bytes + (costs.draft_steps + 1) * costs.draft_kv_bytes}
    graphs = {PLAIN: PLAIN_GRAPHS, SPEC: SPEC_GRAPHS}
    return throughput_policy_for({
        "buckets": {m.value: graphs[m] for m in graphs},
        "calibration": {m.value: {b: replay_scale * costs.replay_ms(m is SPEC, b) for b in graphs[m]}
                        for m in graphs},
        "per_kv_token_ms": {m.value: per_kv_token_bytes[m] / costs.bandwidth_gbps / 1e6 for m in graphs},
        "max_speculative_batch": SPEC_GRAPHS[-1], "max_running_requests": shape.max_running,
        "kv_capacity_tokens": shape.kv_capacity_tokens, "catchup_window": shape.catchup_window,
        "catchup_max_tokens": shape.catchup_max_tokens,
        "catchup_prior_fixed_ms": costs.spec_ms(1, 0), "max_acceptance": costs.draft_steps + 1.0})


def held_plain(costs: GpuCosts, shape: ServerShape) -> SimpleNamespace:
    """EAGLE3_DYNAMIC held in plain mode (as fixed thresholds of 1 and 0 hold it): what plain mode
    costs on its own, the draft's prefill and the work around each plain step."""
    return SimpleNamespace(decide=lambda obs: PLAIN)


EAGLE3_MAX_RUNNING = 48  # sglang's cap on running requests for EAGLE-3 without a flag
CONFIGS = ("plain", "eagle3", "dynamic")


def run(workload, costs: GpuCosts, acceptance: str = "3.0", shape: ServerShape = ServerShape(),
        seed: int = 0, configs: Sequence[str] = CONFIGS, policy_factory=dynamic_policy,
        warmup=()) -> Dict[str, Dict[str, float]]:
    """Each configuration's metrics on the same requests (one seed): plain decoding, EAGLE-3
    (always speculating, 48 running at most), EAGLE3_DYNAMIC (``policy_factory``'s policy).
    ``workload``: a ``sweeplib.workloads.Workload`` (its own acceptance wins); ``warmup``:
    segments served first and not recorded (none: a fresh server meets the workload)."""
    results, ttfts = {}, {}
    for name in configs:
        client = Client(workload.segments, workload.acceptance or acceptance, seed, warmup)
        if name == "plain":
            served = serve(client, lambda obs: PLAIN, costs, shape, False, seed)
        elif name == "eagle3":
            served = serve(client, lambda obs: SPEC, costs, replace(
                shape, max_running=EAGLE3_MAX_RUNNING, early_first_token=False), True, seed)
        else:
            policy = policy_factory(costs, shape)
            served = serve(client, policy.decide, costs, shape, True, seed, policy=policy)
        results[name] = served.metrics()
        ttfts[name] = [r.first_ms - r.arrival_ms if r.done_ms is not None else None
                       for r in served.requests]
    if "plain" in ttfts and "dynamic" in ttfts:  # the same requests, in the same order
        slower, faster = count_2x(ttfts["plain"], ttfts["dynamic"])
        results["dynamic"].update(ttft_2x_slower=float(slower), ttft_2x_faster=float(faster))
    return results


def count_2x(plain: Sequence[Optional[float]], dynamic: Sequence[Optional[float]]) -> Tuple[int, int]:
    """Requests (paired by position; unanswered ones, None, left out) whose first token took
    EAGLE3_DYNAMIC twice plain's time or more, and plain twice EAGLE3_DYNAMIC's."""
    return tuple(sum(map(len, slow_clusters(a, b, 2.0))) for a, b in ((plain, dynamic), (dynamic, plain)))


def mean_of(runs: Sequence[Dict[str, Dict[str, float]]]) -> Dict[str, Dict[str, float]]:
    """Each configuration's metrics, the mean over runs (seeds)."""
    return {name: {key: float(np.mean([r[name][key] for r in runs])) for key in runs[0][name]}
            for name in runs[0]}


def run_seeds(workload, costs: GpuCosts, acceptance: str = "3.0", seeds: int = 1,
              **kwargs) -> Dict[str, Dict[str, float]]:
    """:func:`run` with seeds 0 .. ``seeds`` - 1, each metric the mean over them."""
    return mean_of([run(workload, costs, acceptance, seed=seed, **kwargs) for seed in range(seeds)])


def seed_line(seed: int, m: Dict[str, Dict[str, float]]) -> str:
    """One seed's first tokens, EAGLE3_DYNAMIC against plain on the same requests (each seed its
    own draw of the workload): how far a p99 moves from one run of a workload to the next."""
    p, d = m["plain"], m["dynamic"]
    return (f"  seed {seed}: TTFT p50 / p99 dyn / plain {d['ttft_p50'] / p['ttft_p50']:.3f} / "
            f"{d['ttft_p99'] / p['ttft_p99']:.3f}; requests at 2x the other's TTFT or more: "
            f"dynamic {d['ttft_2x_slower']:.0f}, plain {d['ttft_2x_faster']:.0f}")


def row(name: str, m: Dict[str, Dict[str, float]]) -> str:
    """One line of the table: EAGLE3_DYNAMIC's ratios to plain and to the better of the two."""
    p, e, d = m["plain"], m["eagle3"], m["dynamic"]
    best = max(p["tok_s"], e["tok_s"])

    def low(key: str) -> float:
        return d[key] / min(p[key], e[key])
    return (f"| {name} | {p['tok_s']:.0f} / {e['tok_s']:.0f} / {d['tok_s']:.0f} | "
            f"{d['tok_s'] / p['tok_s']:.3f} | {d['tok_s'] / best:.3f} | "
            f"{d['ttft_p50'] / p['ttft_p50']:.2f} / {d['ttft_p99'] / p['ttft_p99']:.2f} | "
            f"{low('e2e_p50'):.3f} / {low('e2e_p99'):.3f} | {d['spec_share']:.2f} | {d['switches']:.0f} |")


HEADER = ("| workload | output tok/s plain / EAGLE3 / dynamic | dyn / plain | dyn / best | "
          "TTFT p50 / p99 dyn / plain | E2E p50 / p99 dyn / best | speculative steps | switches |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")


def random_cases(n: int, seed: int) -> List[Tuple[str, str, str]]:
    """``n`` (workload, costs, acceptance) drawn at random: Poisson 1-50 req/s, Poisson 1-60 req/s
    behind shared system prompts, closed loops of 1-192, bursts of 16-200; acceptance 1.2-3.8,
    or two classes half and half."""
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(n):
        kind = rng.choice(["poisson", "poisson", "poisson", "shared", "closed", "burst"])
        name = (f"poisson-{rng.uniform(1, 50):.1f}@6" if kind == "poisson" else
                f"shared-{rng.uniform(1, 60):.1f}@6" if kind == "shared" else
                f"closed-{rng.choice([1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192])}"
                if kind == "closed" else f"burst-{rng.choice([16, 64, 128, 200])}")
        if rng.random() < 0.3:
            low, high = sorted(rng.uniform(1.1, 4.0, 2))
            acceptance = f"{low:.2f}:0.5,{high:.2f}:0.5"
        else:
            acceptance = f"{rng.uniform(1.2, 3.8):.2f}"
        cases.append((name, str(rng.choice(["fa3", "triton"])), acceptance))  # the H200 shapes
    return cases


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="poisson-40@8,poisson-10@12,load-step,poisson-1.5@20,"
                        "long-8,poisson-8@12~1.3:0.5/4.0:0.5,closed-32~1.6,poisson-6@12,closed-128~1.6",
                        help="the benchmark's workload names (benchmark/README.md)")
    parser.add_argument("--acceptance", default="3.0", help="MEAN[:SHARE],... where a workload names none")
    parser.add_argument("--costs", choices=sorted(COSTS), default="fa3")
    parser.add_argument("--draft-prefill-share", type=float, default=None,
                        help="the draft's prefill over the target's (default: the costs' own)")
    parser.add_argument("--late-first-token", action="store_true",
                        help="EAGLE3_DYNAMIC's first token after the draft's extend, as sglang orders it "
                        "(SGLANG_DYNAMIC_EAGLE_EARLY_FIRST_TOKEN=0, and the runs before 2026-12-06)")
    parser.add_argument("--disable-overlap-schedule", action="store_true",
                        help="model sglang's loop without overlap (each item chosen when the previous one ends)")
    parser.add_argument("--draws", choices=("chain", "simulated"), default="chain",
                        help="accepted drafts per verify: a draft chain, or as the GPU benchmark's "
                        "simulated acceptance (for comparing with its runs)")
    parser.add_argument("--warmup", default="warmup",
                        help="a workload every server serves first, unrecorded, as the benchmark's "
                        "--warmup (default: its default), or none: a fresh server")
    parser.add_argument("--seeds", type=int, default=1,
                        help="seeds 0 .. N-1 per row (the same for every row), each metric their mean")
    parser.add_argument("--random", type=int, default=0, metavar="N",
                        help="instead of --workloads: N random workloads, costs and acceptance levels "
                        "(random_cases), then how many rows fall below 0.97x the better throughput "
                        "or above 1.05x the better median E2E")
    parser.add_argument("--random-seed", type=int, default=0)
    parser.add_argument("--max-total-tokens", type=int, default=ServerShape.kv_capacity_tokens,
                        help="the KV pool in tokens, as the GPU run's --max-total-tokens")
    parser.add_argument("--held-plain", action="store_true",
                        help="EAGLE3_DYNAMIC held in plain mode instead of its policy (plain mode's own cost)")
    parser.add_argument("--catchup-compile-ms", type=float, default=0.0,
                        help="what a catch-up at a shape not seen before adds (compiling; ~25 on an H100)")
    parser.add_argument("--per-seed", action="store_true",
                        help="after each row, each seed's TTFT ratios and the requests 2x slower either way")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
    from sweeplib.workloads import parse_workloads

    def costs_of(name: str) -> GpuCosts:
        share = args.draft_prefill_share
        costs = COSTS[name] if share is None else replace(COSTS[name], draft_prefill_share=share)
        return replace(costs, catchup_compile_ms=args.catchup_compile_ms)

    warmup = () if args.warmup == "none" else tuple(
        replace(segment, idle_s=3.0) for w in parse_workloads([args.warmup]) for segment in w.segments)
    if args.random:
        cases = random_cases(args.random, args.random_seed)
    else:
        cases = [(w, args.costs, args.acceptance.replace("/", ","))
                 for w in parse_workloads([args.workloads])]
    print(f"Modelled (tools/serving_model.py, not measured): costs {costs_of(args.costs)}"
          f"{' (the costs named per row)' if args.random else ''}, acceptance {args.acceptance} "
          "unless named\n")
    print(HEADER)
    worse = [0, 0]
    for workload, costs_name, acceptance in cases:
        if isinstance(workload, str):
            workload = parse_workloads([workload])[0]
        options = dict(shape=ServerShape(kv_capacity_tokens=args.max_total_tokens, acceptance_draws=args.draws,
                                         overlap=not args.disable_overlap_schedule,
                                         early_first_token=not args.late_first_token),
                       warmup=warmup, policy_factory=held_plain if args.held_plain else dynamic_policy)
        label = workload.name + (f" ~{acceptance} {costs_name}" if args.random else "")
        runs = [run(workload, costs_of(costs_name), acceptance, seed=seed, **options)
                for seed in range(args.seeds)]
        m = mean_of(runs)
        seeds = [seed_line(seed, r) for seed, r in enumerate(runs)] if args.per_seed else []
        print("\n".join([row(label, m), *seeds]), flush=True)
        p, e, d = m["plain"], m["eagle3"], m["dynamic"]
        worse[0] += d["tok_s"] < 0.97 * max(p["tok_s"], e["tok_s"])
        worse[1] += d["e2e_p50"] > 1.05 * min(p["e2e_p50"], e["e2e_p50"])
    if args.random:
        print(f"\n{args.random} rows: throughput below 0.97x the better in {worse[0]}, "
              f"median E2E above 1.05x the better in {worse[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
