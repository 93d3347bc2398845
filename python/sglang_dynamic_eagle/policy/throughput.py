"""The automatic policy: the mode that serves more output tokens per second, switched when the
predicted loss of staying has paid for the switch.

Each decode step (names as in ``step_model``):

1. **Where the load is going.** With ``q`` requests queued, the batch the scheduler is filling
   is ``b' = min(b + q, max_running, b * kv_capacity / K)`` (the last term: as many requests of
   the batch's mean length as the KV pool holds); its KV tokens scale with it (none queued:
   ``b' = b``). A burst that plain serves faster leaves speculation at its first step.
2. **Both modes' rates at b'.** ``r_plain = b' / t_plain(b', K')``,
   ``r_spec = A(b') / t_spec(b', K')``, A from the acceptance of the requests in the batch;
   each mode taken at most at its largest CUDA graph's batch (what its graphs were timed at;
   a speculative step holds no more), K' scaled alike.
3. **Hysteresis as expected loss (CUSUM).** Staying in mode m for one step costs
   ``loss = t_m - y_m / r_other`` milliseconds (the time the other mode would have needed for
   the same tokens). ``S = max(0, S + loss)``; the mode switches once S exceeds the switch's
   own cost: entering speculation pays the draft-KV catch-up of the tokens decoded plainly
   (``b * min(plain steps, window)`` tokens at the fitted catch-up cost); leaving it pays
   nothing now. A noise-free crossing therefore costs at most twice the best switch schedule's
   loss (the ski-rental bound), with no step counts to tune.
4. **Exploration from an explicit budget.** Every decode step adds ``exploration_share`` (1%) of its
   predicted time to a budget, which holds at most ``EXPLORATION_CAP_PROBES`` of the probes it pays
   for (near a tie a probe is predicted to lose little: dozens of them fit two at full step time). The other
   mode is measured for ``PROBE_STEPS`` steps when the budget covers the probe's predicted
   loss plus its catch-up, and the other mode could win at its best (speculation at full
   acceptance, a step at its graph-replay time): so a stale acceptance or an uncalibrated cost
   cannot keep the better mode off, and the loss predicted for probes never exceeds the share of
   decode time (a probe of a mode predicted nearly as good costs little and is taken often).
5. A batch (now, not projected) above the largest speculative CUDA graph decodes plainly.

Pure Python; deterministic in its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence

from sglang_dynamic_eagle.policy.acceptance import Acceptance
from sglang_dynamic_eagle.policy.step_model import CatchupCost, ModeCost
from sglang_dynamic_eagle.policy.types import DecodeMode, ReportValue, StepObservation, check_int_at_least

# At most this share of decode time goes to measuring the mode the policy would not pick.
EXPLORATION_SHARE = 0.01
# Steps of one probe: the step timer drops a run's first step, and a bucket's fit needs
# MIN_BUCKET_SAMPLES (4) timed steps; two more verifies firm up the acceptance.
PROBE_STEPS = 7
EXPLORATION_CAP_PROBES = 2.0  # the budget saves up for two probes at most, not a burst
_OTHER = {DecodeMode.PLAIN: DecodeMode.SPECULATIVE, DecodeMode.SPECULATIVE: DecodeMode.PLAIN}


@dataclass(frozen=True)
class ThroughputPolicyConfig:
    max_speculative_batch: int  # largest batch the speculative CUDA graphs cover
    max_running_requests: int  # the scheduler's cap on the running batch
    kv_capacity_tokens: int  # KV pool size in tokens
    catchup_window: int  # most plain-decoded positions a catch-up redoes per request
    catchup_max_tokens: int = 8192  # most positions one catch-up redoes over all requests
    exploration_share: float = EXPLORATION_SHARE  # of decode time, for probes (docstring, step 4)

    def __post_init__(self) -> None:
        for name in ("max_speculative_batch", "max_running_requests", "kv_capacity_tokens",
                     "catchup_window", "catchup_max_tokens"):
            check_int_at_least(name, getattr(self, name), 1)

    def catchup_tokens(self, batch_size: int, plain_run: int) -> int:
        """Positions a catch-up redoes after ``plain_run`` plain steps of ``batch_size``."""
        return min(batch_size * min(plain_run, self.catchup_window), self.catchup_max_tokens)


@dataclass(frozen=True)
class Decision:
    """One decided step and what the policy predicted (``observability.decision_log`` adds the
    measured time)."""

    step: int
    mode: DecodeMode
    batch: int
    projected_batch: int
    kv_tokens: int
    queued: int
    plain_tok_per_s: float
    spec_tok_per_s: float
    spec_tokens: float  # a speculative step's predicted tokens at the projected batch
    predicted_ms: Optional[float]
    reason: str

    def as_dict(self) -> Dict[str, object]:
        out = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in vars(self).items()}
        out["mode"] = self.mode.value
        return out


class ThroughputPolicy:
    """See the module docstring; a ``DecodePolicy``."""

    def __init__(
        self,
        config: ThroughputPolicyConfig,
        costs: Mapping[DecodeMode, ModeCost],
        catchup: CatchupCost,
        acceptance: Acceptance,
        initial_mode: DecodeMode = DecodeMode.SPECULATIVE,
    ) -> None:
        self.config = config
        self.costs = dict(costs)
        self.catchup = catchup
        self.acceptance = acceptance
        self._mode = DecodeMode(initial_mode)
        self._step = 0
        self._loss_ms = 0.0  # CUSUM of the predicted loss of staying in the current mode
        self._plain_run = 0  # plain steps since the last speculative one
        self._budget_ms = 0.0
        self._probe_left = 0
        self.probes = 0
        self.switches = 0
        self.reasons: Dict[str, int] = {}  # decisions by reason, for /server_info
        # Largest batch each mode's graphs were timed at (step 2 of the module docstring).
        self._largest = (self.costs[DecodeMode.PLAIN].buckets[-1], min(
            config.max_speculative_batch, self.costs[DecodeMode.SPECULATIVE].buckets[-1]))
        self.latest: Optional[Decision] = None  # the latest decision (logged, traced)

    @property
    def mode(self) -> DecodeMode:
        return self._mode

    @property
    def max_speculative_batch(self) -> int:
        return self.config.max_speculative_batch

    @property
    def step(self) -> int:
        """Decisions taken so far (the index of the latest)."""
        return self._step

    # -- what the worker feeds back ---------------------------------------

    def add_step_time(self, step: int, mode: DecodeMode, batch_size: int, kv_tokens: int,
                      ms: float) -> None:
        """The measured time of decided step ``step`` (identical on every rank)."""
        cost = self.costs[mode]
        bucket = cost.bucket_of(batch_size)
        if bucket is not None:
            cost.add(bucket, kv_tokens, ms, batch_size, step)

    def add_catchup(self, tokens: int, ms: float) -> None:
        self.catchup.add(tokens, ms)

    def add_draft_prefill(self, tokens: int, ms: float) -> None:
        self.catchup.add_draft_prefill(tokens, ms)

    def add_verify(self, drafts: Sequence[int], prior_verifies: Optional[Sequence[int]] = None) -> None:
        self.acceptance.add_verify(drafts, self._step, prior_verifies)

    # -- deciding ------------------------------------------------------------

    def projected_batch(self, obs: StepObservation) -> int:
        """The batch the running load is heading for (step 1 of the module docstring)."""
        b = obs.batch_size
        if obs.queued == 0 or b == 0:
            return b
        target = min(b + obs.queued, self.config.max_running_requests)
        if obs.kv_tokens > 0:
            target = min(target, max(b, int(b * self.config.kv_capacity_tokens / obs.kv_tokens)))
        return max(b, target)

    def _rates(self, obs: StepObservation, b: int, kv: float, optimistic: bool = False):
        """(plain, speculative) step ms and tokens at batch b, capped as in step 2; optimistic:
        each mode at its best (graph-replay time, full acceptance)."""
        plain_model, spec_model = self.costs[DecodeMode.PLAIN], self.costs[DecodeMode.SPECULATIVE]
        b_plain, b_spec = min(b, self._largest[0]), min(b, self._largest[1])
        kv_plain, kv_spec = (kv * x / b if b else kv for x in (b_plain, b_spec))
        if optimistic:
            t_plain, t_spec = plain_model.lower_bound(b_plain, kv_plain), spec_model.lower_bound(b_spec, kv_spec)
        else:
            t_plain, t_spec = plain_model.predict(b_plain, kv_plain), spec_model.predict(b_spec, kv_spec)
        y_spec = b_spec / obs.batch_size * self.acceptance.batch_tokens(
            obs.batch_size, obs.verifies, obs.accepted, obs.remaining, optimistic=optimistic
        ) if obs.batch_size else 0.0
        return t_plain, float(b_plain), t_spec, y_spec

    def decide(self, obs: StepObservation) -> DecodeMode:
        self._step += 1
        b = obs.batch_size
        projected = self.projected_batch(obs)
        kv = obs.kv_tokens * (projected / b if b else 1.0)
        t_plain, y_plain, t_spec, y_spec = self._rates(obs, projected, kv)
        known = t_plain is not None and t_spec is not None
        r_plain = y_plain / t_plain if t_plain else 0.0
        r_spec = y_spec / t_spec if t_spec else 0.0
        current = self._mode
        t_current = t_plain if current is DecodeMode.PLAIN else t_spec
        self._budget_ms += self.config.exploration_share * (t_current or 0.0)

        spec_bucket = self.costs[DecodeMode.SPECULATIVE].bucket_of(b)
        if b == 0 or b > self.config.max_speculative_batch or spec_bucket is None:
            mode, reason = DecodeMode.PLAIN, "above speculative graphs"
            self._probe_left = 0
        elif self._probe_left > 0:
            self._probe_left -= 1
            mode, reason = self._mode, "probe"
        elif not known:
            # Nothing timed or calibrated for one mode at this size: measure it (once: a
            # measured bucket then scales every other).
            unknown = DecodeMode.PLAIN if t_plain is None else DecodeMode.SPECULATIVE
            mode, reason = unknown, "cost unknown"
            if unknown is not current:
                self._probe_left = PROBE_STEPS - 1
                self.probes += 1
        else:
            mode, reason = self._switch_or_stay(obs, projected, kv, t_plain, y_plain, t_spec,
                                                y_spec)
        self._record(obs, projected, mode, reason, r_plain, r_spec, y_spec,
                     t_plain if mode is DecodeMode.PLAIN else t_spec)
        return mode

    def _switch_or_stay(self, obs, projected, kv, t_plain, y_plain, t_spec, y_spec):
        current = self._mode
        switch_cost = self._catchup_ms(obs.batch_size) if current is DecodeMode.PLAIN else 0.0
        self._loss_ms = max(0.0, self._loss_ms + _step_loss(current, t_plain, y_plain, t_spec, y_spec))
        if self._loss_ms > switch_cost:
            return _OTHER[current], "predicted gain"
        probe = self._probe_cost(obs, projected, kv, t_plain, y_plain, t_spec, y_spec)
        if probe is not None and probe <= self._budget_ms:  # saved for two such probes at most
            self._budget_ms = min(self._budget_ms, EXPLORATION_CAP_PROBES * probe) - probe
            self._probe_left = PROBE_STEPS - 1
            self.probes += 1
            return _OTHER[current], "probe"
        return current, "stay"

    def _probe_cost(self, obs, projected, kv, t_plain, y_plain, t_spec, y_spec) -> Optional[float]:
        """Predicted loss of a probe of the other mode, its catch-up included (a probe of plain
        decoding pays one on returning); None where the prediction already favours it (the loss
        accounting's call), where the exploration budget cannot cover it, or where the other mode
        cannot win even at its best."""
        if (y_spec / t_spec > y_plain / t_plain) is (self._mode is DecodeMode.PLAIN):
            return None
        catchup = (self._catchup_ms(obs.batch_size) if self._mode is DecodeMode.PLAIN else
                   self.catchup.predict(self.config.catchup_tokens(obs.batch_size, PROBE_STEPS)))
        other = _OTHER[self._mode]
        cost = PROBE_STEPS * max(0.0, _step_loss(other, t_plain, y_plain, t_spec, y_spec)) + catchup
        if cost > self._budget_ms:  # the budget decides first: the best case below costs a _rates
            return None
        best_t_plain, _, best_t_spec, best_y_spec = self._rates(obs, projected, kv, optimistic=True)
        best_t, best_y, now = ((best_t_plain, y_plain, y_spec / t_spec) if other is DecodeMode.PLAIN
                               else (best_t_spec, best_y_spec, y_plain / t_plain))
        return None if not best_t or best_y / best_t <= now else cost

    def _catchup_ms(self, batch_size: int) -> float:
        return self.catchup.predict(self.config.catchup_tokens(batch_size, self._plain_run))

    def _record(self, obs, projected, mode, reason, r_plain, r_spec, y_spec, predicted) -> None:
        if mode is not self._mode:
            self.switches += 1
            self._loss_ms = 0.0
        self._mode = mode
        self._plain_run = self._plain_run + 1 if mode is DecodeMode.PLAIN else 0
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        self.latest = Decision(
            step=obs.step or self._step, mode=mode, batch=obs.batch_size, projected_batch=projected,
            kv_tokens=obs.kv_tokens, queued=obs.queued, plain_tok_per_s=1000 * r_plain,
            spec_tok_per_s=1000 * r_spec, spec_tokens=y_spec, predicted_ms=predicted, reason=reason)

    def report(self) -> Dict[str, ReportValue]:
        server_mean = self.acceptance.server_mean
        return {
            "policy": "throughput",
            "max_speculative_graph_batch": self.config.max_speculative_batch,
            "probes": self.probes,
            "policy_switches": self.switches,
            "decisions_by_reason": dict(self.reasons),
            "exploration_budget_ms": round(self._budget_ms, 3),
            "acceptance_estimate": round(server_mean, 4) if server_mean is not None else 0.0,
            "plain_cost": self.costs[DecodeMode.PLAIN].report(),
            "speculative_cost": self.costs[DecodeMode.SPECULATIVE].report(),
            "catchup_ms_per_100_tokens": round(self.catchup.predict(100), 3),
        }

def _step_loss(mode: DecodeMode, t_plain: float, y_plain: float, t_spec: float, y_spec: float) -> float:
    """Milliseconds a step of ``mode`` loses against the other mode serving the same tokens
    (negative: it gains); a speculative step predicted to yield nothing is all loss."""
    if mode is DecodeMode.PLAIN:
        return t_plain - y_plain * t_spec / y_spec if y_spec > 0 else -t_plain
    return t_spec - y_spec * t_plain / y_plain


def new_throughput_policy(
    config: ThroughputPolicyConfig,
    buckets: Mapping[DecodeMode, Sequence[int]],
    calibration: Mapping[DecodeMode, Mapping[int, float]],
    per_kv_token_prior_ms: Mapping[DecodeMode, float],
    catchup_prior_fixed_ms: float,
    max_acceptance: float,
) -> ThroughputPolicy:
    """The automatic policy with its step model's priors."""
    costs = {
        mode: ModeCost(buckets[mode], calibration.get(mode, {}), per_kv_token_prior_ms[mode])
        for mode in (DecodeMode.PLAIN, DecodeMode.SPECULATIVE)
    }
    return ThroughputPolicy(config, costs, CatchupCost(catchup_prior_fixed_ms),
                            Acceptance(max_acceptance))
