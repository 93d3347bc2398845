"""The automatic switching policy: speculate while it yields more tokens per second.

A speculative step over a batch of ``b`` requests emits ``a`` tokens per request (``a`` = the
measured acceptance length, bonus token included) in ``t_spec(b)``; a plain step emits one per
request in ``t_plain(b)``. Speculation pays while its gain

    gain(b) = a * t_plain(b) / t_spec(b)

is above 1. The costs come from a :class:`CostTable` the worker measures on this server (a
start-up calibration refined by timing real steps, identical on every tensor-parallel rank),
indexed by CUDA-graph bucket (the padded batch size a step really runs). The policy

* leaves speculation after ``switch_patience`` consecutive steps with ``gain < 1 - margin``;
* returns to it after ``switch_patience`` steps with ``gain > 1 + margin``, where ``t_spec``
  also carries the measured draft-KV catch-up cost spread over ``catchup_horizon_steps``;
* leaves speculation at once, without the patience, when the gain is no close call: below
  ``1 / (1 + decisive_band)`` (or below ``1 - margin``, if that is lower), once some speculative
  step has been timed (a load that arrives at once, 128 requests after one, would otherwise pay
  ``switch_patience`` speculative steps at an estimated 0.45x of plain decoding's throughput on
  the 8B-shaped model; the patience is there for noise near the crossover, and a gain this far
  from 1 is none). The way back keeps its patience: a batch that grows through the close-call
  band while requests arrive (a decode step after each prefill chunk) would otherwise start
  speculating at its first small size, pay a catch-up and speculate through the band, for a
  gain of a few plain steps at a small batch when a load ends;
* forces plain decoding at once above the largest speculative CUDA graph;
* probes: a few steps in the other mode (``probe_steps``) when that mode's cost at this bucket
  was never measured and the estimated gain is within ``cost_probe_band`` of 1 (so a wrong
  start-up estimate cannot decide a close call); as many more speculative steps before
  speculation is left while no speculative cost has been measured at all, once per
  ``refresh_interval`` whatever the bucket (so a start-up estimate that overrates speculative
  steps cannot keep speculation off for good, and a load that no probe can measure is not kept
  speculating; one measured bucket rescales the others); and, while plain, when no verify ran for
  ``refresh_interval`` steps (``close_call_refresh_interval`` when the gain estimated from
  the old acceptance is above ``1 / (1 + close_call_band)``) and speculation could pay at this
  batch size with a perfect acceptance, or no speculative step has been timed at all (so a
  workload whose acceptance rose is noticed, a prior that left speculation is checked, and a
  close call is not left to a few unlucky verifies). A probe bypasses the patience
  and then returns to the mode it interrupted (a speculative probe ends early at a batch where
  speculation loses decisively even with every draft accepted, once a speculative step has
  been timed, and a speculative cost probe ends once the batch outgrows the bucket it was
  started to measure; none starts while the batch grows, as it does while a wave is prefilled),
  where the rules above (and their patience)
  decide again with what it measured; each (mode, bucket) cost probe happens at most once per
  ``refresh_interval`` steps, and a refresh probe resets the staleness clock.

Pure Python: costs and acceptance in, mode out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

from sglang_dynamic_eagle.cost_model import CostLookup, CostTable, speculative_gain
from sglang_dynamic_eagle.policy import (
    PATIENCE_FLAG,
    DecodeMode,
    PatienceStreak,
    ReportValue,
    StepObservation,
    check_int_at_least,
)

DEFAULT_MARGIN = 0.03
DEFAULT_CATCHUP_HORIZON_STEPS = 64
DEFAULT_PROBE_STEPS = 12
DEFAULT_REFRESH_INTERVAL = 4096
DEFAULT_CLOSE_CALL_REFRESH_INTERVAL = 256
DEFAULT_COST_PROBE_BAND = 0.3
DEFAULT_CLOSE_CALL_BAND = 0.1
DEFAULT_DECISIVE_BAND = 0.3


class AcceptanceEstimate:
    """Acceptance length of recent speculative steps, per request: an exponentially weighted
    mean whose weights age with every decode step, speculative or plain, by ``1 - 1/window``.

    Each verified request weighs 1 when it is added, so a step of 32 requests counts 32 times
    as much as a lone request's (whose acceptance is a small integer). While speculation runs
    the mean covers about the last ``window`` steps; after a long plain stretch the old weight
    has faded and the next verifies form a fresh mean instead of being averaged into a stale one.
    """

    def __init__(self, window: int = 64) -> None:
        self.window = check_int_at_least("acceptance window", window, 1)
        self._weighted_sum = 0.0
        self._weight = 0.0
        self._last_step = 0

    @property
    def value(self) -> Optional[float]:
        return self._weighted_sum / self._weight if self._weight > 0 else None

    def add(self, accepted_tokens: float, requests: int, decode_step: int) -> None:
        """``accepted_tokens`` over ``requests`` verified requests (bonus tokens included),
        processed at decode step ``decode_step``."""
        kept = (1 - 1 / self.window) ** max(0, decode_step - self._last_step)
        self._weighted_sum = self._weighted_sum * kept + accepted_tokens
        self._weight = self._weight * kept + requests
        self._last_step = decode_step

    def add_step(self, num_correct_drafts_per_req: Sequence[int], decode_step: int) -> None:
        """One verify step's result: accepted drafts per request (the bonus token is added)."""
        if num_correct_drafts_per_req:
            count = len(num_correct_drafts_per_req)
            self.add(sum(num_correct_drafts_per_req) + count, count, decode_step)


def max_accepted_tokens(num_steps: int, num_draft_tokens: int) -> int:
    """Tokens a verify yields with every draft accepted: a path of one draft per step plus the
    bonus token, and no more than the draft tokens verified (a tree of 8 tokens over 5 steps
    accepts at most 6, a tree of 4 tokens over 5 steps at most 4)."""
    return min(num_steps + 1, num_draft_tokens)


@dataclass(frozen=True)
class CostPolicyConfig:
    switch_patience: int
    max_speculative_batch: int  # largest batch the speculative CUDA graphs cover
    max_acceptance: float  # tokens per verify with every draft accepted (max_accepted_tokens)
    margin: float = DEFAULT_MARGIN
    catchup_horizon_steps: int = DEFAULT_CATCHUP_HORIZON_STEPS
    probe_steps: int = DEFAULT_PROBE_STEPS
    refresh_interval: int = DEFAULT_REFRESH_INTERVAL
    close_call_refresh_interval: int = DEFAULT_CLOSE_CALL_REFRESH_INTERVAL
    cost_probe_band: float = DEFAULT_COST_PROBE_BAND
    close_call_band: float = DEFAULT_CLOSE_CALL_BAND
    decisive_band: float = DEFAULT_DECISIVE_BAND

    def __post_init__(self) -> None:
        check_int_at_least(PATIENCE_FLAG, self.switch_patience, 1)
        check_int_at_least("max_speculative_batch", self.max_speculative_batch, 1)
        check_int_at_least("catchup_horizon_steps", self.catchup_horizon_steps, 1)
        check_int_at_least("probe_steps", self.probe_steps, 0)
        check_int_at_least("refresh_interval", self.refresh_interval, 1)
        check_int_at_least("close_call_refresh_interval", self.close_call_refresh_interval, 1)
        for name in ("max_acceptance", "margin", "cost_probe_band", "close_call_band",
                     "decisive_band"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.max_acceptance < 1:
            raise ValueError(f"max_acceptance must be >= 1, got {self.max_acceptance}")
        if self.margin >= 1:
            raise ValueError(f"margin must be < 1, got {self.margin}")


@dataclass
class _Probe:
    mode: DecodeMode
    steps_left: int  # probe steps still to run after the current one
    return_mode: DecodeMode  # the mode the probe interrupted
    bucket: Optional[int] = None  # the bucket a cost probe measures; None for the other probes


@dataclass(frozen=True)
class _Gains:
    """Speculation's gains at one batch size: per step, on entry (the catch-up spread over
    the horizon), and on entry at full acceptance."""

    plain: CostLookup
    spec: CostLookup
    gain: float
    entry_gain: float
    best_gain: float


@dataclass
class _ProbeLog:
    """Decode-step index of the latest cost probe of each (mode, bucket) and of the latest
    probe before leaving on the start-up prior, and the count."""

    by_bucket: Dict[Tuple[DecodeMode, int], int] = field(default_factory=dict)
    prior_guard_step: Optional[int] = None
    count: int = 0


class CostPolicy:
    """The automatic policy; a ``policy.DecodePolicy``. See the module docstring."""

    def __init__(
        self, config: CostPolicyConfig, initial_mode: DecodeMode = DecodeMode.SPECULATIVE
    ) -> None:
        self._config = config
        self._mode = DecodeMode(initial_mode)
        self._streak = PatienceStreak(config.switch_patience)
        self._probe: Optional[_Probe] = None
        self._probes = _ProbeLog()
        self._step = 0
        self._last_speculative_step = 0
        self._last_gain: Optional[float] = None
        self._last_batch_size: Optional[int] = None
        self._batch_growing = False

    @property
    def mode(self) -> DecodeMode:
        return self._mode

    def expects_plain(self, observation: StepObservation) -> bool:
        batch_size = observation.batch_size
        if batch_size > self._config.max_speculative_batch:
            return True
        resting = self._probe.return_mode if self._probe is not None else self._mode
        if resting is DecodeMode.SPECULATIVE:
            return False
        costs = observation.costs
        gains = None if costs is None else self._gains(costs, batch_size, observation.acceptance)
        return gains is None or gains.entry_gain <= 1 + self._config.margin

    @property
    def config(self) -> CostPolicyConfig:
        return self._config

    @property
    def max_speculative_batch(self) -> int:
        return self._config.max_speculative_batch

    @property
    def probing(self) -> bool:
        return self._probe is not None

    def wants_fresh_costs(self) -> bool:
        """True after a probe's last step: the next decision should read what it measured."""
        return self._probe is not None and self._probe.steps_left == 0

    def decide(self, observation: StepObservation) -> DecodeMode:
        self._step += 1
        last = self._last_batch_size
        self._batch_growing = last is not None and observation.batch_size > last
        self._last_batch_size = observation.batch_size
        self._mode = self._next_mode(observation)
        if self._mode is DecodeMode.SPECULATIVE:
            self._last_speculative_step = self._step
        return self._mode

    def _next_mode(self, observation: StepObservation) -> DecodeMode:
        batch_size = observation.batch_size
        if batch_size > self._config.max_speculative_batch:
            self._probe = None
            self._streak.reset()
            return DecodeMode.PLAIN
        if self._probe is not None:
            if self._probe.steps_left > 0 and not self._speculative_probe_is_over(observation):
                self._probe.steps_left -= 1
                return self._probe.mode
            self._mode = self._probe.return_mode
            self._probe = None
        if observation.costs is None:
            return self._mode
        return self._decide_from_costs(observation.costs, batch_size, observation.acceptance)

    def _speculative_probe_is_over(self, observation: StepObservation) -> bool:
        return self._speculative_probe_outgrown(observation) or self._speculative_probe_is_lost(
            observation
        )

    def _speculative_probe_outgrown(self, observation: StepObservation) -> bool:
        """A speculative cost probe whose batch has grown past the bucket it was started for (a
        wave that reaches the scheduler in two groups leaves a small batch for a few steps, and
        the rest of the wave is prefilled during the probe): its remaining steps would run at a
        batch that the probe's reason, a close call at the small bucket, says nothing about. A
        shrinking batch keeps the probe: its steps get no dearer."""
        probe = self._probe
        if probe.mode is not DecodeMode.SPECULATIVE or probe.bucket is None:
            return False
        if observation.costs is None:
            return False
        bucket = observation.costs.speculative.lookup(observation.batch_size).bucket
        return bucket is not None and bucket > probe.bucket

    def _speculative_probe_is_lost(self, observation: StepObservation) -> bool:
        """A speculative probe whose batch has grown to where speculation loses decisively even
        with every draft accepted (a probe started at a wave's first lone request, the rest of
        the wave prefilled before its next step): its remaining steps cannot pay and measure
        nothing a decision there needs. On the start-up prior alone the probe is what measures
        the speculative cost, so it runs on."""
        costs = observation.costs
        if self._probe.mode is not DecodeMode.SPECULATIVE or costs is None:
            return False
        if not any(costs.speculative.measured):
            return False
        gains = self._gains(costs, observation.batch_size, observation.acceptance)
        if gains is None:
            return False
        best = speculative_gain(self._config.max_acceptance, gains.plain.step_ms, gains.spec.step_ms)
        return best < self._decisive_loss_below()

    def _decide_from_costs(
        self, costs: CostTable, batch_size: int, acceptance: Optional[float]
    ) -> DecodeMode:
        gains = self._gains(costs, batch_size, acceptance)
        if gains is None:
            # The current mode's cost is being measured by this very step; the other's needs a probe.
            plain = costs.plain.lookup(batch_size)
            spec = costs.speculative.lookup(batch_size)
            missing = plain if self._mode is DecodeMode.SPECULATIVE else spec
            other = DecodeMode.PLAIN if self._mode is DecodeMode.SPECULATIVE else DecodeMode.SPECULATIVE
            if missing.step_ms is not None or missing.bucket is None:
                return self._mode  # beyond the other mode's buckets nothing could be measured
            return self._probe_cost(other, missing.bucket) or self._mode
        self._last_gain = gains.gain
        prior_only = not any(costs.speculative.measured)
        if self._mode is DecodeMode.SPECULATIVE:
            return self._from_speculative(gains.gain, gains.plain, gains.spec, prior_only)
        return self._from_plain(gains.gain, gains.entry_gain, gains.best_gain, gains.spec, prior_only)

    def _gains(
        self, costs: CostTable, batch_size: int, acceptance: Optional[float]
    ) -> Optional[_Gains]:
        """The gains at ``batch_size``; None while either mode's cost there is unknown."""
        plain = costs.plain.lookup(batch_size)
        spec = costs.speculative.lookup(batch_size)
        if plain.step_ms is None or spec.step_ms is None:
            return None
        estimate = self._config.max_acceptance if acceptance is None else acceptance
        entry_ms = spec.step_ms + costs.catchup_ms / self._config.catchup_horizon_steps
        return _Gains(
            plain=plain,
            spec=spec,
            gain=speculative_gain(estimate, plain.step_ms, spec.step_ms),
            entry_gain=speculative_gain(estimate, plain.step_ms, entry_ms),
            best_gain=speculative_gain(self._config.max_acceptance, plain.step_ms, entry_ms),
        )

    def _from_speculative(
        self, gain: float, plain: CostLookup, spec: CostLookup, prior_only: bool
    ) -> DecodeMode:
        if not plain.measured and self._in_probe_band(gain):
            probed = self._probe_cost(DecodeMode.PLAIN, plain.bucket)
            if probed is not None:
                return probed
        leave = gain < 1 - self._config.margin
        if leave and prior_only:
            # Never leave on the start-up prior alone: a prior that overrates speculative
            # steps would otherwise keep speculation off for good. One measured bucket
            # rescales every unmeasured one, so this holds only until the first. Once per
            # refresh interval, whatever the bucket: where no probe can measure (a prefill
            # between every two decode steps), a probe at each new batch size would keep
            # speculating for good.
            probed = self._probe_prior(spec.bucket)
            if probed is not None:
                return probed
        if not prior_only and gain < self._decisive_loss_below():
            self._streak.reset()
            return DecodeMode.PLAIN
        if self._streak.advance(leave):
            return DecodeMode.PLAIN
        return DecodeMode.SPECULATIVE

    def _from_plain(
        self, gain: float, entry_gain: float, best_gain: float, spec: CostLookup,
        prior_only: bool,
    ) -> DecodeMode:
        if self._streak.advance(entry_gain > 1 + self._config.margin):
            return DecodeMode.SPECULATIVE
        # A growing batch would carry the probe's steps into larger buckets (which end it).
        if not spec.measured and self._in_probe_band(gain) and not self._batch_growing:
            probed = self._probe_cost(DecodeMode.SPECULATIVE, spec.bucket)
            if probed is not None:
                return probed
        # With no speculative step ever timed, the prior may be what makes speculation look
        # hopeless (and what left it): speculation is probed again after the refresh interval.
        could_pay = prior_only or best_gain > 1 + self._config.margin
        if could_pay and self._acceptance_is_stale(entry_gain):
            return self._start_probe(DecodeMode.SPECULATIVE) or DecodeMode.PLAIN
        return DecodeMode.PLAIN

    def _acceptance_is_stale(self, entry_gain: float) -> bool:
        """No verify for the refresh interval; a shorter one when the gain estimated from
        that old acceptance is a close call, where a few unlucky verifies (acceptance is an
        integer per request and step) would otherwise keep a paying speculation off."""
        interval = self._config.refresh_interval
        # One-sided, so that a higher acceptance or a cheaper speculative step never delays
        # a refresh (above 1 + margin the patience enters speculation anyway).
        if entry_gain > 1 / (1 + self._config.close_call_band):
            interval = min(interval, self._config.close_call_refresh_interval)
        return self._step - self._last_speculative_step >= interval

    def _decisive_loss_below(self) -> float:
        return min(1 - self._config.margin, 1 / (1 + self._config.decisive_band))

    def _in_probe_band(self, gain: float) -> bool:
        band = self._config.cost_probe_band
        return 1 / (1 + band) < gain < 1 + band

    def _probe_prior(self, bucket: int) -> Optional[DecodeMode]:
        """A speculative probe before leaving on the prior; it also counts as this bucket's
        speculative cost probe."""
        last = self._probes.prior_guard_step
        if last is not None and self._step - last < self._config.refresh_interval:
            return None
        self._probes.prior_guard_step = self._step
        self._probes.by_bucket[(DecodeMode.SPECULATIVE, bucket)] = self._step
        return self._start_probe(DecodeMode.SPECULATIVE)

    def _probe_cost(self, mode: DecodeMode, bucket: int) -> Optional[DecodeMode]:
        last = self._probes.by_bucket.get((mode, bucket))
        if last is not None and self._step - last < self._config.refresh_interval:
            return None
        self._probes.by_bucket[(mode, bucket)] = self._step
        return self._start_probe(mode, bucket)

    def _start_probe(self, mode: DecodeMode, bucket: Optional[int] = None) -> Optional[DecodeMode]:
        if self._config.probe_steps == 0:
            return None
        self._streak.reset()
        self._probes.count += 1
        self._probe = _Probe(mode, self._config.probe_steps - 1, return_mode=self._mode, bucket=bucket)
        return mode

    def report(self) -> Dict[str, ReportValue]:
        config = self._config
        return {
            "policy": "auto",
            "switch_patience": config.switch_patience,
            "margin": config.margin,
            "max_speculative_graph_batch": config.max_speculative_batch,
            "probes": self._probes.count,
            "last_gain": round(self._last_gain, 4) if self._last_gain is not None else 0.0,
        }
