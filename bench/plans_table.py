"""The plans the planner makes for the issue-40 and issue-48 targets on a GPU, computed on any machine (meta tensors
only), and written as a results file that docs/memory.md's table is rendered from (a test recomputes a row from the
code).

    python -m turbovae.bench.plans_table --out docs/results/DATE-plans-cuda-bf16.json

Every family of the registry, decode and encode, at 1080p × 81 under 6 GB and 720p × 81 under 4 GB (what an 8 GB
card can spare after the weights and ComfyUI's reserve, and a 6 GB card), the untiled pass at the default budget,
and the sizes upscalers use (4K and 16 MP images, 1440p and 4K clips in 6 GB, 1080p × 81 in 4 GB): the plan taken
(or, when none fits, the smallest budget that works), its predicted device peak, the memory it holds in host
memory (within the row's host budget, the RAM a machine for that job has), the expected time by the cost model,
and how long planning took: in a fresh process per row (the first plan of a process, torch's meta machinery
imported by it), as `python -m turbovae plan` at the shell (start-up included), and as the first plan of its shape
in a warm process (every row in one process, after a small plan of each family). CUDA bf16 paths as
`python -m turbovae plan` takes them.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..vae.memory.budget import DEFAULT_PASS_BUDGET_BYTES, BudgetTooSmall
from ..vae.plan_pass import plan_dict, plan_pass
from ..vae.registry import families, family

TABLE = "plans"
GB = 2**30


@dataclass(frozen=True)
class Target:
    """A clip of `frames` pixel frames of `height`×`width` (rounded up to the family's spatial factor, as a
    pipeline pads) under `budget_gb` on the device (None: the default budget) and `host_gb` of host memory."""

    name: str
    frames: int
    height: int
    width: int
    budget_gb: Optional[float]
    host_gb: float = 24.0  # a 32 GB machine less its margin


TARGETS = (Target("1080p×81, 6 GB", 81, 1080, 1920, 6), Target("720p×81, 4 GB", 81, 720, 1280, 4),
           Target("720p×81, default budget", 81, 720, 1280, None),
           # issue 48: the sizes upscalers use; clips keep their whole-frame causal caches in host memory
           Target("3840×2160 image, 6 GB", 1, 2160, 3840, 6), Target("4096×4096 image, 6 GB", 1, 4096, 4096, 6),
           Target("1080p×81, 4 GB", 81, 1080, 1920, 4),
           Target("2560×1440×81, 6 GB, 64 GB RAM", 81, 1440, 2560, 6, host_gb=56),
           Target("3840×2160×81, 6 GB, 128 GB RAM", 81, 2160, 3840, 6, host_gb=112))


def pixel_shape(key: str, target: Target) -> tuple[int, ...]:
    """The clip's pixels for a family: height and width rounded to its spatial factor (Wan 2.2's 16: 1088 × 1920)."""
    f = family(key).meta_model().latent_format.spatial_factor
    h = -(-target.height // f) * f
    w = -(-target.width // f) * f
    return (1, 3, target.frames, h, w)


def budget_bytes(target: Target) -> int:
    """The row's device budget: `budget_gb`, or the default budget."""
    return int(target.budget_gb * GB) if target.budget_gb is not None else DEFAULT_PASS_BUDGET_BYTES


def row_for(key: str, decode: bool, target: Target) -> dict:
    """One plan of the table, computed now."""
    shape = pixel_shape(key, target)
    budget = budget_bytes(target)
    t = time.perf_counter()
    row = {"section": "plans", "table": TABLE, "case": f"{key} {'decode' if decode else 'encode'}",
           "variant": target.name, "pixels": list(shape), "budget_mb": round(budget / 2**20, 1),
           "host_budget_mb": round(target.host_gb * GB / 2**20, 1), "ms": 0.0}
    try:
        plan = plan_pass(key, shape, decode=decode, dtype="bf16", device_type="cuda", budget_bytes=budget,
                         host_budget_bytes=int(target.host_gb * GB))
    except BudgetTooSmall as e:
        row.update(fits=False, plan="none fits",
                   floor_mb=float(math.ceil(e.need_bytes / 2**20)) if e.need_bytes is not None else None,
                   floor_host_mb=float(math.ceil(e.need_host_bytes / 2**20)) if e.need_host_bytes else None,
                   floor_plan=e.floor or "")
    else:
        d = plan_dict(plan)
        row.update(fits=True, plan=d["layout"], exact=d["exact"], pass_mb=d["pass_mb"], host_mb=d["host_mb"],
                   weights_mb=d["weights_mb"], expected_s=d["expected_s"])
    row["plan_s"] = round(time.perf_counter() - t, 1)
    return row


def compute() -> list[dict]:
    """Every row, each planned in a fresh process (the first plan of a process: what a user waits for), with the
    time `python -m turbovae plan` takes for it (`command_seconds`) and the time the same plan takes in a warm
    process (`warm_times`)."""
    rows = [fresh_row(key, decode, target) for key, decode, target in row_keys()]
    for row, (key, decode, target) in zip(rows, row_keys()):
        row["plan_command_s"] = command_seconds(key, decode, target)
    for row, seconds in zip(rows, warm_times()):
        row["plan_warm_s"] = seconds
    return rows


def command_args(key: str, decode: bool, target: Target) -> list[str]:
    """The row as `python -m turbovae plan` arguments: its family, pixels, budget and host budget."""
    return ["plan", key, "--shape", "x".join(map(str, pixel_shape(key, target))), "--budget-mb",
            str(budget_bytes(target) // 2**20), "--host-budget-mb", str(int(target.host_gb * 1024)),
            *([] if decode else ["--encode"])]


def command_seconds(key: str, decode: bool, target: Target) -> float:
    """Wall-clock seconds of `python -m turbovae plan` for the row in a fresh process: what a user waits for at
    the shell, the interpreter's start-up and `import torch` included. The command prints the plan (exit 0) or
    the smallest budget that works (exit 2)."""
    import subprocess
    import sys

    args = command_args(key, decode, target)
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "turbovae", *args], capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - t
    if done.returncode not in (0, 2):
        raise RuntimeError(f"python -m turbovae {' '.join(args)}: {done.stderr[-2000:]}")
    return round(seconds, 2)


def row_keys() -> list[tuple[str, bool, Target]]:
    """(family key, decode, target) of every row, in the table's order (`compute` and `warm_times_here` both)."""
    return [(fam.key, decode, target) for fam in families() for decode in (True, False) for target in TARGETS]


WARM_UP_PIXELS = (1, 3, 1, 64, 64)  # one small image plan per family first: imports and meta copies made


def warm_times() -> list[float]:
    """Seconds each row's plan takes as the first plan of its shape in a warm process (what a ComfyUI server pays
    for a new shape): every row in one process of its own, after a small image plan of each family, in `compute`'s
    order."""
    import subprocess
    import sys

    code = ("import json; from turbovae.bench import plans_table as p; "
            "print(json.dumps(p.warm_times_here()))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"warm planning times: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def warm_times_here() -> list[float]:
    """`warm_times` in this process."""
    for fam in families():
        plan_pass(fam.key, WARM_UP_PIXELS, decode=True, dtype="bf16", device_type="cuda", budget_bytes=6 * GB,
                  host_budget_bytes=24 * GB)
    return [row_for(key, decode, target)["plan_s"] for key, decode, target in row_keys()]


def fresh_row(key: str, decode: bool, target: Target) -> dict:
    """`row_for` in a process of its own."""
    import subprocess
    import sys

    code = ("import json; from turbovae.bench import plans_table as p; "
            f"t = next(t for t in p.TARGETS if t.name == {target.name!r}); "
            f"print(json.dumps(p.row_for({key!r}, {decode!r}, t)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{key} {target.name}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m turbovae.bench.plans_table", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="the results file to write (a new one)")
    args = ap.parse_args(argv)
    from ..trt.fileio import atomic_write_text
    from .common import environment

    rows = compute()
    atomic_write_text(args.out, json.dumps({"environment": environment(), "complete": True, "rows": rows},
                                           indent=1))
    print(f"wrote {args.out} ({len(rows)} plans)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
