"""Where a plan's time goes, and whether the cost model ranks plans as they measure (issue 48 item 3).

    python -m turbovae bench --sections plan_costs [--quick] [--device cuda]

For one clip of each case, every kind of plan the library runs — untiled whole or in slices, frame stages, caches
in host memory, SeedVR2's layer-wise exact bands with the activations on the device or in host memory (streamed),
with and without frame stages, at two band sizes; Wan's staged exact tiles — is run from the same planner types
(`candidates`), timed (median of `--repeat`), and run once more under the profiler, whose op times are summed by
kind: convolutions, matrix products and attention, norms and statistics, copies (host transfers and band buffers),
other ops, and the time outside ops (Python, dispatch, launches). Beside each: the cost model's estimate, part by
part (`vae/planning/cost.py` `breakdown`), and the two rankings, so a table shows where each plan's time goes and
whether the estimate orders the plans as they measure (the planner takes the cheapest by the estimate). On the CPU
each plan is timed again on PyTorch's own convolution kernels (`pytorch_kernels_ms`): the baseline of the package's
choice of oneDNN for the small 3-D convolutions of bands and tiles (vae/memory/cpu_conv.py `onednn_instead`).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Optional

import torch

from ..vae.api import TurboVAE
from ..vae.dtypes import working_dtype
from ..vae.measuring import max_abs
from ..vae.memory.cpu_conv import pytorch_kernels
from ..vae.planning.meta_pass import MetaPasses
from ..vae.planning import PassPlan, PlanRequest, run_plan
from ..vae.planning.cost import breakdown
from ..vae.planning.predict import predict_plan
from ..vae.planning.search import cache_bytes, candidates, whole_pass_work
from ..vae.measuring import sync
from .common import BenchOptions, BenchRow, time_ms
from .cases import PlanKind, family_cases, for_section
from .models import build_model

SECTION = "plan_costs"
TABLE = "plan-costs"

# op name fragments -> the kind of work the profiler's op time is summed under (first match wins)
OP_KINDS = (
    ("convolutions", ("conv", "mkldnn")),
    ("matmuls and attention", ("mm", "linear", "scaled_dot_product", "attention", "matmul")),
    ("norms and statistics", ("norm", "var_mean", "silu", "rsqrt", "sub", "mul", "add", "div", "sum", "mean",
                              "square", "clamp")),
    ("copies", ("copy", "to", "cat", "clone", "contiguous", "fill", "zero", "pad", "expand")),
)
KINDS = tuple(k for k, _ in OP_KINDS) + ("other ops", "outside ops")


@dataclass
class PlanCostRow(BenchRow):
    """One plan kind of one case: its measured time (`ms`), the estimate (`estimated_ms` and its parts), where the
    profiled run's time went (`measured_parts`: seconds by kind of op, `KINDS`), both ranks among the case's plans,
    and its predicted device and host peaks."""

    table: str = TABLE
    plan: str = ""
    estimated_ms: Optional[float] = None
    estimated_parts: Optional[dict] = None
    measured_parts: Optional[dict] = None
    estimated_rank: Optional[int] = None
    measured_rank: Optional[int] = None
    host_mb: Optional[float] = None
    pytorch_kernels_ms: Optional[float] = None  # CPU: the same plan on PyTorch's own conv kernels (the baseline)


def pick(cands: list[PassPlan], kind: PlanKind) -> Optional[PassPlan]:
    """The candidate of `kind` (its tile the one nearest the asked size), or None."""
    def matches(c: PassPlan) -> bool:
        return (c.mode == kind.mode and c.temporal_slice == kind.temporal_slice and c.frame_stages == kind.frame_stages
                and c.cache_on_host == kind.cache_on_host and c.output_on_host == kind.output_on_host
                and c.frames_on_host == kind.frames_on_host)

    found = [c for c in cands if matches(c)]
    if kind.tile_px is None:
        found = [c for c in found if c.tile_latent is None]
        return found[0] if found else None
    found = [c for c in found if c.tile_latent is not None]
    return min(found, key=lambda c: abs(c.tile_px - kind.tile_px)) if found else None


def profiled_parts(fn, device: torch.device) -> dict:
    """Seconds of one run of `fn` by kind of work (`KINDS`): the profiler's self time of each op summed by
    `OP_KINDS`, and the wall time outside every op."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        fn()
        sync(device)
    wall = time.perf_counter() - t0
    parts = {k: 0.0 for k in KINDS}
    for ev in prof.key_averages():
        name = ev.key.lower().removeprefix("aten::")
        # a GPU's kernels run beside the CPU: their device time is the work, the CPU's op time the launch
        seconds = (ev.self_device_time_total if device.type == "cuda" else ev.self_cpu_time_total) / 1e6
        kind = next((k for k, frags in OP_KINDS if any(f in name for f in frags)), "other ops")
        parts[kind] += seconds
    parts["outside ops"] = max(0.0, wall - sum(parts.values()))
    return {k: round(v, 4) for k, v in parts.items()}


def run(opts: BenchOptions) -> list[BenchRow]:
    device = torch.device(opts.device)
    dtype = working_dtype(opts.dtype, device)
    rows: list[BenchRow] = []
    # each case (bench/cases.py) with the plan kinds its family has (`FamilyCases.plan_kinds`)
    for planned in for_section("plan_costs", quick=opts.quick, cuda=device.type == "cuda"):
        model = build_model(planned.family, opts, opts.quick).to(device=device, dtype=dtype)
        vae = TurboVAE(model)
        fmt = model.latent_format
        _, _, frames, h, w = planned.shape
        case = f"{planned.family} {planned.kind} {fmt.pixel_frames(frames)}f {h * 8}x{w * 8}"
        if opts.cases and not any(c in case for c in opts.cases):
            continue
        rows.extend(_case(vae, case, planned.decode, planned.shape, family_cases(planned.family).plan_kinds,
                          device, dtype, opts))
        del vae, model
        gc.collect()
    return rows


def _case(vae: TurboVAE, case: str, decode: bool, shape: tuple, kinds, device: torch.device, dtype: torch.dtype,
          opts: BenchOptions) -> list[BenchRow]:
    model = vae.model
    paths = vae._paths(device)  # noqa: SLF001 - the paths the VAE itself plans with
    copies: MetaPasses = vae._meta()  # noqa: SLF001
    request = PlanRequest(host_is_separate=True, tile_px=0)  # tile_px 0: every tile size a candidate
    cands = candidates(model, shape, decode=decode, dtype=dtype, device_type=device.type, request=request,
                       host_is_separate=True)
    work = whole_pass_work(model, shape, decode=decode, dtype=dtype, copies=copies)
    held = cache_bytes(model, shape, decode=decode, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
    measured: list[tuple] = []  # (kind, plan, seconds, parts, error, prediction, ms on PyTorch's conv kernels)
    ref = None
    for kind in kinds:
        plan = pick(cands, kind)
        if plan is None:
            continue

        def once(plan=plan):
            with torch.inference_mode():
                return run_plan(model, x, plan)

        ms, out = time_ms(once, device, repeat=opts.repeat)  # after a warm-up: first-call set-up is no plan's time
        baseline_ms = None
        if device.type == "cpu":  # the baseline of the package's own CPU conv choice (vae/memory/cpu_conv.py)
            with pytorch_kernels():
                baseline_ms, _ = time_ms(once, device, repeat=opts.repeat)
        if ref is None:
            ref = out
        err = max_abs(out, ref)
        parts = profiled_parts(once, device)
        pred = predict_plan(copies, plan, paths)
        measured.append((kind, plan, ms / 1e3, parts, err, pred, baseline_ms))
        del out
    estimates = {k.name: breakdown(model, p, work, cache_bytes=held) for k, p, *_ in measured}
    est_order = sorted(measured, key=lambda m: estimates[m[0].name].total_s)
    meas_order = sorted(measured, key=lambda m: m[2])
    rows: list[BenchRow] = []
    base = measured[0][2] if measured else None
    for kind, plan, seconds, parts, err, pred, pytorchs_ms in measured:
        est = estimates[kind.name]
        rows.append(PlanCostRow(
            SECTION, case, kind.name, seconds * 1e3, baseline_ms=base * 1e3 if base else None, max_abs_err=err,
            reference=kind is measured[0][0], plan=plan.layout(), estimated_ms=est.total_s * 1e3,
            estimated_parts={"compute": round(est.compute_s, 4), "tiling": round(est.tiling_s, 4),
                             "launches": round(est.launch_s, 4), "host copies": round(est.host_s, 4)},
            measured_parts=parts, estimated_rank=1 + est_order.index(next(m for m in est_order if m[0] is kind)),
            measured_rank=1 + meas_order.index(next(m for m in meas_order if m[0] is kind)),
            predicted_peak_mb=pred.pass_bytes / 2**20, host_mb=pred.host_bytes / 2**20, pytorch_kernels_ms=pytorchs_ms,
            note=f"median of {max(1, opts.repeat)}; parts from one profiled run"))
    return rows


def rank_agreement(rows: list[dict]) -> Optional[float]:
    """Kendall's tau between the estimated and measured ranks of one case's rows (1: the same order)."""
    pairs = [(r["estimated_rank"], r["measured_rank"]) for r in rows if r.get("estimated_rank")]
    n = len(pairs)
    if n < 2:
        return None
    agree = disagree = 0
    for i in range(n):
        for j in range(i + 1, n):
            s = (pairs[i][0] - pairs[j][0]) * (pairs[i][1] - pairs[j][1])
            agree += s > 0
            disagree += s < 0
    return (agree - disagree) / (n * (n - 1) / 2)
