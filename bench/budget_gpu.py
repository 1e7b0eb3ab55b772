"""The GPU proof of the planner (issue 40 item 7): each case in its own process under a per-process memory limit
(`torch.cuda.set_per_process_memory_fraction`: the caching allocator refuses anything past it, as a smaller card
would), planned under a budget, run, and measured by the allocator (`max_memory_allocated` above the weights and
input) — no out-of-memory, the measured peak within the budget, the time beside the unconstrained pass's.

    python -m turbovae.bench.budget_gpu --out DIR [--budget-s 480] [--only a,b]   # on a GPU, priority order
    python -m turbovae.bench.budget_gpu --out DIR --dry-run                       # CPU, tiny configs, same steps

The results file (DIR/budget-gpu.json) is rewritten after every case, so a call cut short keeps every finished
case; a case that would not finish inside what is left of `--budget-s` is recorded as skipped, never started.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from .cases import BudgetCase, for_section

GB = 2**30
MB = 2**20


SLACK_GB = 1.0  # allocator slack between the pass's budget and the process limit (kernels' workspaces, rounding)
ALLOC_CONF = "expandable_segments:True"  # the children's allocator: no stranded split blocks, as a card running
# ComfyUI (cudaMallocAsync by default) would not strand them either; every row records it


def budget_and_limit(case: BudgetCase, held_bytes: int) -> tuple[Optional[int], Optional[int]]:
    """(the pass's budget, the process limit) in bytes for a case whose process already holds `held_bytes`
    (weights and input): see `BudgetCase` (bench/cases.py). A card too small for what it holds gets a budget of
    0 (the planner's typed error names what would fit)."""
    if case.budget_gb is not None and case.limit_gb is not None:
        raise ValueError(f"{case.key}: give budget_gb or limit_gb, not both")
    slack = int(SLACK_GB * GB)
    if case.budget_gb is not None:
        budget = int(case.budget_gb * GB)
        return budget, budget + held_bytes + slack
    if case.limit_gb is not None:
        limit = int(case.limit_gb * GB)
        return max(0, limit - held_bytes - slack), limit
    return None, None


# The cases (bench/cases.py), in the lease's priority order (`BudgetCase.priority`; families in registry order
# within one priority).
CASES: tuple[BudgetCase, ...] = tuple(sorted(for_section("budget_gpu"), key=lambda c: c.priority))
DRY = {"frames": 9, "height": 64, "width": 96}  # the dry run's size (tiny configs), budgets scaled below
DRY_GB = 4 * MB  # what a GB of a case's budget or limit is in the dry run


def _now() -> float:
    return time.perf_counter()


def run_case(case: BudgetCase, dry: bool) -> dict:
    """One case, in this process: the row it measured."""
    import torch

    from ..vae.memory.allocator import measure_peak
    from ..vae.api import TurboVAE
    from ..vae.memory.budget import BudgetTooSmall
    from ..vae.planning import PassPlan
    from ..vae.registry import family
    from .common import environment
    from .models import seeded_init

    device = torch.device("cpu" if dry else "cuda")
    dtype = torch.float32 if dry else torch.bfloat16
    t0 = _now()
    fam = family(case.family)
    model = seeded_init(fam.build_model(fam.config(real=not dry))).eval().to(device=device, dtype=dtype)
    vae = TurboVAE(model)
    fmt = vae.latent_format
    frames, height, width = (DRY["frames"], DRY["height"], DRY["width"]) if dry else \
        (case.frames, case.height, case.width)
    f = fmt.spatial_factor
    g = torch.Generator().manual_seed(0)
    if case.decode:
        x = torch.randn(1, fmt.channels, fmt.latent_frames(frames), height // f, width // f, generator=g)
    else:
        x = torch.randn(1, fmt.image_channels, frames, height, width, generator=g).clamp_(-1, 1)
    x = x.to(device=device, dtype=dtype)
    held = 0
    if dry:
        budget = None if case.budget_gb is None and case.limit_gb is None else \
            int((case.budget_gb if case.budget_gb is not None else case.limit_gb) * DRY_GB)
        limit = None
        # On a GPU the planner's own memory is host memory, apart from the budget; on the CPU a budgeted plan is
        # made beside what planning grew the process by, and a process's first meta pass imports torch's Dynamo
        # and sympy (some 150 MB, once). A throw-away plan pays that first, so the dry run charges the planner
        # what a GPU run's plan costs it, whichever case a process runs first.
        TurboVAE(model).plan(tuple(x.shape), decode=case.decode)
    else:
        held = torch.cuda.memory_allocated(device)
        budget, limit = budget_and_limit(case, held)
        if limit is not None:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), torch.cuda.current_device())
    row = {"case": case.key, "family": case.family, "decode": case.decode, "shape": list(x.shape),
           "dtype": str(dtype), "limit_gb": None if limit is None else round(limit / GB, 2),
           "budget_gb": None if budget is None else round(budget / GB, 2),
           "held_mb": round(held / MB, 1), "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
           "environment": environment(), "build_s": round(_now() - t0, 1)}
    if case.check == "kinds":
        row["kinds"] = _kinds(vae, x, case.decode, device)
        row["status"] = "done"
        return row
    if case.check == "diffusers":
        row.update(_diffusers(vae, x, device, dtype))
        return row
    t = _now()
    try:
        plan: PassPlan = vae.plan(tuple(x.shape), decode=case.decode, budget_bytes=budget)
    except BudgetTooSmall as e:
        row.update(status="no plan", error=str(e))
        return row
    row.update(plan=plan.describe(), layout=plan.layout(), plan_s=round(_now() - t, 1),
               predicted_mb=plan.predicted.pass_bytes / MB, host_mb=plan.predicted.host_bytes / MB,
               budget_mb=plan.budget_bytes / MB)

    def once():
        with torch.inference_mode():
            return vae.run_decode(x, plan=plan) if case.decode else vae.run_encode(x, plan=plan)

    warm = case.expected_s <= 60 and not dry  # a warm run first where the lease allows it: kernels chosen, compiled
    try:
        if warm:
            t = _now()
            once()
            row["cold_s"] = round(_now() - t, 3)
        t = _now()
        peak, out = measure_peak(once, device)
    except Exception as e:  # noqa: BLE001 - the row records any failure, out-of-memory included
        row.update(status="failed", error=f"{type(e).__name__}: {str(e)[:400]}", seconds=round(_now() - t, 2))
        return row
    row.update(status="done", seconds=round(_now() - t, 3), warm=warm, measured_mb=peak.device_bytes / MB,
               within_budget=peak.device_bytes <= plan.budget_bytes, measured_by=peak.source,
               finite=bool(torch.isfinite(out.float()).all()))
    del out
    return row


def _diffusers(vae, x, device, dtype) -> dict:
    """diffusers' AutoencoderKLWan eager decode of the same weights and latents: warm time and allocator peak."""
    import torch

    from ..vae.memory.allocator import measure_peak
    from ..vae.wan.config import diffusers_kwargs

    try:
        from diffusers import AutoencoderKLWan
    except ImportError as e:
        return {"status": "failed", "error": f"diffusers is not installed ({e}); carry its wheel"}
    ref = AutoencoderKLWan(**diffusers_kwargs(vae.model.config)).eval()
    ref.load_state_dict({k: v.float().cpu() for k, v in vae.model.state_dict().items()})
    ref = ref.to(device=device, dtype=dtype)
    with torch.inference_mode():
        ref.decode(x[:, :, :2]).sample  # warm-up: kernels chosen
        t = _now()
        peak, out = measure_peak(lambda: ref.decode(x).sample, device)
        seconds = _now() - t
    return {"status": "done", "seconds": round(seconds, 3), "measured_mb": peak.device_bytes / MB,
            "layout": "diffusers AutoencoderKLWan eager", "finite": bool(torch.isfinite(out.float()).all())}


def _kinds(vae, x, decode: bool, device) -> list[dict]:
    """Every plan kind the library has at a small size on this device: equal to the untiled pass (PSNR), its
    allocator peak beside its prediction."""
    import torch

    from ..vae.memory.allocator import measure_peak
    from ..vae.planning import PassPlan, predict_plan, run_plan
    from ..vae.measuring import max_abs, psnr

    fmt = vae.latent_format
    hw = (x.shape[-2], x.shape[-1]) if decode else (x.shape[-2] // fmt.spatial_factor, x.shape[-1] // fmt.spatial_factor)
    base = dict(decode=decode, shape=tuple(x.shape), dtype=vae.dtype, device_type=device.type, latent_hw=hw,
                spatial_factor=fmt.spatial_factor)
    kinds = [dict(mode="untiled", temporal_slice=1), dict(mode="untiled", temporal_slice=1, cache_on_host=True,
                                                          output_on_host=True),
             dict(mode="exact", temporal_slice=1, tile_latent=max(8, hw[0] // 2)),
             dict(mode="exact", temporal_slice=1, tile_latent=max(8, hw[0] // 2), output_on_host=True)]
    if vae.model.frame_stages(decode=decode) is not None:
        kinds += [dict(mode="untiled", frame_stages=True), dict(mode="untiled", frame_stages=True, cache_on_host=True),
                  dict(mode="exact", frame_stages=True, tile_latent=max(8, hw[0] // 2), cache_on_host=True,
                       output_on_host=True)]
    if vae.model.exact_plan(decode=decode) is not None and vae.model.frame_stages(decode=decode) is not None:
        # a streamed layer-wise pass (SeedVR2): every activation in host memory, the device holding bands
        streamed = dict(mode="exact", tile_latent=max(8, hw[0] // 2), frames_on_host=True, cache_on_host=True,
                        output_on_host=True)
        kinds += [dict(streamed, temporal_slice=1), dict(streamed, frame_stages=True)]
    with torch.inference_mode():
        ref = vae.model.decode_latents(x) if decode else vae.model.encode_moments(x)
    rows = []
    paths = vae._paths(device)  # noqa: SLF001
    for kind in kinds:
        plan = PassPlan(**base, **kind)
        entry = {"layout": plan.layout()}
        try:
            pred = predict_plan(vae._meta(), plan, paths)  # noqa: SLF001
            with torch.inference_mode():
                run_plan(vae.model, x, plan)  # warm-up: kernels chosen, compiled
                peak, out = measure_peak(lambda: run_plan(vae.model, x, plan), device)
            out = out.to(ref.device)
            entry.update(predicted_mb=pred.pass_bytes / MB, measured_mb=peak.device_bytes / MB,
                         host_mb=pred.host_bytes / MB, max_abs=max_abs(out, ref), psnr_db=psnr(out, ref))
        except Exception as e:  # noqa: BLE001
            entry.update(error=f"{type(e).__name__}: {str(e)[:300]}", trace=traceback.format_exc()[-800:])
        rows.append(entry)
    return rows


def orchestrate(out_dir: Path, budget_s: float, only: Optional[set], dry: bool) -> int:
    """Every case in priority order, each in a fresh process with its own timeout, the results file rewritten after
    each; returns 0."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "budget-gpu.json"
    start = _now()
    results = {"script": "python -m turbovae.bench.budget_gpu", "dry_run": dry, "cases": []}
    for case in CASES:
        if only and case.key not in only:
            continue
        left = budget_s - (_now() - start)
        entry = {"case": case.key, "spec": asdict(case)}
        if left < case.expected_s:
            entry.update(status="skipped", why=f"{left:.0f} s left of the call's budget, the case expects "
                                               f"{case.expected_s:.0f} s")
            results["cases"].append(entry)
            _write(path, results)
            continue
        argv = [sys.executable, "-m", "turbovae.bench.budget_gpu", "--case", case.key] + (["--dry-run"] if dry else [])
        t = _now()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=max(30.0, min(left, 3 * case.expected_s)),
                                  env=dict(os.environ, PYTHONUNBUFFERED="1", PYTORCH_CUDA_ALLOC_CONF=ALLOC_CONF))
            line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
            try:
                entry.update(json.loads(line))
            except ValueError:
                entry.update(status="crashed", returncode=proc.returncode, stderr=proc.stderr[-2000:])
        except subprocess.TimeoutExpired:
            entry.update(status="timed out", seconds=round(_now() - t, 1))
        entry["wall_s"] = round(_now() - t, 1)
        results["cases"].append(entry)
        _write(path, results)
        print(json.dumps({k: entry.get(k) for k in ("case", "status", "layout", "seconds", "measured_mb",
                                                     "predicted_mb", "budget_mb", "within_budget", "error")}),
              flush=True)
    results["complete"] = True
    _write(path, results)
    return 0


def _write(path: Path, payload: dict) -> None:
    from ..trt.fileio import atomic_write_text

    atomic_write_text(path, json.dumps(payload, indent=1, default=str), overwrite=True)


PROOF_TABLE = "budget-gpu"
KINDS_TABLE = "kinds-gpu"
UNRUN_TABLE = "budget-gpu-unrun"  # cases that failed before a plan was made (the harness, not the planner)


def proof_rows(results: dict) -> list[dict]:
    """The rows of a results file for bench/report.py's tables: one per budget or diffusers case (`PROOF_TABLE`),
    one per plan kind of a kinds case (`KINDS_TABLE`); a case that failed before it was planned goes to
    `UNRUN_TABLE` (the docs say which call reran it). Each row keeps its case's environment."""
    rows: list[dict] = []
    for case in results.get("cases", []):
        base = {"case": case["case"], "environment": case.get("environment") or {},
                "dtype": str(case.get("dtype", "")).removeprefix("torch."), "budget_mb": case.get("budget_mb"),
                "limit_gb": case.get("limit_gb"), "status": case.get("status"), "error": case.get("error")}
        if case.get("kinds"):
            rows += [dict(base, table=KINDS_TABLE, **kind) for kind in case["kinds"]]
            continue
        table = UNRUN_TABLE if case.get("status") != "done" and "plan" not in case else PROOF_TABLE
        rows.append(dict(base, table=table, layout=case.get("layout", ""), seconds=case.get("seconds"),
                         predicted_mb=case.get("predicted_mb"), measured_mb=case.get("measured_mb"),
                         host_mb=case.get("host_mb"), within_budget=case.get("within_budget")))
    return rows


def proof_environment(results: dict) -> dict:
    """The machine of a results file: its first measured case's environment, with the dtype it ran in."""
    for case in results.get("cases", []):
        if case.get("environment"):
            return dict(case["environment"], dtype=str(case.get("dtype", "")).removeprefix("torch."))
    return {}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m turbovae.bench.budget_gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="folder of the results file (orchestrator)")
    ap.add_argument("--case", help="run one case in this process and print its row (the orchestrator's child)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="seconds the whole run may take")
    ap.add_argument("--only", default="", help="comma-separated case keys")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny configs, small sizes: the same steps")
    args = ap.parse_args(argv)
    if args.case:
        case = next(c for c in CASES if c.key == args.case)
        try:
            row = run_case(case, args.dry_run)
        except Exception as e:  # noqa: BLE001 - the orchestrator reads one JSON line
            row = {"case": case.key, "status": "failed", "error": f"{type(e).__name__}: {str(e)[:400]}",
                   "trace": traceback.format_exc()[-1500:]}
        print(json.dumps(row, default=str), flush=True)
        return 0
    if args.out is None:
        ap.error("--out is required (or --case)")
    only = {k for k in args.only.split(",") if k} or None
    return orchestrate(args.out, args.budget_s, only, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
