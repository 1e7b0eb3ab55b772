"""`python -m turbovae doctor [--json]`: what this install has, and whether its fast paths run right here.

What a user pastes into a bug report, and the first step of the GPU lease run (scripts/gpu_run.sh): the
versions of everything TurboVAE may use, the devices with their free memory, each GPU fast path — available
or why not, and its self-check result on the default device (vae/accel/self_checks runs the checks by calling each
path the way a pass does) —, the conv3d route chosen for half precision, and a micro-benchmark per
architecture (decode and encode on the default device and dtype, with the error against fp32). Seeded
random weights: no checkpoint is needed. The JSON fields are documented in docs/gpu.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..vae import doctor  # the report; nothing here imports bench/ (tests/test_import_graph.py)

HELP = ("versions, devices, each fast path and its self-check, the conv3d route and a micro-bench: paste it into a "
        "bug report")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("doctor", help=HELP, description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the report as JSON (fields: docs/gpu.md)")
    parser.add_argument("--out", help="also write the JSON report to this file, which must not exist (default: none)")
    parser.add_argument("--device", help="the device to check and bench (default: cuda when available, else cpu)")
    parser.add_argument("--no-bench", action="store_true", help="skip the micro-benchmark")
    seconds = doctor.BENCH_SECONDS
    parser.add_argument("--bench-seconds", type=float, help="the micro-benchmark's time budget (default: "
                        f"{seconds['cuda']:.0f} s on a GPU, {seconds['cpu']:.0f} s on the CPU)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    import json

    from .. import __version__
    from ..trt.fileio import atomic_write_text

    report = doctor.collect(__version__, args.device, bench=not args.no_bench, budget_s=args.bench_seconds)
    text = json.dumps(report, indent=2)
    if args.out:
        atomic_write_text(Path(args.out), text + "\n")
    print(text if args.json else doctor.format_text(report), flush=True)
    return 0
