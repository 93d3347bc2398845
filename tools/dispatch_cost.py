#!/usr/bin/env python3
"""Host time of EAGLE3_DYNAMIC's own work per decode step, on this machine's CPU, over a decode
trace's batches: the worker's view of the batch (``observe``), the policy's decision, the counters
and the results handed back (acceptance records, the policy's verify and step-time feed). sglang's
step itself is not run: what is timed is what the plugin adds to the scheduler thread per step,
the `host_dispatch_ms` a server reports in /server_info.

    python3 tools/dispatch_cost.py test/data/traces/h200-dummy8b-fa3-defaults.jsonl.xz [--repeat 3] [--cuda]

With ``--cuda`` (a CUDA GPU) every step also goes through the worker's timing feed
(``engine.step_costs.TimingFeed``: a CUDA event recorded at the step's end, the completed ones
read), the GPU-side part of the server's ``host_dispatch_ms`` that a CPU-only run leaves out.

Two columns split it as the server does: the view of the batch and the decision, made when the
scheduler chooses the batch (``DynamicEagleWorker.batch_selected``), and the part after that
choice and before sglang's step is launched (the launched step's requests noted). On a backend
whose scheduler waits for the previous verify between the two (flashinfer:
``FutureMap.resolve_seq_lens_cpu``), only the second runs while the GPU has nothing but the previous
step's draft extend left; the rest runs while a step is queued. Servers report the second as
``host_before_launch_ms``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from sglang_dynamic_eagle.engine.observations import PolicyFeed, RequestAcceptance, observe  # noqa: E402
from sglang_dynamic_eagle.observability.counters import ModeCounters  # noqa: E402
from sglang_dynamic_eagle.policy import DecodeMode  # noqa: E402
from sglang_dynamic_eagle.policy.replay import (accepted_drafts_per_request, load_recorded,  # noqa: E402
                                                throughput_policy_for)

RANGES = ((1, 8), (9, 32), (33, 128), (129, 256), (257, 1 << 30))


class Req:
    """The fields of sglang's Req that ``observe`` reads (weakly referenceable, hashed by identity)."""

    def __init__(self, kv: int) -> None:
        self.kv_committed_len = kv
        self.sampling_params = SimpleNamespace(max_new_tokens=512)
        self.output_ids = []


def time_trace(path: Path, cuda: bool = False) -> dict:
    """{(mode, batch range): [(microseconds per step, of them at the batch's choice, after it and
    before the launch)]} of one pass.
    Each step takes the mode the trace ran (its verify results and step times exist for that mode only); the
    policy still decides every step, as on the server. ``cuda``: with the timing feed's events
    (module docstring); the policy still learns the trace's step times."""
    steps, meta = load_recorded(path)
    policy = throughput_policy_for(meta)
    feed, acceptance, counters = PolicyFeed(policy), RequestAcceptance(), ModeCounters()
    timings = None
    if cuda:  # imports torch and sglang: only here
        from sglang_dynamic_eagle.engine.step_costs import TimingFeed
        timings = TimingFeed(list, lambda *sample: None)
    pool = [Req(0) for _ in range(max(s.batch for s in steps))]
    carry, out = 0.0, {}
    for n, s in enumerate(steps, start=1):
        reqs = pool[: s.batch]
        for req in reqs:
            req.kv_committed_len = s.kv_tokens // max(1, s.batch)
        batch = SimpleNamespace(reqs=reqs)
        speculative = s.mode is DecodeMode.SPECULATIVE
        start = time.perf_counter()  # the scheduler chose the batch
        policy.decide(observe(batch, s.queued, acceptance, n, feed.per_request_up_to))
        chosen = time.perf_counter()  # the worker is called
        if speculative:  # before sglang's step, as in the worker
            acceptance.launched(reqs)
        launch = time.perf_counter()
        counters.record_step(s.mode, s.batch, ran_graph=True, step=n)
        # Accepted drafts per request, bonus token excluded (a trace step without a verify: none).
        drafts, carry = accepted_drafts_per_request(s.spec_tokens or s.batch, s.batch, carry) if speculative else (
            [], carry)
        if counters.record_result(drafts) is DecodeMode.SPECULATIVE:
            acceptance.verified(drafts)
            feed.verified(n, drafts)
        feed.step_end(n, 0.0, 0.0)  # its decision logged (before its time, as on a server)
        if s.ms is not None:
            feed.step_time(n, s.mode, s.batch, s.kv_tokens, s.ms)
        if timings is not None:
            timings.step_done(n, s.mode, s.batch, s.kv_tokens)
        key = next(r for r in RANGES if r[0] <= s.batch <= r[1])
        out.setdefault((s.mode.value, key), []).append(
            (1e6 * (time.perf_counter() - start), 1e6 * (chosen - start), 1e6 * (launch - chosen)))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--repeat", type=int, default=3, help="passes; the fastest median per row is shown")
    parser.add_argument("--cuda", action="store_true", help="also the timing feed's CUDA events (needs a CUDA GPU)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: give 1 or more")
    if args.cuda:
        import torch
        if not torch.cuda.is_available():  # checked before any pass
            parser.error("--cuda: no CUDA GPU here; run without --cuda for the CPU-only part")
    passes = [time_trace(args.trace, args.cuda) for _ in range(args.repeat)]
    print(f"Host microseconds per decode step of the plugin's own work{' with CUDA events' if args.cuda else ''}, "
          f"{args.trace.name}, {args.repeat} passes (median of a pass's steps, the fastest pass):\n")
    print("| mode | batch | steps | median us | p99 us | at the batch's choice, median us | "
          "then before the launch, median us |\n| --- | --- | --- | --- | --- | --- | --- |")
    for mode, key in sorted(passes[0]):
        rows = [p[(mode, key)] for p in passes if (mode, key) in p]
        best = min(rows, key=lambda row: statistics.median(t for t, _, _ in row))
        totals = sorted(t for t, _, _ in best)
        p99 = totals[int(0.99 * (len(totals) - 1))]
        label = f">= {key[0]}" if key[1] == 1 << 30 else f"{key[0]}-{key[1]}"
        print(f"| {mode} | {label} | {len(best)} | {statistics.median(totals):.0f} | {p99:.0f} | "
              f"{statistics.median(c for _, c, _ in best):.0f} | "
              f"{statistics.median(b for _, _, b in best):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
