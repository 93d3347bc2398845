"""The automatic policy replayed on every load of the committed decode-step traces
(``test/data/traces/``, each load costed by its whole trace's fit, as the replay tests do), with
the exploration budget at each share given: how far below the oracle's mode choices it comes,
per load, then the mean and the worst. With ``--whole``, each trace replays as its server ran
it: one policy over all its loads in order, so what the policy carries from one load into the
next (its exploration budget, its fits, its acceptance means) counts. ``--feedback-lag`` and
``--feed-every`` set when step times reach the policy: by default 16 steps late, each step (the
tests' form); a server hands over steps [s - 16, s - 8) at every eighth step s, which is
``--feedback-lag 8 --feed-every 8``. ``--draft-prefills N`` (64, the tests' number) gives the
policy the trace's first N draft prefills before each load, as a server's policy has them (the
catch-up's per-token bound; 0: none). CPU only.

    python3 tools/replay_fixtures.py --shares 0.01,0.02,0.04 [--whole] [--feedback-lag 8 --feed-every 8] [--draft-prefills 0]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional, Sequence

from sglang_dynamic_eagle.policy import throughput
from sglang_dynamic_eagle.policy.replay import (FEEDBACK_LAG_STEPS, load_recorded, oracle_rate,
                                                read_trace_text, recorded_world, simulate,
                                                throughput_policy_for)

TRACES = Path(__file__).resolve().parents[1] / "test" / "data" / "traces"
WINDOW = 256  # the server's catch-up window


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shares", default=str(throughput.EXPLORATION_SHARE),
                        help="exploration shares of decode time, comma-separated")
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--whole", action="store_true", help="one load per trace: all its loads in order")
    parser.add_argument("--feedback-lag", type=int, default=FEEDBACK_LAG_STEPS, help="steps before a time reaches it")
    parser.add_argument("--feed-every", type=int, default=1, help="steps between feeds of step times to the policy")
    parser.add_argument("--draft-prefills", type=int, default=64,
                        help="feed the policy the trace's first N draft prefills before each load, "
                        "as the replay tests do (the catch-up's per-token bound; traces recorded "
                        "before 2026-12-05 hold none)")
    args = parser.parse_args(argv)
    shares = [float(x) for x in args.shares.split(",")]
    loads = []
    for path in sorted(args.traces.glob("*.jsonl.xz")):
        steps, meta = load_recorded(path)
        world = recorded_world(steps, meta)
        parts = sorted((first, end, name) for name, (first, end) in meta.get("segments", {}).items())
        if args.whole and parts:
            parts = [(parts[0][0], parts[-1][1], "all")]
        prefills = [json.loads(line) for line in read_trace_text(path).splitlines()
                    if '"k":"prefill"' in line][: args.draft_prefills]
        loads += [(f"{path.name.split('.jsonl')[0]}:{name}", meta, world.part(first, end), prefills)
                  for first, end, name in parts]
    if not loads:
        parser.error(f"no loads in {args.traces}: a trace needs a sidecar <name>.json with 'segments'")
    print("| load | " + " | ".join(f"share {s:g}" for s in shares) + " |")
    print("|" + " --- |" * (len(shares) + 1))
    regrets = {s: [] for s in shares}
    for name, meta, world, prefills in loads:
        best = oracle_rate(world, WINDOW)
        for share in shares:
            policy = throughput_policy_for({**meta, "exploration_share": share})
            for prefill in prefills:
                policy.add_draft_prefill(prefill["tokens"], prefill["draft_ms"])
            rate = simulate(policy, world, WINDOW, feedback_lag=args.feedback_lag, feed_every=args.feed_every).rate
            regrets[share].append(1.0 - rate / best)
        print(f"| {name} | " + " | ".join(f"{100 * regrets[s][-1]:.2f}%" for s in shares) + " |")
    print(f"| mean of {len(loads)} | " + " | ".join(f"{100 * sum(r) / len(r):.2f}%" for r in regrets.values()) + " |")
    print("| worst | " + " | ".join(f"{100 * max(r):.2f}%" for r in regrets.values()) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
