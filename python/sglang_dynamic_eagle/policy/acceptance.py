"""What a speculative step yields: acceptance lengths (tokens per verify per request, bonus
included), estimated from the verifies the worker reports.

A request's expected acceptance is its own mean over its verifies, shrunk by
``REQUEST_PRIOR_VERIFIES`` pseudo-verifies towards a prior. A request not yet verified takes the
server-wide mean: the recent mean shrunk towards the long-run one (itself shrunk towards the full
acceptance), which follows a change of task mix within steps. A verified request's prior is the
same with its own first verifies taken out of the recent mean (counted twice, an unlucky stretch
would read as its level). The server means average over requests, each weighing the same (only a
request's first ``REQUEST_PRIOR_VERIFIES`` verifies count): over all verifies, a request that
accepts little would weigh by the many steps it runs. Both choices, measured: docs/decisions.md
("Acceptance prior for a new request", "... for a verified request").
"""

from __future__ import annotations

from typing import List, Optional, Sequence

REQUEST_PRIOR_VERIFIES = 4.0  # verifies after which a request's own acceptance weighs as the mean
# The recent acceptance mean forgets by 1 - 1/window per decode step (speculative or not):
# each step verifies the whole batch, so 16 steps hold hundreds of requests' verifies, and a
# change of task mix shows in new requests within a fraction of a second, and in verified ones
# through their prior (the other requests' recent mean) and their own verifies.
ACCEPTANCE_WINDOW_STEPS = 16
# The recent mean is shrunk towards the long-run mean (forgetting over this many verify steps:
# a mostly plain server keeps its evidence), that towards the full acceptance, each by
# REQUEST_PRIOR_VERIFIES pseudo-verifies: one verify of one request (0 or 1 drafts at a mean of
# 1.6) cannot set it. The estimate changes at verifies only, not while plain steps run.
ACCEPTANCE_LONG_RUN_VERIFIES = 1024


def first_verifies(correct_drafts_per_req: Sequence[int], prior_verifies: Sequence[int]) -> list:
    """The accepted drafts of the requests among their first ``REQUEST_PRIOR_VERIFIES`` verifies:
    what the server means take (module docstring)."""
    return [d for d, n in zip(correct_drafts_per_req, prior_verifies) if n < REQUEST_PRIOR_VERIFIES]


class Acceptance:
    """Acceptance lengths (tokens per verify per request, bonus included)."""

    def __init__(self, max_acceptance: float) -> None:
        if not max_acceptance >= 1:
            raise ValueError(f"max_acceptance must be >= 1, got {max_acceptance}")
        self.max_acceptance = float(max_acceptance)
        self._keep_recent = 1.0 - 1.0 / ACCEPTANCE_WINDOW_STEPS  # per decode step
        self._keep_long_run = 1.0 - 1.0 / ACCEPTANCE_LONG_RUN_VERIFIES  # per verify
        self._sums = [[0.0, 0.0], [0.0, 0.0]]  # (tokens, verified requests): recent, long-run
        self._last_step = 0

    @property
    def long_run_mean(self) -> Optional[float]:
        """The long-run mean shrunk towards the full acceptance; None before the first verify."""
        long_run, long_run_n = self._sums[1]
        if long_run_n <= 0:
            return None
        return (long_run + REQUEST_PRIOR_VERIFIES * self.max_acceptance) / (long_run_n + REQUEST_PRIOR_VERIFIES)

    @property
    def server_mean(self) -> Optional[float]:
        """Server-wide mean (each verified request weighs 1 when added): the recent mean shrunk
        towards the long-run one, that towards the full acceptance; None before the first verify."""
        prior = self.long_run_mean
        if prior is None:
            return None
        recent, recent_n = self._sums[0]
        return (recent + REQUEST_PRIOR_VERIFIES * prior) / (recent_n + REQUEST_PRIOR_VERIFIES)

    def _request_means(self, verifies: Sequence[int], accepted: Sequence[int],
                       prior: float) -> List[float]:
        """Each request's expected acceptance: ``prior`` (the server mean) if not yet verified;
        else its own mean shrunk towards the server mean with its own first
        ``REQUEST_PRIOR_VERIFIES`` verifies taken out of the recent sums at its own mean (an upper
        bound of its share: they decay), what is left of the others kept between 1 and the full
        acceptance per verify, the result between 1 and the full acceptance. No min / max calls or
        closure per request (every request, every decode step): 4x faster, the same floats."""
        k, top, long_run = REQUEST_PRIOR_VERIFIES, self.max_acceptance, self.long_run_mean
        recent, recent_n = self._sums[0]
        means = []
        for n, a in zip(verifies, accepted):
            if n <= 0:
                means.append(prior)
                continue
            own = top
            if long_run is not None:
                share = n if n < k else k
                others_n = recent_n - share if recent_n > share else 0.0
                others, cap = recent - share * a / n, top * others_n
                others = others_n if others < others_n else (cap if others > cap else others)
                own = (others + k * long_run) / (others_n + k)
            m = (a + k * own) / (n + k)
            means.append(top if m > top else (1.0 if m < 1.0 else m))
        return means

    def add_verify(self, correct_drafts_per_req: Sequence[int], decode_step: int,
                   prior_verifies: Optional[Sequence[int]] = None) -> None:
        """One verify step's result: accepted drafts per request (the bonus token is added);
        ``prior_verifies``, each request's verifies before this one where known: the server
        means then take only each request's first ``REQUEST_PRIOR_VERIFIES`` (module docstring)."""
        if prior_verifies is not None and len(prior_verifies) == len(correct_drafts_per_req):
            correct_drafts_per_req = first_verifies(correct_drafts_per_req, prior_verifies)
        if not correct_drafts_per_req:
            return
        count = len(correct_drafts_per_req)
        tokens = sum(correct_drafts_per_req) + count
        decays = (self._keep_recent ** max(0, decode_step - self._last_step), self._keep_long_run)
        for sums, decay in zip(self._sums, decays):
            sums[0] = sums[0] * decay + tokens
            sums[1] = sums[1] * decay + count
        self._last_step = decode_step

    def batch_tokens(self, batch_size: int, verifies: Sequence[int], accepted: Sequence[int],
                     remaining: Sequence[int] = (), optimistic: bool = False) -> float:
        """Expected tokens of one speculative step over the batch (module docstring), no more per
        request than the tokens it may still emit; the full acceptance if ``optimistic`` or
        nothing was verified yet."""
        server_mean = None if optimistic else self.server_mean
        prior = self.max_acceptance if server_mean is None else server_mean
        if optimistic or not verifies:
            means = [prior] * batch_size
        else:
            means = self._request_means(verifies[:batch_size], accepted[:batch_size], prior)
            means += [prior] * (batch_size - len(means))
        if remaining and (len(remaining) < len(means) or min(remaining) < max(means, default=0.0)):
            return sum(min(m, max(1, r)) for m, r in zip(means, remaining))
        return sum(means)  # (also where every request may emit at least its mean)
