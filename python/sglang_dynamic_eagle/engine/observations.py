"""What the worker tells the policy: before a decode step, the batch's KV tokens, the queue
behind it and the acceptance record of its requests (:func:`observe`); after it, the verify
results, the step times and the catch-up costs the automatic policy learns from
(:class:`PolicyFeed`). Host-side reads of the scheduler's own objects; no GPU work.

sglang counts every decode result as a verify of each request (``Req.spec_verify_ct``), plain
steps included, so the per-request record is kept here, from speculative results only: each
speculative step's requests are queued at launch and matched with their verify result, which
the scheduler processes in launch order (``counters.ModeCounters`` attributes results the same
way). A record goes with its request object (a weak reference's callback).
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple

from sglang_dynamic_eagle.observability.decision_log import DecisionLog
from sglang_dynamic_eagle.policy import DecodeMode, DecodePolicy, StepObservation
from sglang_dynamic_eagle.policy.throughput import ThroughputPolicy


_NO_LIMIT = 1 << 30


class RequestAcceptance:
    """Per-request (verifies, tokens yielded incl. bonus) of speculative steps.

    Read and written for every request at every step on the scheduler's thread, so records are
    keyed by the request object's id (a ``WeakKeyDictionary`` builds a weak reference per
    lookup); each holds a weak reference whose callback drops the record when sglang lets the
    request go, and a lookup checks that reference, so an id reused later never reads it."""

    def __init__(self) -> None:
        self._record: Dict[int, list] = {}  # id(req) -> [verifies, tokens, weakref.ref(req)]
        self._launched: Deque[List] = deque()
        self.mismatched = 0

    def __len__(self) -> int:
        return len(self._record)

    def launched(self, reqs: Sequence) -> None:
        """A speculative step over ``reqs`` was launched."""
        self._launched.append(list(reqs))

    def verified(self, correct_drafts_per_req: Sequence[int]) -> Optional[List[int]]:
        """The oldest launched speculative step's verify result; returns each request's
        verifies before it (None where the result matched no launch)."""
        if not self._launched:
            self.mismatched += 1
            return None
        reqs = self._launched.popleft()
        if len(reqs) != len(correct_drafts_per_req):
            self.mismatched += 1
            return None
        record = self._record
        before = []
        for req, drafts in zip(reqs, correct_drafts_per_req):
            entry = record.get(id(req))
            if entry is None or entry[2]() is not req:
                entry = record[id(req)] = [0, 0, weakref.ref(req, _dropper(record, id(req)))]
            before.append(entry[0])
            entry[0] += 1
            entry[1] += drafts + 1
        return before

    def of(self, reqs: Sequence) -> Tuple[List[int], List[int]]:
        get = self._record.get
        verifies, tokens = [], []
        for req in reqs:
            entry = get(id(req))
            if entry is None or entry[2]() is not req:
                verifies.append(0)
                tokens.append(0)
            else:
                verifies.append(entry[0])
                tokens.append(entry[1])
        return verifies, tokens


def _dropper(record: Dict[int, list], key: int) -> Callable:
    """The weak reference's callback: drop the record it belongs to (not a newer one under a
    reused id)."""

    def drop(ref) -> None:
        entry = record.get(key)
        if entry is not None and entry[2] is ref:
            del record[key]

    return drop


def observe(batch, queued: int, acceptance: RequestAcceptance, step: int,
            per_request_up_to: int = 1 << 30) -> StepObservation:
    """The policy's view of a decode ``batch`` (``kv_committed_len`` lags the device by at most
    one verify: a few tokens per request). The per-request records are read only for a batch of
    at most ``per_request_up_to`` requests: above the speculative graphs (and for the threshold
    policy, which reads none) the step is plain whatever they say."""
    reqs = batch.reqs
    kv_tokens = sum([req.kv_committed_len for req in reqs])
    if len(reqs) > per_request_up_to:
        return StepObservation(batch_size=len(reqs), kv_tokens=kv_tokens, queued=queued,
                               step=step)
    verifies, accepted = acceptance.of(reqs)
    return StepObservation(
        batch_size=len(reqs),
        kv_tokens=kv_tokens,
        queued=queued,
        verifies=verifies,
        accepted=accepted,
        # Tokens each request may still emit, at least 1 (a large number when it sets no limit);
        # no max() call per request: this runs over every request at every decode step.
        remaining=[_NO_LIMIT if (limit := req.sampling_params.max_new_tokens) is None
                   else (left if (left := limit - len(req.output_ids)) > 1 else 1) for req in reqs],
        step=step,
    )


class PolicyFeed:
    """The measurements the policy learns from, handed over as they complete (the decode step
    a verify result or a step time belongs to comes along), and the automatic policy's decisions
    beside their measured times (``observability.decision_log``). The threshold policy decides
    from the batch size alone and learns from none of them."""

    def __init__(self, policy: DecodePolicy) -> None:
        self._learner = policy if isinstance(policy, ThroughputPolicy) else None
        self.decisions = DecisionLog()
        # Largest batch whose per-request records the policy can use (observe's limit).
        self.per_request_up_to = 0 if self._learner is None else policy.max_speculative_batch

    def verified(self, step: int, correct_drafts_per_req: Sequence[int],
                 prior_verifies: Optional[Sequence[int]] = None) -> None:
        if self._learner is not None:
            self._learner.add_verify(correct_drafts_per_req, prior_verifies)

    def step_time(self, step: int, mode: DecodeMode, batch_size: int, kv_tokens: int,
                  ms: float) -> None:
        if self._learner is not None:
            self._learner.add_step_time(step, mode, batch_size, kv_tokens, ms)
            self.decisions.timed(step, mode, ms)

    def catchup(self, tokens: int, ms: float) -> None:
        if self._learner is not None:
            self._learner.add_catchup(tokens, ms)

    def draft_prefill(self, tokens: int, ms: float) -> None:
        """A prefill's draft extend (GPU ms, the same on every rank): bounds the catch-up's cost."""
        if self._learner is not None:
            self._learner.add_draft_prefill(tokens, ms)

    def step_end(self, step: int, dispatch_s: float, step_s: float) -> None:
        """Decode step ``step`` was launched: its decision is logged (its time comes back some
        steps later). Its host seconds (the worker's own work, the mode's step call) are not a
        cost the policy models (the timed step holds them); a traced feed records them."""
        if self._learner is not None:
            self.decisions.decided(self._learner.latest)

    def crossover_batch(self) -> int:
        """Largest speculative bucket predicted to pay at the server-wide acceptance, at short
        contexts (0: none, and with the threshold policy)."""
        policy = self._learner
        if policy is None:
            return 0
        acceptance = policy.acceptance.server_mean or policy.acceptance.max_acceptance
        plain, spec = policy.costs[DecodeMode.PLAIN], policy.costs[DecodeMode.SPECULATIVE]
        return max((b for b in spec.buckets if (t_plain := plain.predict(b, 0.0))
                    and (t_spec := spec.predict(b, 0.0)) and acceptance * t_plain >= t_spec),
                   default=0)

    def report(self) -> Dict[str, object]:
        """The crossover and, with the automatic policy, its logged decisions (/server_info)."""
        return {"crossover_batch": self.crossover_batch(),
                **({} if self._learner is None else self.decisions.report())}
