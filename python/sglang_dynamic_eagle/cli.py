"""The `sglang-dynamic-eagle` command: `doctor` (can this machine run EAGLE3_DYNAMIC, with which
flags), `trace FILE` (a decode-step trace summarised, ``observability.trace_summary``), `--version`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from sglang_dynamic_eagle import __version__


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang-dynamic-eagle")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("doctor", help="can this machine run EAGLE3_DYNAMIC, and with which flags?")
    trace = commands.add_parser("trace", help="summarise a decode-step trace (SGLANG_DYNAMIC_EAGLE_TRACE)")
    trace.add_argument("file", help="the trace file (.xz read compressed)")
    trace.add_argument("--windows", type=int, default=1, help="equal time spans to split it into (default 1)")
    trace.add_argument("--span", metavar="A:B", help="only the steps A to B seconds after its first one")
    trace.add_argument("--no-replay", action="store_true", help="skip replaying the policy on it")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from sglang_dynamic_eagle.doctor import doctor

        return doctor()
    from sglang_dynamic_eagle.observability.trace_summary import render

    if not Path(args.file).is_file():
        parser.error(f"trace: no file {args.file!r}; give the SGLANG_DYNAMIC_EAGLE_TRACE file")
    if args.windows < 1:
        parser.error(f"trace: --windows {args.windows}: give 1 or more")
    span = None
    if args.span is not None:
        try:
            span = tuple(float(x) for x in args.span.split(":"))
        except ValueError:
            span = ()
        if len(span) != 2 or not 0 <= span[0] < span[1]:
            parser.error(f"trace: --span {args.span}: give START:END in seconds, 0 <= START < END")
    try:
        print(render(Path(args.file), args.windows, replay=not args.no_replay, span=span), end="")
    except ValueError as error:
        parser.error(f"trace: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
