"""Decode-step traces for replay (opt-in: ``SGLANG_DYNAMIC_EAGLE_TRACE=<file>``, ``config``).
Tensor-parallel rank 0 writes the file; a data-parallel replica beyond the first writes
``<file>.dp<rank>`` (``engine.startup.trace_file``).

One JSON object per line, appended as the server runs, joined by step in
``policy.replay.load_trace``:

* ``{"k": "config", ...}`` first: the automatic policy's configuration and priors (a server
  restarted on the same file appends another; a replay reads the last);
* ``{"k": "step", "step", "t", "mode", "b", "kv", "q"}`` when a decode step is decided; with
  the automatic policy also ``"why"`` (its reason: stay, predicted gain, probe...) and ``"pp"``,
  ``"ps"``: the output tokens per second it predicted for plain and speculative decoding, from
  the acceptance of the requests in the batch, at the batch the load was heading for (``"pb"``,
  where a queue made it larger than ``"b"``; 0 where a mode's cost was unknown), ``"ys"``: the
  tokens it predicted a speculative step to yield there, and ``"pt"``: the milliseconds it
  predicted for the mode it chose (so a trace tells a misjudged acceptance from a misjudged
  step time);
* ``{"k": "time", "step", "ms"}`` when its measured time reaches the policy;
* ``{"k": "verify", "step", "tokens", "requests"}`` when a speculative step's verify result is
  processed (tokens include the bonus token);
* ``{"k": "catchup", "t", "tokens", "ms"}`` when a catch-up's GPU time reaches the policy
  (the slowest rank's, with the step times);
* ``{"k": "prefill", "t", "tokens", "target_ms", "draft_ms"}`` when a prefill batch's GPU time
  is read (at the next prefill or report): the target's extend and the draft's apart;
* ``{"k": "host", "step", "us", "step_us"}`` after a decode step: host microseconds of the
  worker's own work around it and of the mode's step (launches, a catch-up's included). The
  decision and the trace's own ``step`` line are in ``us`` only where the worker decided at its
  call; a decision at the scheduler's choice of the batch (``DynamicEagleWorker.batch_selected``,
  since 2026-12-06) and result processing, which the server's ``host_dispatch_ms`` also counts,
  are not.

:func:`traced` wraps the worker's policy and its feed (``engine.observations.PolicyFeed``) so
that both record what passes through them; without the variable it returns them unwrapped, and
nothing of the trace runs.
"""

from __future__ import annotations

import json
import time
from typing import Any, Optional, Sequence, Tuple

from sglang_dynamic_eagle.policy.acceptance import first_verifies
from sglang_dynamic_eagle.policy.throughput import ThroughputPolicy
from sglang_dynamic_eagle.policy.types import DecodeMode


_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # one encoder (json.dumps builds one a call)


class StepTrace:
    """The trace file, line-buffered: a killed server loses at most the line being written."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)

    def _write(self, record: dict) -> None:
        self._file.write(_ENCODE(record) + "\n")

    def step(self, observation, mode, decision=None) -> None:
        record = {"k": "step", "step": observation.step, "t": round(time.time(), 4),
                  "mode": mode.value, "b": observation.batch_size,
                  "kv": observation.kv_tokens, "q": observation.queued}
        if decision is not None:
            record.update(why=decision.reason, pp=round(decision.plain_tok_per_s),
                          ps=round(decision.spec_tok_per_s), ys=round(decision.spec_tokens, 1))
            if decision.predicted_ms:
                record["pt"] = round(decision.predicted_ms, 3)
            if decision.projected_batch != observation.batch_size:
                record["pb"] = decision.projected_batch
        self._write(record)

    def time(self, step: int, ms: float) -> None:
        self._write({"k": "time", "step": step, "ms": round(ms, 4)})

    def verify(self, step: int, correct_drafts_per_req: Sequence[int],
               prior_verifies: Optional[Sequence[int]] = None) -> None:
        row = {"k": "verify", "step": step,
               "tokens": sum(correct_drafts_per_req) + len(correct_drafts_per_req),
               "requests": len(correct_drafts_per_req)}
        if prior_verifies is not None:  # the requests the server means take (policy/acceptance.py)
            first = first_verifies(correct_drafts_per_req, prior_verifies)
            row["first_requests"], row["first_tokens"] = len(first), sum(first) + len(first)
        self._write(row)

    def catchup(self, tokens: int, ms: float) -> None:
        self._write({"k": "catchup", "t": round(time.time(), 4), "tokens": tokens,
                     "ms": round(ms, 4)})

    def prefill(self, tokens: int, target_ms: float, draft_ms: float) -> None:
        self._write({"k": "prefill", "t": round(time.time(), 4), "tokens": tokens,
                     "target_ms": round(target_ms, 4), "draft_ms": round(draft_ms, 4)})

    def host(self, step: int, dispatch_s: float, step_s: float) -> None:
        self._write({"k": "host", "step": step, "us": round(1e6 * dispatch_s, 1),
                     "step_us": round(1e6 * step_s, 1)})


class TracedPolicy:
    """A ``DecodePolicy`` whose every decision is traced."""

    def __init__(self, policy, trace: StepTrace) -> None:
        self.policy, self._trace = policy, trace

    mode = property(lambda self: self.policy.mode)
    max_speculative_batch = property(lambda self: self.policy.max_speculative_batch)

    def decide(self, observation):
        mode = self.policy.decide(observation)
        self._trace.step(observation, mode, getattr(self.policy, "latest", None))  # automatic's
        return mode

    def report(self) -> dict:
        return self.policy.report()


class TracedFeed:
    """A policy feed whose every measurement is traced as it is handed over."""

    def __init__(self, feed, trace: StepTrace) -> None:
        self.feed, self._trace = feed, trace
        self.per_request_up_to = feed.per_request_up_to

    def verified(self, step: int, correct_drafts_per_req: Sequence[int],
                 prior_verifies: Optional[Sequence[int]] = None) -> None:
        self.feed.verified(step, correct_drafts_per_req, prior_verifies)
        self._trace.verify(step, correct_drafts_per_req, prior_verifies)

    def step_time(self, step: int, mode, batch_size: int, kv_tokens: int, ms: float) -> None:
        self.feed.step_time(step, mode, batch_size, kv_tokens, ms)
        self._trace.time(step, ms)

    def catchup(self, tokens: int, ms: float) -> None:
        self.feed.catchup(tokens, ms)
        self._trace.catchup(tokens, ms)

    def step_end(self, step: int, dispatch_s: float, step_s: float) -> None:
        self.feed.step_end(step, dispatch_s, step_s)
        self._trace.host(step, dispatch_s, step_s)

    def draft_prefill(self, tokens: int, ms: float) -> None:
        self.feed.draft_prefill(tokens, ms)  # traced as the rank's own prefill line (below)

    def prefill(self, tokens: int, target_ms: float, draft_ms: float) -> None:
        """A prefill batch's GPU time (``PrefillTimer.sink``: traced only)."""
        self._trace.prefill(tokens, target_ms, draft_ms)

    def report(self) -> dict:
        return self.feed.report()


def traced(policy, feed, path: Optional[str]) -> Tuple[Any, Any]:
    """``(policy, feed)``, both recording to the trace at ``path``; unchanged without one."""
    if not path:
        return policy, feed
    trace = StepTrace(path)
    if isinstance(policy, ThroughputPolicy):
        trace._write({"k": "config", **policy_config(policy)})
    return TracedPolicy(policy, trace), TracedFeed(feed, trace)


def policy_config(policy: ThroughputPolicy) -> dict:
    """The automatic policy's configuration and priors: a trace's first line, from which
    ``policy.replay`` rebuilds it."""
    modes = (DecodeMode.PLAIN, DecodeMode.SPECULATIVE)
    return {
        "buckets": {m.value: list(policy.costs[m].buckets) for m in modes},
        "calibration": {m.value: {str(b): round(ms, 5) for b, ms in policy.costs[m].calibration.items()}
                        for m in modes},
        "per_kv_token_ms": {m.value: policy.costs[m].prior_per_kv_token_ms for m in modes},
        "catchup_prior_fixed_ms": policy.catchup.prior_fixed_ms,
        "max_acceptance": policy.acceptance.max_acceptance,
        **vars(policy.config),
    }
