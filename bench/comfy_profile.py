"""Where the time goes, per operator type, for one case of the main job: reference, ComfyUI core, TurboVAE.

    python -m turbovae.bench.comfy_profile --comfyui /path/to/ComfyUI --cases "SeedVR2 5-frame decode" [--threads 2]

Why: where TurboVAE is not ahead of core by the issue's target, docs/BENCHMARKS.md says why from a profile of
both sides. Each side of each chosen case runs once to warm up, then once under `torch.profiler` (CPU
activities); the table lists operator types by self CPU time, with call counts, so the sides can be compared
op by op (e.g. how much is convolution, how many convolution calls each side makes).
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

import torch

from . import main as job
from .comfy_core import find_tree, session
from .common import BenchOptions


def profile_table(fn, rows: int) -> str:
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        fn()  # warm-up
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=36)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m turbovae.bench.comfy_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--comfyui", required=True, help="a ComfyUI folder (as for `bench --comfyui`)")
    p.add_argument("--cases", required=True, help="comma list of substrings of the main job's case names")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--rows", type=int, default=12, help="operator types per table (default 12)")
    p.add_argument("--quick", action="store_true", help="the main job's --quick cases (tiny configs)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    opts = BenchOptions(comfyui=args.comfyui, quick=args.quick, cases=tuple(c.strip() for c in args.cases.split(",") if c.strip()))
    chosen = [c for c in job.cases(opts) if job.has_core_side(c)]
    if not chosen:
        print(f"no case name of a family core has a VAE for contains any of {args.cases!r}", file=sys.stderr)
        return 2
    device, dtype = torch.device("cpu"), torch.float32
    g = torch.Generator().manual_seed(0)
    with session(find_tree(args.comfyui), device) as core:
        for case in chosen:
            pair = job.build_pair(case, opts, device, dtype)
            side = core.side(case.family, pair.keep[0], dtype)
            x = pair.input(case, g)
            sides = [(pair.reference_name, lambda: pair.reference(x)), (pair.ours_name, lambda: pair.ours(x))]
            if side is not None:
                core_x = side.prepare(x)
                sides.insert(1, (side.name, lambda: side.run(core_x)))
            for name, fn in sides:
                print(f"\n== {case.name}: {name}", flush=True)
                print(profile_table(fn, args.rows), flush=True)
            del pair, side
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
