"""Command line: `python -m turbovae bench …`, `plan …`, `decode …` / `encode …`, `doctor` and
`build-engines …`."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .errors import check_device, describe_user_error, user_error_types

# The module of each command (cli/<module>.py) says what the command does; this one builds the parser from them,
# and turns a user's mistake into one line and exit code 2 (cli/errors.py).


def _add_build_engines(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """`build-engines`, or a command that says engine building is missing from this build of the package."""
    try:
        from . import build
    except ImportError:
        e = sub.add_parser("build-engines", help="export and build engines for a VAE checkpoint")
        e.set_defaults(func=lambda _a: (print("engine building is not available in this build", file=sys.stderr),
                                        2)[1])
        return e
    return build.add_parser(sub)


def build_parser() -> argparse.ArgumentParser:
    from . import bench, doctor, parallel, plan

    parser = argparse.ArgumentParser(prog="python -m turbovae", description=__doc__)
    parser.add_argument("--verbose", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)
    bench_parser = bench.add_parser(sub)
    parallel.add_parsers(sub)  # exact decode/encode of files over several devices or torchrun ranks
    doctor.add_parser(sub)
    plan.add_parser(sub)
    engines_parser = _add_build_engines(sub)
    for command in (bench_parser, engines_parser):  # also accepted after the command name
        command.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                             help="show the full traceback of an error")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    verbose = getattr(args, "verbose", False)
    try:
        if getattr(args, "device", None):
            check_device(args.device)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        if verbose or not isinstance(error, user_error_types()):
            raise
        print(f"error: {describe_user_error(error)}", file=sys.stderr)
        print("(add --verbose for the full traceback)", file=sys.stderr)
        return 2

