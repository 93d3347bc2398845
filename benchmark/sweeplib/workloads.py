"""Named workloads (benchmark/README.md): what sglang.bench_serving sends, as runs ("segments") and idle
gaps. Mixed lengths: `--random-range-ratio` 0.25, lengths uniform in [0.25 x max, max]. bench_serving
0.5.17 has neither on/off nor gamma arrivals: bursts and the load step are runs one after another."""

from __future__ import annotations

import math
from dataclasses import dataclass

MIXED = dict(input_len=1024, output_len=512, range_ratio=0.25)
LONG_CONCURRENCIES = (1, 8, 32)
SHARED_GROUPS = 8  # shared-R: system prompts, each shared by an eighth of the requests
SEGMENT_OVERHEAD_S = 8.0  # bench_serving's warm-up request, flush and pause, and the last requests' drain


@dataclass(frozen=True)
class Segment:
    """One bench_serving run (``prompts`` > 0), then ``idle_s`` without requests."""

    input_len: int = 0
    output_len: int = 0
    prompts: int = 0
    rate: float = math.inf  # --request-rate: Poisson arrivals; inf sends every request at once
    concurrency: int | None = None  # --max-concurrency
    range_ratio: float = 1.0  # --random-range-ratio
    idle_s: float = 0.0
    groups: int = 0  # > 0: bench_serving's generated-shared-prefix dataset, input_len its question length
    prefix_len: int = 0  # with groups: each group's system prompt (at most), shared by its requests

    def expected_s(self) -> float:
        """A rough duration, for deciding whether a time budget still holds the segment."""
        sending = self.prompts / self.rate if self.prompts and math.isfinite(self.rate) else 0.0
        return sending + (SEGMENT_OVERHEAD_S if self.prompts else 0.0) + self.idle_s


@dataclass(frozen=True)
class Workload:
    name: str
    segments: tuple[Segment, ...]
    acceptance: str | None = None  # NAME~MIX: simulated acceptance for this workload (test plugin syntax)

    def expected_s(self) -> float:
        return sum(segment.expected_s() for segment in self.segments)


@dataclass(frozen=True)
class Options:
    traffic_s: float = 20.0  # seconds of arrivals of poisson-R
    idle_s: float = 5.0  # gaps of burst and load-step
    waves: int = 2  # closed-C: max(min_prompts, waves x C) prompts
    min_prompts: int = 16  # 4 made 2-4 s runs at 1-4 requests; a server's throughput moved up to 11% between them (H100)


def _number(text: str, name: str, kind=int):
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"workload {name!r}: {text!r} is not a number") from None
    if not 0 < value < math.inf:
        raise ValueError(f"workload {name!r}: {text!r} must be positive")
    return value


def acceptance_mixture(text: str, source: str) -> str:
    """``MEAN[:WEIGHT]`` or ``MEAN:WEIGHT/MEAN:WEIGHT...`` as the test plugin's ``MEAN:WEIGHT,...``, checked."""
    classes = [term.split(":") for term in text.split("/")]
    try:
        means = [float(c[0]) for c in classes]
        weights = [float(c[1]) if len(c) == 2 else 1.0 for c in classes]
        shape = all(len(c) == 2 for c in classes) if len(classes) > 1 else len(classes[0]) <= 2
    except ValueError:
        shape = False
    if not shape or min(means) < 1 or abs(sum(weights) - 1) > 0.01:
        raise ValueError(f"{source}: acceptance {text!r} is not MEAN (>= 1) or MEAN:WEIGHT/MEAN:WEIGHT... "
                         "(classes separated by '/', weights summing to 1)")
    return ",".join(":".join(c) for c in classes)


def workload(name: str, options: Options = Options()) -> list[Workload]:
    """The workload(s) a name stands for (``long-context`` is three); ``NAME~MIX`` runs NAME with the
    simulated acceptance MIX (each result keeps the whole name)."""
    if "~" in name:
        base, _, mix = name.partition("~")
        acceptance = acceptance_mixture(mix, f"workload {name!r}")
        return [Workload(f"{w.name}~{mix}", w.segments, acceptance) for w in workload(base, options)]
    kind, _, parameter = name.partition("-")
    if name == "long-context":
        return [w for c in LONG_CONCURRENCIES for w in workload(f"long-{c}", options)]
    if kind == "closed" and parameter:
        concurrency, _, lengths = parameter.partition("@")
        input_text, _, output_text = (lengths or "512x256").partition("x")
        c, input_len, output_len = (_number(text, name) for text in (concurrency, input_text, output_text))
        segments = (Segment(input_len, output_len, max(options.min_prompts, options.waves * c), concurrency=c),)
    elif kind in ("poisson", "shared") and parameter:
        rate_text, _, seconds = parameter.partition("@")
        rate = _number(rate_text, name, float)
        prompts = max(8, round(rate * (_number(seconds, name, float) if seconds else options.traffic_s)))
        segments = ((Segment(**MIXED, prompts=prompts, rate=rate),) if kind == "poisson" else
                    (Segment(256, 512, SHARED_GROUPS * math.ceil(prompts / SHARED_GROUPS), rate, range_ratio=0.25,
                             groups=SHARED_GROUPS, prefix_len=2048),))
    elif kind == "burst":
        size = _number(parameter, name) if parameter else 64
        segments = tuple(Segment(**MIXED, prompts=size, idle_s=options.idle_s * (i < 2)) for i in range(3))
    elif name == "load-step":
        segments = (Segment(**MIXED, prompts=30, rate=2.0), Segment(512, 256, 256, concurrency=128),
                    Segment(idle_s=options.idle_s))
    elif kind == "long" and parameter:
        c = _number(parameter, name)
        segments = (Segment(8192, 256, max(4, min(2 * c, 32)), concurrency=c),)
    elif name == "warmup":
        segments = (Segment(1024, 64, 32, concurrency=32, range_ratio=0.25),)
    else:
        raise ValueError(f"unknown workload {name!r}; known: closed-C[@INxOUT], poisson-R[@S], shared-R[@S], "
                         "burst[-N], load-step, long-C, long-context, warmup, each optionally ~MIX")
    return [Workload(name, segments)]


def parse_workloads(texts: list[str], options: Options = Options()) -> list[Workload]:
    """Comma-separated names, from repeated flags, in order; a name given twice is refused."""
    found = [w for text in texts for name in text.split(",") if name.strip() for w in workload(name.strip(), options)]
    names = [w.name for w in found]
    if len(set(names)) < len(names):
        raise ValueError(f"workload listed twice: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    return found

