"""The cost of fitting (issue 40 item 3): per family and direction, the plan the planner takes at budgets from
unlimited down to the floor, its time, its allocator-measured device peak and its predicted peak, in one run.

    python -m turbovae bench --sections budget [--quick] [--device cuda]

Each budget is a fraction of the untiled pass's predicted peak (1, 1/2, 1/4, …) until no plan fits (a last row
names the floor the planner reports). On the CPU, host memory is the budgeted memory, so plans are made as for a
device with host memory apart (`host_is_separate`): the chart then shows the same plans a GPU would take, and the
allocator (profiler allocation events) counts the device side alone, host-held tensors living in numpy's memory.
Cases come from the family registry: every family, both directions, one size in pixels for all (latent sizes
follow each family's factors). `budget_chart` draws time and peak against budget (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import gc
import io
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..trt.fileio import atomic_write_bytes
from ..vae.memory.allocator import measure_peak
from ..vae.api import TurboVAE
from ..vae.dtypes import working_dtype
from ..vae.memory.budget import BudgetTooSmall
from ..vae.planning import PlanRequest, fastest_fitting_plan, run_plan
from ..vae.registry import families
from .common import BenchOptions, BenchRow
from ..vae.measuring import max_abs, psnr
from .models import build_model

SECTION = "budget"
TABLE = "budget"
FRACTIONS = (1.0, 1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64)  # of the untiled pass's predicted peak
MB = 2**20


@dataclass
class BudgetRow(BenchRow):
    """One budget of one case: the plan it took (`plan`), what the pass was allowed (`budget_mb`), held in host
    memory (`host_mb`), measured (`peak_mb`, the allocator) and predicted (`predicted_peak_mb`) on the device."""

    table: str = TABLE
    plan: str = ""
    budget_mb: Optional[float] = None
    host_mb: Optional[float] = None
    shape: tuple = ()


@dataclass(frozen=True)
class Size:
    """One case size for every family: pixel frames and frame size (a family's latents follow its factors)."""

    frames: int
    height: int
    width: int


SIZES = {"quick": Size(9, 128, 192), "cpu": Size(9, 256, 384), "cuda": Size(81, 720, 1280)}


def case_input(model, decode: bool, size: Size, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    fmt = model.latent_format
    f = fmt.spatial_factor
    g = torch.Generator().manual_seed(0)
    if decode:
        x = torch.randn(1, fmt.channels, fmt.latent_frames(size.frames), size.height // f, size.width // f,
                        generator=g)
    else:
        x = torch.randn(1, fmt.image_channels, size.frames, size.height, size.width, generator=g).clamp_(-1, 1)
    return x.to(device=device, dtype=dtype)


def run(opts: BenchOptions) -> list[BenchRow]:
    device = torch.device(opts.device)
    dtype = working_dtype(opts.dtype, device)
    size = SIZES["quick" if opts.quick else device.type if device.type in SIZES else "cpu"]
    rows: list[BenchRow] = []
    for fam in families():
        model = build_model(fam.key, opts, opts.quick).to(device=device, dtype=dtype)
        vae = TurboVAE(model)
        for decode in (True, False):
            case = f"{fam.key} {'decode' if decode else 'encode'} {size.frames}f {size.height}x{size.width}"
            if opts.cases and not any(c in case for c in opts.cases):
                continue
            rows.extend(_case(vae, case, decode, size, device, dtype, opts))
        del vae, model
        gc.collect()
    return rows


def _case(vae: TurboVAE, case: str, decode: bool, size: Size, device: torch.device, dtype: torch.dtype,
          opts: BenchOptions) -> list[BenchRow]:
    x = case_input(vae.model, decode, size, device, dtype)
    request = PlanRequest(host_is_separate=True)
    paths = vae._paths(device)  # noqa: SLF001 - the paths the VAE itself plans with
    rows: list[BenchRow] = []
    ref = None
    base_ms = None
    untiled_bytes = None
    for frac in FRACTIONS:
        budget = 2**50 if untiled_bytes is None else max(1, int(untiled_bytes * frac))
        try:
            plan = fastest_fitting_plan(vae.model, tuple(x.shape), decode=decode, budget_bytes=budget, paths=paths,
                                        dtype=dtype, request=request, copies=vae._meta())  # noqa: SLF001
        except BudgetTooSmall as e:
            rows.append(BudgetRow(SECTION, case, f"budget {_fraction(frac)}", 0.0, budget_mb=budget / MB,
                                  plan="none fits", shape=tuple(x.shape),
                                  note=e.needs()))
            break
        if untiled_bytes is None:
            untiled_bytes = plan.predicted.pass_bytes
            budget = untiled_bytes

        def once():
            with torch.inference_mode():
                return run_plan(vae.model, x, plan)

        peak, out = measure_peak(once, device)
        times = []
        for _ in range(max(1, opts.repeat)):
            out = None
            gc.collect()
            t0 = time.perf_counter()
            out = once()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append((time.perf_counter() - t0) * 1e3)
        ms = statistics.median(times)
        if ref is None:
            ref, base_ms = out, ms
        err = max_abs(out, ref)
        p = plan.predicted
        rows.append(BudgetRow(SECTION, case, f"budget {_fraction(frac)}", ms, baseline_ms=base_ms,
                              peak_mb=peak.device_bytes / MB, predicted_peak_mb=p.pass_bytes / MB,
                              max_abs_err=err, psnr_db=psnr(out, ref) if err else None, reference=frac == 1.0,
                              note=f"{peak.source}; median of {len(times)}", plan=plan.layout(),
                              budget_mb=budget / MB, host_mb=p.host_bytes / MB, shape=tuple(x.shape)))
        del out
    return rows


def _fraction(frac: float) -> str:
    return "unlimited" if frac == 1.0 else f"1/{round(1 / frac)}"


def budget_chart(rows: Sequence[dict], path: Path) -> Optional[str]:
    """Time and device peak (measured, predicted) against the budget, one panel per case; None when written, else
    why not (matplotlib missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no chart"
    cases = list(dict.fromkeys(r["case"] for r in rows if r.get("section") == SECTION and r.get("ms")))
    if not cases:
        return "no budget rows"
    cols = 2
    fig, axes = plt.subplots((len(cases) + cols - 1) // cols, cols, figsize=(11, 3.2 * ((len(cases) + 1) // cols)),
                             squeeze=False)
    for ax, case in zip(axes.flat, cases):
        rs = [r for r in rows if r["case"] == case and r.get("ms")]
        budget = [r["budget_mb"] for r in rs]
        ax.plot(budget, [r["peak_mb"] for r in rs], "o-", label="device peak, measured (MB)")
        ax.plot(budget, [r["predicted_peak_mb"] for r in rs], "x--", label="device peak, predicted (MB)")
        ax.plot(budget, budget, ":", color="grey", label="budget")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("budget (MB)")
        ax.set_title(case, fontsize=9)
        t = ax.twinx()
        t.plot(budget, [r["ms"] / r["baseline_ms"] for r in rs], "s-", color="tab:red", label="time / untiled")
        t.set_ylabel("time / untiled time")
        t.set_ylim(bottom=0)
        if ax is axes.flat[0]:
            lines = ax.get_legend_handles_labels()
            tl = t.get_legend_handles_labels()
            ax.legend(lines[0] + tl[0], lines[1] + tl[1], fontsize=7, loc="lower right")
    for ax in list(axes.flat)[len(cases):]:
        ax.axis("off")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue(), overwrite=True)  # complete or absent
    return None
