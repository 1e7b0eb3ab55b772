"""`python -m turbovae bench`: options -> `BenchOptions`, checked before any case runs; bench/runner.py runs it."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..bench.runner import CHECKPOINT_SECTIONS, FULL_DURATION, FULL_SECTIONS, MAIN_REPEAT, SECTIONS, SECTIONS_REPEAT
from ..vae.dtypes import DTYPE_NAMES
from .errors import UsageError

DESCRIPTION = f"""\
Default: a few small cases, each TurboVAE path against its reference on the same weights and input
(Qwen-Image/Wan vs diffusers; SeedVR2 vs our plain path, since the original SeedVR2 code cannot be
installed; exact tiles vs untiled). A progress bar per case, then a table (path, time, speed vs the
reference, peak memory, max error, PSNR), the results JSON (rewritten after every case) and a PNG
chart next to it. Ctrl-C prints the cases measured so far and keeps their JSON.
A few minutes on an idle CPU (README.md gives measured times); on a GPU the cases are larger.

--full: {FULL_DURATION}.
"""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    b = sub.add_parser("bench", help="compare TurboVAE with the reference implementations: table, JSON and chart",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--full", action="store_true",
                   help=f"the long run instead: sections {','.join(FULL_SECTIONS)} at several sizes with ablations; "
                        f"{FULL_DURATION}")
    b.add_argument("--sections", help="run these sections instead of the default job (comma list of "
                   f"{', '.join(SECTIONS)}; default: none)")
    b.add_argument("--device", help="cpu or cuda (default: cuda when available, else cpu)")
    b.add_argument("--dtype", choices=DTYPE_NAMES, help="default: fp32 on CPU, bf16 on CUDA")
    b.add_argument("--repeat", type=_positive_int, help="timed runs per path; the median is reported (default: "
                   f"{MAIN_REPEAT} for the default job, {SECTIONS_REPEAT} for --full/--sections)")
    b.add_argument("--warmup", type=_count, default=1, help="warm-up runs per path in --sections/--full (default: "
                   "1; the default job always warms up once, measuring peak memory)")
    b.add_argument("--threads", type=_count, default=0, help="torch CPU threads (default: 0 = torch's choice)")
    b.add_argument("--quick", action="store_true", help="smallest sizes only (a smoke run of the same code)")
    b.add_argument("--cases", help="only cases whose name contains one of these comma-separated substrings "
                   "(default job and gpu section; default: all)")
    b.add_argument("--ablation-engines", action="store_true",
                   help="gpu section: end each ablation with engines built for that case (AOTInductor, and "
                        "TensorRT when installed); adds minutes of build time per case (default: off)")
    b.add_argument("--inject-oom", action="append", metavar="CASE_KEY:VARIANT",
                   help="gpu section: that case's variant (a step name, 'fp32 reference' or the diffusers row) fails "
                        "once with a simulated out-of-memory, to exercise the out-of-memory rows (the GPU run's dry "
                        "run uses it; repeatable; default: none)")
    b.add_argument("--seedvr2-checkpoint", "--checkpoint", dest="seedvr2_checkpoint",
                   help="real SeedVR2 VAE file (default: seeded random weights)")
    b.add_argument("--qwen-checkpoint", help="real Qwen-Image/Wan 2.1 VAE file (default: seeded random weights)")
    b.add_argument("--qwen-layered-checkpoint",
                   help="real Qwen-Image-Layered (RGBA) VAE file (default: seeded random weights)")
    b.add_argument("--comfyui", metavar="PATH",
                   help="also time ComfyUI core's own VAEs (imported from this ComfyUI folder, loaded by core's "
                        "loader from the same weights) as a row in every Qwen/Wan/SeedVR2 case, and add the SeedVR2 "
                        "encode cases; run with a Python that has ComfyUI's requirements (default job only)")
    b.add_argument("--comfyui-stub", metavar="PKG,...",
                   help="with --comfyui: packages core's loader imports but a VAE never calls (e.g. av), imported as "
                        "empty stand-ins where this Python lacks them; the core rows' note names them (default: none)")
    b.add_argument("--out", help="results JSON; the chart is written next to it as .png (default: "
                   "bench_results/bench-<UTC date-time>.json, a new file per run)")
    b.set_defaults(func=run)
    return b


def _comma_list(text: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (text or "").split(",") if part.strip())


def _options(args: argparse.Namespace, device: str, sections: list[str]):
    """The `BenchOptions` the options ask for, with each mistake a `UsageError` naming the fix."""
    from ..bench.common import BenchOptions

    checkpoints = ((name, getattr(args, f"{name}_checkpoint")) for name in CHECKPOINT_SECTIONS)
    opts = BenchOptions(device=device, dtype=args.dtype, warmup=args.warmup, quick=args.quick,
                        repeat=args.repeat or (SECTIONS_REPEAT if sections else MAIN_REPEAT),
                        checkpoint={k: v for k, v in checkpoints if v}, cases=_comma_list(args.cases),
                        ablation_engines=args.ablation_engines, comfyui=args.comfyui,
                        comfyui_stubs=_comma_list(args.comfyui_stub), inject_oom=tuple(args.inject_oom or ()))
    bad_stubs = [n for n in opts.comfyui_stubs if not n.isidentifier()]
    if bad_stubs:
        raise UsageError(f"--comfyui-stub takes top-level package names separated by commas (e.g. av); not {bad_stubs}")
    if opts.comfyui_stubs and not opts.comfyui:
        raise UsageError("--comfyui-stub names packages to stub while importing a --comfyui tree; add --comfyui PATH")
    for name, path in opts.checkpoint.items():
        if not Path(path).exists():
            raise UsageError(f"--{name.replace('_', '-')}-checkpoint {path}: no such file or folder")
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise UsageError(f"unknown bench section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    return opts


def _comfyui_label(path: str, sections: list[str]) -> str:
    """The row name of the ComfyUI tree `--comfyui` names (checked before any case runs)."""
    from ..bench.comfy_core import ComfyUIUnusable, find_tree

    if sections:
        raise UsageError("--comfyui adds rows to the default job; leave out --sections/--full")
    try:
        return find_tree(path).label
    except ComfyUIUnusable as e:
        raise UsageError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    import torch

    from ..bench import runner
    from ..bench.common import environment

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")  # main() checked a given one
    sections = args.sections.split(",") if args.sections else list(FULL_SECTIONS if args.full else ())
    opts = _options(args, device, sections)
    out = Path(args.out) if args.out else runner.default_results_path()
    env = environment()
    if args.comfyui:
        env["comfyui"] = _comfyui_label(args.comfyui, sections)
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    if sections:
        return runner.run_sections(sections, opts, env, out)
    return runner.run_default_job(opts, env, out)

