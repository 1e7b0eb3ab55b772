"""`python -m turbovae plan`: the plan a pass would run under a memory budget (vae/plan_pass.py), without
running it."""

from __future__ import annotations

import argparse

from ..vae.dtypes import DTYPE_NAMES
from ..vae.input_rules import MODES
from .errors import UsageError

DESCRIPTION = ("Lists the ways the pass can run (untiled, temporal slices, exact or fast tiles, frame stages, host "
               "memory), predicts each one's peak by running it on meta tensors (no arithmetic, no memory), and "
               "prints the fastest whose peak fits the budget: what runs, its device peak, host memory, weights and "
               "input. docs/memory.md gives the prediction's measured error.")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("plan", help="the plan a pass would run under a memory budget and its predicted peak, without "
                       "running it (seconds, any machine)", description=DESCRIPTION)
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
    p.add_argument("--host-budget-mb", type=float, default=None,
                   help="host memory (RAM) the pass may keep caches, output and activations in, in MB (default: the "
                        "RAM available now less a margin, docs/memory.md)")
    p.add_argument("--mode", choices=MODES, default="auto",
                   help="auto: any exact plan (default); exact: exact tiles; fast: blended tiles (not exact); the "
                        "planner chooses the tile size")
    p.add_argument("--no-host-memory", action="store_true",
                   help="plans that keep caches and output on the device only")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    import json

    from ..vae.plan_pass import plan_dict, plan_pass

    if args.budget_mb is not None and args.budget_mb <= 0:
        raise UsageError(f"--budget-mb {args.budget_mb}: give a positive number of MB")
    if args.host_budget_mb is not None and args.host_budget_mb <= 0:
        raise UsageError(f"--host-budget-mb {args.host_budget_mb}: give a positive number of MB")
    budget = None if args.budget_mb is None else int(args.budget_mb * 2**20)
    host = None if args.host_budget_mb is None else int(args.host_budget_mb * 2**20)
    plan = plan_pass(args.source, args.shape, decode=not args.encode, dtype=args.dtype, device_type=args.target,
                     budget_bytes=budget, mode=args.mode, host_memory=False if args.no_host_memory else None,
                     host_budget_bytes=host)
    print(json.dumps(plan_dict(plan)) if args.json else plan.describe())
    return 0
