"""Command line: `python -m turbovae bench …`, `decode …` / `encode …` (cli_parallel.py), `doctor` (doctor.py) and
`build-engines …`."""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, Sequence

from .vae.dtypes import DTYPE_NAMES

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
    "held": "held",
    "roofline": "roofline",
    "profile": "profile_layers",
    "bytes": "bytes_roofline",
    "cuts": "byte_cuts",
    "budget": "budget",
}
MAIN_REPEAT, SECTIONS_REPEAT = 2, 3  # timed runs per path when --repeat is not given
# `--full`: the long run (every size and ablation of these sections).
FULL_SECTIONS = ("seedvr2", "qwen")
FULL_DURATION = "tens of minutes on a CPU (README.md gives measured times)"

BENCH_DESCRIPTION = f"""\
Default: a few small cases, each TurboVAE path against its reference on the same weights and input
(Qwen-Image/Wan vs diffusers; SeedVR2 vs our plain path, since the original SeedVR2 code cannot be
installed; exact tiles vs untiled). A progress bar per case, then a table (path, time, speed vs the
reference, peak memory, max error, PSNR), the results JSON (rewritten after every case) and a PNG
chart next to it. Ctrl-C prints the cases measured so far and keeps their JSON.
A few minutes on an idle CPU (README.md gives measured times); on a GPU the cases are larger.

--full: {FULL_DURATION}.
"""


def _bench(args: argparse.Namespace) -> int:
    import torch

    from .bench.common import BenchOptions, environment

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")  # main() checked a given one
    sections = args.sections.split(",") if args.sections else list(FULL_SECTIONS if args.full else ())
    repeat = args.repeat or (SECTIONS_REPEAT if sections else MAIN_REPEAT)
    opts = BenchOptions(device=device, dtype=args.dtype, repeat=repeat, warmup=args.warmup, quick=args.quick,
                        checkpoint={k: v for k, v in (("seedvr2", args.seedvr2_checkpoint),
                                                      ("qwen", args.qwen_checkpoint),
                                                      ("qwen_layered", args.qwen_layered_checkpoint)) if v},
                        cases=tuple(c.strip() for c in (args.cases or "").split(",") if c.strip()),
                        ablation_engines=args.ablation_engines, comfyui=args.comfyui,
                        comfyui_stubs=tuple(n.strip() for n in (args.comfyui_stub or "").split(",") if n.strip()),
                        inject_oom=tuple(args.inject_oom or ()))
    bad_stubs = [n for n in opts.comfyui_stubs if not n.isidentifier()]
    if bad_stubs:
        raise UsageError(f"--comfyui-stub takes top-level package names separated by commas (e.g. av); not {bad_stubs}")
    if opts.comfyui_stubs and not opts.comfyui:
        raise UsageError("--comfyui-stub names packages to stub while importing a --comfyui tree; add --comfyui PATH")
    for name, path in opts.checkpoint.items():
        if not Path(path).exists():
            raise UsageError(f"--{name.replace('_', '-')}-checkpoint {path}: no such file or folder")
    unknown = [s for s in sections if s not in BENCH_SECTIONS]
    if unknown:
        raise UsageError(f"unknown bench section(s) {unknown}; choose from {', '.join(BENCH_SECTIONS)}")
    out = Path(args.out) if args.out else default_results_path()
    env = environment()
    if args.comfyui:
        env["comfyui"] = _comfyui_label(args.comfyui, sections)
    print("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    if sections:
        return _bench_sections(sections, opts, env, out)
    return _bench_main(opts, env, out)


def _comfyui_label(path: str, sections: list[str]) -> str:
    """The row name of the ComfyUI tree `--comfyui` names (checked before any case runs)."""
    from .bench.comfy_core import ComfyUIUnusable, find_tree

    if sections:
        raise UsageError("--comfyui adds rows to the default job; leave out --sections/--full")
    try:
        return find_tree(path).label
    except ComfyUIUnusable as e:
        raise UsageError(str(e)) from None


def default_results_path() -> Path:
    """A new file per run, so an earlier run's results are never replaced silently."""
    from datetime import datetime, timezone

    return Path("bench_results") / f"bench-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}.json"


def _finish(rows: list, env: dict, out: Path, complete: bool, table: Callable[[list], str]) -> None:
    from .bench.common import write_json
    from .bench.report import write_chart

    print("\n" + table(rows), flush=True)
    write_json(rows, out, env, complete=complete)
    chart = out.with_suffix(".png")
    why = write_chart([r.__dict__ | {"speedup": r.speedup} for r in rows], chart)
    print(f"\nwrote {out}" + (f" and {chart}" if why is None else f"; {why}"))


def _bench_main(opts, env: dict, out: Path) -> int:
    """The default job: each case's bar, its rows written as soon as it ends; Ctrl-C keeps what was measured."""
    from .bench import main as job
    from .bench.common import write_json
    from .bench.progress import CaseBar
    from .bench.report import format_text

    table = lambda rows: format_text([r.__dict__ | {"speedup": r.speedup} for r in rows])  # noqa: E731
    if job.needs_reference_package():
        print(job.needs_reference_package(), file=sys.stderr)
    if not opts.comfyui:
        from .bench.comfy_core import ADD_ROWS_HINT

        print(ADD_ROWS_HINT, file=sys.stderr)
    rows: list = []
    cases = job.cases(opts)
    if not cases:
        raise UsageError(f"no case name contains any of {', '.join(opts.cases)}; the cases are: "
                         + "; ".join(c.name for c in job.cases(replace(opts, cases=()))))
    bar: list = []  # the running case's bar

    def start(case) -> None:
        bar[:] = [CaseBar(f"case {cases.index(case) + 1}/{len(cases)}: {case.name}", job.steps_per_case(opts, case))]

    try:
        for case_rows in job.run_cases(opts, start=start, tick=lambda case: bar[0].tick()):
            bar.pop().close()
            rows.extend(case_rows)
            write_json(rows, out, env, complete=False)
    except KeyboardInterrupt:
        if bar:
            bar.pop().close()
        print(f"interrupted: {len({r.case for r in rows})} of {len(cases)} case(s) measured", file=sys.stderr)
        _finish(rows, env, out, False, table)
        return 130
    _finish(rows, env, out, True, table)
    return 0


def _bench_sections(sections: list[str], opts, env: dict, out: Path) -> int:
    """The long sections: each prints its table and the results file is rewritten after each section."""
    from .bench.common import format_table, write_json

    rows: list = []
    try:
        for name in sections:
            module = importlib.import_module(f"{__package__}.bench.{BENCH_SECTIONS[name]}")
            print(f"\n== {name} ==", flush=True)
            section_rows = module.run(opts)
            print(format_table(section_rows), flush=True)
            rows.extend(section_rows)
            write_json(rows, out, env, complete=False)
    except KeyboardInterrupt:
        print(f"\ninterrupted during section {name!r}; keeping the sections before it", file=sys.stderr)
        _finish(rows, env, out, False, format_table)
        return 130
    _finish(rows, env, out, True, format_table)
    return 0


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m turbovae", description=__doc__)
    parser.add_argument("--verbose", action="store_true", help="show the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="compare TurboVAE with the reference implementations: table, JSON and chart",
                       description=BENCH_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--full", action="store_true",
                   help=f"the long run instead: sections {','.join(FULL_SECTIONS)} at several sizes with ablations; "
                        f"{FULL_DURATION}")
    b.add_argument("--sections", help="run these sections instead of the default job (comma list of "
                   f"{', '.join(BENCH_SECTIONS)}; default: none)")
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
    b.set_defaults(func=_bench)

    from . import cli_parallel  # exact decode/encode of files over several devices or torchrun ranks

    for name, decode in (("decode", True), ("encode", False)):
        cli_parallel.add_arguments(sub.add_parser(name, help=f"exact {name} of files, frame split across devices "
                                                             "(torchrun: one rank per GPU)"), decode=decode)

    from . import doctor

    doctor.add_arguments(sub.add_parser("doctor", help="versions, devices, each fast path and its self-check, the "
                                        "conv3d route and a micro-bench: paste it into a bug report",
                                        description=doctor.__doc__))

    p = sub.add_parser("plan", help="the plan a pass would run under a memory budget and its predicted peak, without "
                       "running it (seconds, any machine)",
                       description="Lists the ways the pass can run (untiled, temporal slices, exact or fast tiles, "
                                   "frame stages, host memory), predicts each one's peak by running it on meta tensors "
                                   "(no arithmetic, no memory), and prints the fastest whose peak fits the budget: what "
                                   "runs, its device peak, host memory, weights and input. docs/memory.md gives the "
                                   "prediction's measured error.")
    p.add_argument("source", help="a registered family (e.g. seedvr2, qwen, wan2.1, wan2.2) or a VAE "
                                  "checkpoint file / diffusers folder")
    p.add_argument("--shape", required=True, help="BxCxTxHxW of latents or pixels, any clip length, e.g. "
                                                  "1x16x21x90x160 or 1x3x81x720x1280")
    p.add_argument("--encode", action="store_true", help="plan an encode (default: decode)")
    p.add_argument("--dtype", choices=DTYPE_NAMES, default=None, help="default: bf16 for cuda, fp32 for cpu")
    p.add_argument("--target", choices=("cuda", "cpu"), default="cuda",
                   help="the device type the pass would run on (its default paths; default cuda)")
    p.add_argument("--budget-mb", type=float, default=None,
                   help="memory the pass may use besides weights and input, in MB (default: the stated default "
                        "budget, docs/memory.md)")
    from .vae.planning import MODES as PLAN_MODES

    p.add_argument("--mode", choices=PLAN_MODES, default="auto",
                   help="auto: any exact plan (default); exact: exact tiles; fast: blended tiles (not exact)")
    p.add_argument("--no-host-memory", action="store_true",
                   help="plans that keep caches and output on the device only")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=_plan)

    e = sub.add_parser("build-engines", help="export and build engines for a VAE checkpoint",
                       description="Export a VAE's encoder/decoder and build engines. Defaults: backend auto "
                                   "(TensorRT where it can build, else AOTInductor, which needs only PyTorch), fp16 engines, encoder and decoder, on CUDA "
                                   "when available.")
    try:
        from .trt import cli as trt_cli
    except ImportError:
        trt_cli = None
    if trt_cli is not None:
        trt_cli.add_arguments(e)
        e.set_defaults(func=trt_cli.run)
    else:
        e.set_defaults(func=lambda _a: (print("engine building is not available in this build", file=sys.stderr), 2)[1])
    for command in (b, e):  # also accepted after the command name
        command.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                             help="show the full traceback of an error")
    return parser


def _plan(args: argparse.Namespace) -> int:
    import json

    from .vae.memory_plan import plan_dict, plan_pass

    if args.budget_mb is not None and args.budget_mb <= 0:
        raise UsageError(f"--budget-mb {args.budget_mb}: give a positive number of MB")
    budget = None if args.budget_mb is None else int(args.budget_mb * 2**20)
    plan = plan_pass(args.source, args.shape, decode=not args.encode, dtype=args.dtype, device_type=args.target,
                     budget_bytes=budget, mode=args.mode, host_memory=False if args.no_host_memory else None)
    print(json.dumps(plan_dict(plan)) if args.json else plan.describe())
    return 0


class UsageError(Exception):
    """A mistake in the command line the user can fix; the message says how."""


# Optional packages and how to install them, for a missing-import message that names the fix.
OPTIONAL_PACKAGES = {
    "diffusers": 'pip install -e ".[bench]"',
    "matplotlib": 'pip install -e ".[bench]"',
    "onnx": 'pip install -e ".[onnx]"',
    "onnxscript": 'pip install -e ".[onnx]"',
    "onnxruntime": 'pip install -e ".[onnx]"',
    "tensorrt": "pip install tensorrt (NVIDIA's wheels), or use --backend aoti",
}


def check_device(device: str) -> None:
    """Fail early, in one line, for a device this machine does not have: `resolve_device`'s rule, with the fix
    spelled as a command-line option, and only the CPU or CUDA (what the commands run on)."""
    from .vae.api import DeviceUnavailable, resolve_device

    try:
        dev = resolve_device(device)
    except DeviceUnavailable as e:
        raise UsageError(f"--device {device}: {e} (on the command line: --device cpu)") from None
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {device}: not supported here; use cpu or cuda")


def _user_error_types() -> tuple[type, ...]:
    """Errors that mean the input or the installation needs fixing (not a bug): one message, exit code 2."""
    import torch

    from .trt.interface import EngineError  # an unusable backend (TensorRT missing, wrong GPU): the user's to fix
    from .vae.checkpoint import CheckpointError

    return (UsageError, CheckpointError, ValueError, OSError, ImportError, torch.OutOfMemoryError, EngineError)


def describe_user_error(error: BaseException) -> str:
    """One or two lines: what went wrong and the fix, without terminal colour codes."""
    if isinstance(error, ModuleNotFoundError) and error.name:
        root = error.name.split(".")[0]
        fix = OPTIONAL_PACKAGES.get(root, f"pip install {root}")
        return f"the optional package '{root}' is not installed; install it with: {fix}"
    from .vae.checkpoint import ANSI_ESCAPE

    text = ANSI_ESCAPE.sub("", str(error)).strip() or type(error).__name__
    if isinstance(error, OSError) and error.filename and str(error.filename) not in text:
        text += f": {error.filename}"
    return text


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
        if verbose or not isinstance(error, _user_error_types()):
            raise
        print(f"error: {describe_user_error(error)}", file=sys.stderr)
        print("(add --verbose for the full traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
