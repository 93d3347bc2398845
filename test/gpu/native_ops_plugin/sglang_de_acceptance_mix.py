"""Test-only sglang plugin: simulated acceptance that differs between requests (speed benchmarks only).

sglang 0.5.17's ``SGLANG_SIMULATE_ACC_LEN=X`` makes every request of every EAGLE verify accept
about X tokens (bonus included). Real traffic mixes tasks that accept differently. With

    SGLANG_DE_TEST_ACCEPTANCE_MIX=1.3:0.5,4.0:0.5

in a server's environment, half the requests accept about 1.3 tokens per verify and half about
4.0. Syntax: ``MEAN:WEIGHT[,MEAN:WEIGHT...]``; each MEAN >= 1 (tokens per verify, bonus
included), each WEIGHT > 0, the weights summing to 1 (within 0.01; they are then normalised); a
lone ``MEAN`` means ``MEAN:1``. Or, for a mixture that shifts over time,

    SGLANG_DE_TEST_ACCEPTANCE_MIX_SCHEDULE=0=1.3:0.5,4.0:0.5;30=1.3:0.9,4.0:0.1

``START=MIX`` segments separated by ``;``: from START seconds after the server's first verify
(the first START must be 0, the others strictly increasing) the mixture MIX applies. Or, for a
mixture that a benchmark driver sets per workload,

    SGLANG_DE_TEST_ACCEPTANCE_MIX_FILE=/path/to/file

whose content is a MIX, read at start and again whenever the file's modification time or size
changes (one ``os.stat`` per verify; write it atomically, by renaming a new file over it). A bad
content stops the server at start; later it is logged and the previous mixture kept. Set one of
the three variables, not more. Either needs ``SGLANG_SIMULATE_ACC_LEN`` set to a number > 0 as
well (any value; the mixture replaces it): sglang builds a simulated accept index only then
(``eagle_utils.eagle_sample`` reads ``spec_utils.SIMULATE_ACC_LEN``, fixed from the environment
when ``spec_utils`` is imported). ``SGLANG_SIMULATE_ACC_METHOD``, if set, must be
``match-expected`` (the floor/ceil sampling below); ``SGLANG_SIMULATE_ACC_TOKEN_MODE`` keeps its
sglang meaning (``fixed``: every verify token is id 100; ``real-draft-token``: accepted drafts
and a target-argmax bonus, topk 1 only, sglang's own rule). A bad value stops the server at start
with one line naming the variable.

A request's class is a deterministic function of its prompt: the blake2b hash of all its prompt
token ids (``req.origin_input_ids``) gives u in [0, 1), and the class is the one whose slice of
the cumulative weights holds u. The same prompt always gets the same class, and random prompts
get the stated mixture. When a schedule moves to its next mixture, each request's class is read
again from the same u at the next verify, so in-flight requests change class too (only those
whose u lies where the boundaries moved). A fractional mean m is realised per verify: each
request accepts floor(m) or floor(m) + 1 tokens, the latter with probability m - floor(m)
(sglang's ``match-expected``), from a seeded generator of this plugin (sglang's torch RNG is
left alone), after m is clamped to [1, W]; W = min(num_steps + 1, draft tokens) is the width of
the accept index. For topk 1 chains (what the benchmarks use) the request then accepts its
first L - 1 drafts and the bonus. For trees (topk > 1) the plugin does what sglang's own
simulation does, per request: it accepts the first L nodes of the request's tree in node order
(not necessarily a root-to-leaf path; only the speed is meaningful), and sglang refuses
``real-draft-token`` there.

How it hooks in (sglang's HookRegistry, applied by ``load_plugins()`` in every process):

* AROUND ``sglang.srt.speculative.eagle_utils.eagle_sample(verify_input, batch, ...)``: the one
  point on the way into the verify's sampling where the batch's ``reqs`` are visible. It computes
  each row's mean from ``batch.reqs`` (row i of the verify is ``batch.reqs[i]``: sglang builds
  ``candidates``, ``accept_index`` and ``num_correct_drafts`` as ``[bs, ...]`` in batch order),
  keeps them for the call and runs the original. HookRegistry also rebinds the name in
  ``eagle_worker_common`` (``run_eagle_verify``, used by ``EAGLEWorkerV2.verify``, so by EAGLE3 and
  by EAGLE3_DYNAMIC's speculative steps, which call ``super().forward_batch_generation``) and in
  ``ngram_worker``. EAGLE3_DYNAMIC's plain decode steps and every prefill never call it.
* AROUND ``sglang.srt.speculative.spec_utils.generate_simulated_accept_index``: ``eagle_sample``
  imports it from ``spec_utils`` at call time; inside a hooked ``eagle_sample`` it builds the
  accept index with one length per row instead of one for the batch (outside one it runs
  sglang's original).

It adds no host synchronisation: the lengths are drawn on the host and copied to the GPU from
pinned memory without blocking. With a schedule of several mixtures and tensor parallelism > 1
it refuses at the first verify (each rank keeps its own clock, so ranks could disagree on the
mixture for a step). Outputs are not the model's tokens: for speed benchmarks only. Without the
variables the plugin does nothing. Installed only on the GPU machine (pip install -e
test/gpu/native_ops_plugin); never part of the product wheel.
"""

import bisect
import contextvars
import functools
import hashlib
import inspect
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

logger = logging.getLogger(__name__)

MIX_ENV = "SGLANG_DE_TEST_ACCEPTANCE_MIX"
SCHEDULE_ENV = "SGLANG_DE_TEST_ACCEPTANCE_MIX_SCHEDULE"
FILE_ENV = "SGLANG_DE_TEST_ACCEPTANCE_MIX_FILE"
SIMULATE_LEN_ENV = "SGLANG_SIMULATE_ACC_LEN"
SIMULATE_METHOD_ENV = "SGLANG_SIMULATE_ACC_METHOD"
SIMULATE_TOKEN_MODE_ENV = "SGLANG_SIMULATE_ACC_TOKEN_MODE"
MATCH_EXPECTED = "match-expected"
TOKEN_MODES = ("fixed", "real-draft-token")
REAL_DRAFT_TOKEN = "real-draft-token"
FIXED_TOKEN_ID = 100  # sglang's own choice in generate_simulated_accept_index ("some legit token id")

EAGLE_SAMPLE_TARGET = "sglang.srt.speculative.eagle_utils.eagle_sample"
SIMULATED_INDEX_TARGET = "sglang.srt.speculative.spec_utils.generate_simulated_accept_index"

SEED = 20261204
WEIGHT_SUM_TOLERANCE = 0.01
_PROMPT_FRACTION_ATTR = "_sglang_de_test_acceptance_u"


class AcceptanceMixError(ValueError):
    """A refused configuration; the message is one line starting with the variable's name."""


@dataclass(frozen=True)
class Mixture:
    means: Tuple[float, ...]
    weights: Tuple[float, ...]  # normalised to sum 1

    @functools.cached_property
    def cumulative(self) -> np.ndarray:
        """Upper ends of the classes' slices of [0, 1)."""
        return np.cumsum(self.weights)

    @property
    def expected_length(self) -> float:
        return float(sum(m * w for m, w in zip(self.means, self.weights)))

    def class_of(self, u: float) -> int:
        """The class whose slice of [0, 1) holds u."""
        return int(min(np.searchsorted(self.cumulative, u, side="right"), len(self.means) - 1))

    def describe(self) -> str:
        return ",".join(f"{m:g}:{w:g}" for m, w in zip(self.means, self.weights))


@dataclass(frozen=True)
class Schedule:
    starts: Tuple[float, ...]  # seconds after the first verify; starts[0] == 0
    mixtures: Tuple[Mixture, ...]

    def segment_at(self, elapsed_s: float) -> int:
        return max(bisect.bisect_right(self.starts, elapsed_s) - 1, 0)

    def describe(self) -> str:
        return ";".join(f"{s:g}={m.describe()}" for s, m in zip(self.starts, self.mixtures))


def _number(text: str, what: str, env: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise AcceptanceMixError(f"{env}: {what} {text.strip()!r} is not a finite number")
    return value


def parse_mixture(text: str, env: str = MIX_ENV) -> Mixture:
    """``MEAN:WEIGHT[,MEAN:WEIGHT...]`` (or a lone ``MEAN``)."""
    usage = "expected MEAN:WEIGHT[,MEAN:WEIGHT...], e.g. 1.3:0.5,4.0:0.5"
    terms = [term.strip() for term in text.split(",")]
    if not text.strip() or any(not term for term in terms):
        raise AcceptanceMixError(f"{env}: empty mixture term in {text!r}; {usage}")
    means, weights = [], []
    for term in terms:
        parts = term.split(":")
        if len(parts) == 1 and len(terms) == 1:
            parts = [parts[0], "1"]
        if len(parts) != 2:
            raise AcceptanceMixError(f"{env}: bad mixture term {term!r}; {usage}")
        mean = _number(parts[0], "mean", env)
        weight = _number(parts[1], "weight", env)
        if mean < 1.0:
            raise AcceptanceMixError(
                f"{env}: mean {mean:g} < 1 (a verify emits at least the bonus token) in {term!r}")
        if weight <= 0.0:
            raise AcceptanceMixError(f"{env}: weight {weight:g} <= 0 in {term!r}")
        means.append(mean)
        weights.append(weight)
    total = sum(weights)
    if abs(total - 1.0) > WEIGHT_SUM_TOLERANCE:
        raise AcceptanceMixError(f"{env}: weights sum to {total:g}, not 1, in {text!r}")
    return Mixture(tuple(means), tuple(w / total for w in weights))


def parse_schedule(text: str, env: str = SCHEDULE_ENV) -> Schedule:
    """``START=MIX[;START=MIX...]``, START in seconds after the first verify."""
    usage = "expected START=MIX[;START=MIX...], e.g. 0=1.3:0.5,4.0:0.5;30=1.3:0.9,4.0:0.1"
    segments = [segment.strip() for segment in text.split(";")]
    if not text.strip() or any(not segment for segment in segments):
        raise AcceptanceMixError(f"{env}: empty segment in {text!r}; {usage}")
    starts, mixtures = [], []
    for segment in segments:
        start_text, sep, mix_text = segment.partition("=")
        if not sep:
            raise AcceptanceMixError(f"{env}: segment {segment!r} has no '='; {usage}")
        start = _number(start_text, "start", env)
        if not starts and start != 0:
            raise AcceptanceMixError(f"{env}: the first segment must start at 0, not {start:g}")
        if starts and start <= starts[-1]:
            raise AcceptanceMixError(
                f"{env}: start {start:g} is not after the previous start {starts[-1]:g}")
        starts.append(start)
        mixtures.append(parse_mixture(mix_text, env))
    return Schedule(tuple(starts), tuple(mixtures))


class MixtureFile:
    """A mixture read from a file, read again when the file's inode, modification time or size
    changes (a rename over it gives a new inode)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp = self._stat()
        self.mixture = self._read()
        self._failing = False

    def _stat(self) -> Tuple[int, int, int]:
        try:
            status = os.stat(self.path)
        except OSError as error:
            raise AcceptanceMixError(f"{FILE_ENV}: cannot read {self.path!r}: {error.strerror}") from None
        return status.st_ino, status.st_mtime_ns, status.st_size

    def _read(self) -> Mixture:
        try:
            with open(self.path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as error:
            raise AcceptanceMixError(f"{FILE_ENV}: cannot read {self.path!r}: "
                                     f"{getattr(error, 'strerror', None) or error}") from None
        return parse_mixture(text.strip(), f"{FILE_ENV} ({self.path})")

    def current(self) -> Mixture:
        """The file's mixture; a file that vanished or holds a bad mixture keeps the last good one
        (logged once until the file changes again)."""
        try:
            stamp = self._stat()
            if stamp != self._stamp:
                self._stamp = stamp
                self.mixture = self._read()
            self._failing = False
        except AcceptanceMixError as error:
            if not self._failing:
                logger.error("%s; keeping mixture %s (test only)", error, self.mixture.describe())
            self._failing = True
        return self.mixture


def schedule_from_env(environ: Mapping[str, str]) -> Optional[Schedule]:
    """The configured schedule (a lone mixture is a one-segment schedule), None when off or when
    the mixture comes from a file (``mixture_file_from_env``)."""
    given = [env for env in (MIX_ENV, SCHEDULE_ENV, FILE_ENV) if environ.get(env) is not None]
    if len(given) > 1:
        raise AcceptanceMixError(
            f"{' and '.join(given)} are set; set one (a schedule's segment '0=MIX' is the lone mixture MIX)")
    mix, schedule = environ.get(MIX_ENV), environ.get(SCHEDULE_ENV)
    if schedule is not None:
        return parse_schedule(schedule)
    if mix is not None:
        return Schedule((0.0,), (parse_mixture(mix),))
    return None


def mixture_file_from_env(environ: Mapping[str, str]) -> Optional[MixtureFile]:
    path = environ.get(FILE_ENV)
    return None if path is None else MixtureFile(path)


def check_simulation_env(environ: Mapping[str, str], configured_by: str) -> None:
    """sglang takes its simulated-acceptance path only with SGLANG_SIMULATE_ACC_LEN > 0."""
    text = environ.get(SIMULATE_LEN_ENV)
    value = math.nan
    if text is not None:
        try:
            value = float(text)
        except ValueError:
            pass
    if not (math.isfinite(value) and value > 0):
        raise AcceptanceMixError(
            f"{configured_by} needs {SIMULATE_LEN_ENV} set to a number > 0 (got {text!r}; any "
            f"value, the mixture replaces it): sglang builds a simulated accept index only then")
    method = environ.get(SIMULATE_METHOD_ENV, MATCH_EXPECTED)
    if method != MATCH_EXPECTED:
        raise AcceptanceMixError(
            f"{configured_by} samples floor/ceil lengths ({MATCH_EXPECTED}); unset "
            f"{SIMULATE_METHOD_ENV} (got {method!r})")
    mode = environ.get(SIMULATE_TOKEN_MODE_ENV, TOKEN_MODES[0])
    if mode not in TOKEN_MODES:
        raise AcceptanceMixError(
            f"{SIMULATE_TOKEN_MODE_ENV} must be one of {', '.join(TOKEN_MODES)} (got {mode!r})")


def prompt_fraction(input_ids: Iterable[int]) -> float:
    """A deterministic u in [0, 1) from a prompt's token ids (blake2b of them as int64)."""
    data = np.asarray(list(input_ids), dtype=np.int64).tobytes()
    digest = hashlib.blake2b(data, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def request_fraction(req) -> float:
    """``prompt_fraction`` of ``req.origin_input_ids``, computed once per request."""
    u = getattr(req, _PROMPT_FRACTION_ATTR, None)
    if u is None:
        u = prompt_fraction(req.origin_input_ids)
        setattr(req, _PROMPT_FRACTION_ATTR, u)
    return u


def sample_lengths(means: np.ndarray, max_len: int, rng: np.random.Generator) -> np.ndarray:
    """Per row, floor(m) or floor(m) + 1 with probability m - floor(m), m clamped to [1, max_len]."""
    clamped = np.clip(np.asarray(means, dtype=np.float64), 1.0, float(max_len))
    lower = np.floor(clamped)
    lengths = lower + (rng.random(clamped.shape[0]) < clamped - lower)
    return lengths.astype(np.int32)  # lower + 1 only where m > lower, so at most max_len


def simulated_accept_index(
    accept_index: torch.Tensor,
    predict: torch.Tensor,
    num_correct_drafts: torch.Tensor,
    candidates: torch.Tensor,
    target_predict: Optional[torch.Tensor],
    lengths: torch.Tensor,
    width: int,
    token_mode: str,
) -> torch.Tensor:
    """sglang's ``generate_simulated_accept_index`` with a length per row (``lengths``, int32 on
    the device, each in [1, width]). Row i accepts nodes ``accept_index[i, 0] + j`` for
    ``j < lengths[i]``; ``num_correct_drafts`` (mutable) gets ``lengths - 1``; ``predict``
    (mutable) gets sglang's token 100 everywhere (``fixed``) or, for ``real-draft-token`` (topk 1
    chains), the drafts ``candidates[i, 1:L]`` and the bonus ``target_predict[i, L - 1]``. No
    host synchronisation."""
    device = accept_index.device
    steps = torch.arange(width, device=device, dtype=torch.int32).view(1, -1)
    rows_lengths = lengths.to(device=device, dtype=torch.int32).view(-1, 1)
    nodes = accept_index[:, :1].to(torch.int32) + steps
    sim_accept_index = torch.where(steps < rows_lengths, nodes, torch.full_like(nodes, -1))
    num_correct_drafts.copy_(lengths.to(num_correct_drafts.dtype) - 1)
    if token_mode != REAL_DRAFT_TOKEN:
        predict.fill_(FIXED_TOKEN_ID)
        return sim_accept_index
    # topk 1 chain: node j of row i holds draft j + 1 when it is accepted as a draft, and the
    # target's argmax at j when it is the bonus; nodes past the bonus keep what they hold.
    flat_nodes = nodes.long().reshape(-1)
    next_drafts = candidates[:, 1 : width + 1]
    if next_drafts.shape[1] < width:
        next_drafts = torch.cat([next_drafts, candidates[:, -1:].expand(-1, width - next_drafts.shape[1])], 1)
    kept = predict[flat_nodes].view(nodes.shape)
    values = torch.where(
        steps < rows_lengths - 1,
        next_drafts.to(predict.dtype),
        torch.where(steps == rows_lengths - 1, target_predict[:, :width].to(predict.dtype), kept),
    )
    predict[flat_nodes] = values.reshape(-1)
    return sim_accept_index


class AcceptanceMix:
    """The configured schedule, its clock (seconds since the first verify) and its generator."""

    def __init__(self, schedule: Optional[Schedule], clock: Callable[[], float] = time.monotonic,
                 seed: int = SEED, mixture_file: Optional[MixtureFile] = None) -> None:
        if (schedule is None) == (mixture_file is None):
            raise ValueError("give a schedule or a mixture file")
        self.schedule = schedule
        self.mixture_file = mixture_file
        self._described: Optional[str] = None
        self._clock = clock
        self._rng = np.random.default_rng(seed)
        self._first_verify: Optional[float] = None
        self._segment = -1
        self._warned_clamp = False

    def elapsed_s(self) -> float:
        now = self._clock()
        if self._first_verify is None:
            self._first_verify = now
        return now - self._first_verify

    def mixture_now(self) -> Mixture:
        if self.mixture_file is not None:
            mixture = self.mixture_file.current()
            if mixture.describe() != self._described:
                self._described = mixture.describe()
                logger.warning("%s: mixture %s (mean %.3f tokens per verify) (test only)", FILE_ENV,
                               self._described, mixture.expected_length)
            return mixture
        elapsed = self.elapsed_s()
        segment = self.schedule.segment_at(elapsed)
        mixture = self.schedule.mixtures[segment]
        if segment != self._segment:
            self._segment = segment
            logger.warning("%s: %.1f s after the first verify, mixture %s (mean %.3f tokens per "
                           "verify) (test only)", _configured_by(), elapsed, mixture.describe(),
                           mixture.expected_length)
        return mixture

    def means_for(self, reqs: Sequence) -> np.ndarray:
        """Each request's mean tokens per verify, in the batch's order."""
        mixture = self.mixture_now()
        us = np.fromiter((request_fraction(req) for req in reqs), dtype=np.float64, count=len(reqs))
        classes = np.minimum(np.searchsorted(mixture.cumulative, us, side="right"),
                             len(mixture.means) - 1)
        return np.asarray(mixture.means, dtype=np.float64)[classes]

    def sample_lengths(self, means: np.ndarray, max_len: int) -> np.ndarray:
        if not self._warned_clamp and np.any(means > max_len):
            self._warned_clamp = True
            logger.warning("%s: means above %d (the accept index's width: num_steps + 1) are "
                           "clamped to %d", _configured_by(), max_len, max_len)
        return sample_lengths(means, max_len, self._rng)


_MIX: Optional[AcceptanceMix] = None
_ROW_MEANS: contextvars.ContextVar[Optional[np.ndarray]] = contextvars.ContextVar(
    "sglang_de_test_acceptance_row_means", default=None)
_checked_tp = False


def _configured_by(environ: Mapping[str, str] = os.environ) -> str:
    return next((env for env in (SCHEDULE_ENV, FILE_ENV) if env in environ), MIX_ENV)


def _check_tensor_parallel(mix: AcceptanceMix) -> None:
    global _checked_tp
    if _checked_tp:
        return
    _checked_tp = True
    if (mix.schedule is not None and len(mix.schedule.starts) < 2) or not torch.distributed.is_initialized():
        return
    from sglang.srt.distributed import get_tp_group

    if get_tp_group().world_size > 1:
        raise RuntimeError(f"{_configured_by()} needs tensor parallelism 1 with a schedule or a file: "
                           "each rank keeps its own clock (reads the file at its own step), and ranks "
                           "could disagree on the mixture")


def around_eagle_sample(original, verify_input, batch, *args, **kwargs):
    """AROUND hook of ``eagle_utils.eagle_sample``: keeps the rows' means for the call."""
    mix = _MIX
    if mix is None or batch.forward_mode.is_idle():
        return original(verify_input, batch, *args, **kwargs)
    _check_tensor_parallel(mix)
    reqs = batch.reqs
    if len(reqs) != len(batch.seq_lens):
        raise RuntimeError(f"{_configured_by()}: the verify batch has {len(batch.seq_lens)} rows "
                           f"but {len(reqs)} requests")
    token = _ROW_MEANS.set(mix.means_for(reqs))
    try:
        return original(verify_input, batch, *args, **kwargs)
    finally:
        _ROW_MEANS.reset(token)


_signatures: dict = {}


def around_generate_simulated_accept_index(original, *args, **kwargs):
    """AROUND hook of ``spec_utils.generate_simulated_accept_index``: a length per row inside a
    hooked ``eagle_sample``, sglang's original elsewhere."""
    means = _ROW_MEANS.get()
    if means is None or _MIX is None:
        return original(*args, **kwargs)
    signature = _signatures.get(original)
    if signature is None:
        signature = _signatures[original] = inspect.signature(original)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    call = bound.arguments
    candidates = call["candidates"]
    bs = call["bs"]
    if len(means) != bs:
        raise RuntimeError(f"{_configured_by()}: {len(means)} row means for a verify of {bs} rows")
    width = call["spec_steps"] + 1
    max_len = min(width, candidates.shape[1])
    lengths_host = torch.from_numpy(_MIX.sample_lengths(means, max_len))
    device = call["accept_index"].device
    if device.type == "cuda":
        lengths = lengths_host.pin_memory().to(device, non_blocking=True)
    else:
        lengths = lengths_host.to(device)
    return simulated_accept_index(
        call["accept_index"], call["predict"], call["num_correct_drafts"], candidates,
        call["target_predict"], lengths, width, call["simulate_acc_token_mode"])


HOOKS = (
    (EAGLE_SAMPLE_TARGET, around_eagle_sample),
    (SIMULATED_INDEX_TARGET, around_generate_simulated_accept_index),
)


def register(environ: Optional[Mapping[str, str]] = None,
             clock: Callable[[], float] = time.monotonic) -> None:
    global _MIX
    environ = os.environ if environ is None else environ
    try:
        schedule = schedule_from_env(environ)
        mixture_file = mixture_file_from_env(environ)
        if schedule is None and mixture_file is None:
            return
        configured_by = _configured_by(environ)
        check_simulation_env(environ, configured_by)
    except AcceptanceMixError as error:
        # load_plugins() logs and swallows an Exception from a plugin, and the server would run
        # without the mixture; SystemExit stops the launcher with this one line.
        raise SystemExit(f"error: {error}") from None
    if _MIX is not None:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    _MIX = AcceptanceMix(schedule, clock=clock, mixture_file=mixture_file)
    for target, hook in HOOKS:
        HookRegistry.register(target, hook, HookType.AROUND)
    logger.warning("%s=%s: simulated acceptance differs by request (classes by prompt hash; "
                   "expected %.3f tokens per verify at first; %s=%s is replaced; outputs are not "
                   "the model's; speed benchmarks only) (test only)", configured_by,
                   environ[configured_by], (schedule.mixtures[0] if schedule else mixture_file.mixture).expected_length,
                   SIMULATE_LEN_ENV, environ[SIMULATE_LEN_ENV])
