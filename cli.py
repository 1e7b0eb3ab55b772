"""Command line: `python -m turbovae bench …`, `decode …` / `encode …` (cli_parallel.py) and `build-engines …`."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Optional, Sequence

# Section name -> module under turbovae.bench exposing `run(BenchOptions) -> list[BenchRow]`.
BENCH_SECTIONS = {
    "seedvr2": "seedvr2",
    "qwen": "qwen",
    "qwen_layered": "qwen_layered",
    "tiling": "tiling",
    "engines": "engines",
    "gpu": "gpu",
    "slices": "slices",
    "parallel": "parallel",
}
DEFAULT_SECTIONS = ("seedvr2", "qwen")


def _bench(args: argparse.Namespace) -> int:
    import torch

    from .bench.common import BenchOptions, environment, format_table, write_json

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    opts = BenchOptions(device=device, dtype=args.dtype, repeat=args.repeat, warmup=args.warmup, quick=args.quick,
                        checkpoint={k: v for k, v in (("seedvr2", args.seedvr2_checkpoint),
                                                      ("qwen", args.qwen_checkpoint),
                                                      ("qwen_layered", args.qwen_layered_checkpoint)) if v},
                        cases=tuple(c.strip() for c in (args.cases or "").split(",") if c.strip()),
                        ablation_engines=args.ablation_engines)
    sections = args.sections.split(",") if args.sections else list(DEFAULT_SECTIONS)
    unknown = [s for s in sections if s not in BENCH_SECTIONS]
    if unknown:
        print(f"unknown bench section(s) {unknown}; choose from {', '.join(BENCH_SECTIONS)}", file=sys.stderr)
        return 2
    env = environment()
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    rows = []
    for name in sections:
        module = importlib.import_module(f"{__package__}.bench.{BENCH_SECTIONS[name]}")
        print(f"\n== {name} ==", flush=True)
        section_rows = module.run(opts)
        print(format_table(section_rows), flush=True)
        rows.extend(section_rows)
    print("\n== all ==\n" + format_table(rows))
    out = Path(args.out)
    write_json(rows, out)
    print(f"\nwrote {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m turbovae", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="time reference vs optimised paths and write a table + JSON")
    b.add_argument("--sections", help=f"comma list of {', '.join(BENCH_SECTIONS)} (default: {','.join(DEFAULT_SECTIONS)})")
    b.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    b.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], help="default: fp32 on CPU, bf16 on CUDA")
    b.add_argument("--repeat", type=int, default=3)
    b.add_argument("--warmup", type=int, default=1)
    b.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    b.add_argument("--quick", action="store_true", help="smallest sizes only")
    b.add_argument("--cases", help="gpu section: comma list of substrings; only cases whose name contains one run")
    b.add_argument("--ablation-engines", action="store_true",
                   help="gpu section: end each ablation with engines built for that case (AOTInductor, and "
                        "TensorRT when installed); adds minutes of build time per case")
    b.add_argument("--seedvr2-checkpoint", "--checkpoint", dest="seedvr2_checkpoint",
                   help="real SeedVR2 VAE file (default: random weights)")
    b.add_argument("--qwen-checkpoint", help="real Qwen-Image/Wan 2.1 VAE file (default: random weights)")
    b.add_argument("--qwen-layered-checkpoint",
                   help="real Qwen-Image-Layered (RGBA) VAE file (default: random weights)")
    b.add_argument("--out", default="bench_results/bench.json")
    b.set_defaults(func=_bench)

    from . import cli_parallel  # exact decode/encode of files over several devices or torchrun ranks

    for name, decode in (("decode", True), ("encode", False)):
        cli_parallel.add_arguments(sub.add_parser(name, help=f"exact {name} of files, frame split across devices "
                                                             "(torchrun: one rank per GPU)"), decode=decode)

    e = sub.add_parser("build-engines", help="export and build engines for a VAE checkpoint")
    try:
        from .trt import cli as trt_cli
    except ImportError:
        trt_cli = None
    if trt_cli is not None:
        trt_cli.add_arguments(e)
        e.set_defaults(func=trt_cli.run)
    else:
        e.set_defaults(func=lambda _a: (print("engine building is not available in this build", file=sys.stderr), 2)[1])
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
