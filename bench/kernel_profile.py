"""Per-kernel profile of each clip case: the top kernels of one pass by time, with their share of the pass.

Why: the GPU clip cases run far from the dense-bf16 floor (docs/results/2026-11-26-h100-README.md), and the
per-step ablation of `bench/gpu.py` cannot say which kernels the time goes to. One `torch.profiler` pass per
clip case (after one warm-up, the model's default paths, eager, in the temporal slices the public path picks)
names them: on CUDA the device kernels by their own GPU time, on the CPU (the dry run) the operators by their
own CPU time. The GPU lease run (`bench/gpu_run.py`, task `kernel-profile`) writes the JSON:

    python -m turbovae.bench.kernel_profile --device cuda --dtype bf16 --out kernels.json [--quick] [--top 15]

The file has the bench's format (`environment`, `rows`): per case one row for the whole pass (its wall time and
the profiled total) and one row per top kernel (`ms` its summed time, `share` of the profiled total, `calls`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

SECTION = "kernels"
NAME_CHARS = 120  # kernel names of templated CUDA code run to hundreds of characters


@dataclass(frozen=True)
class KernelTime:
    """One kernel (CUDA) or operator (CPU) of a profiled pass: its summed own time and how often it ran."""

    name: str
    self_us: float
    calls: int


@dataclass(frozen=True)
class KernelShare:
    name: str
    ms: float
    share: float  # of the profiled total of the pass
    calls: int


def top_kernels(times: Iterable[KernelTime], top: int) -> tuple[float, list[KernelShare]]:
    """(profiled total in ms, the `top` entries by own time with their share of that total). Entries of the same
    name are summed first: the profiler lists a kernel once per input shape."""
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    merged: dict[str, list[float]] = {}
    for t in times:
        if t.self_us > 0:
            entry = merged.setdefault(t.name, [0.0, 0])
            entry[0] += t.self_us
            entry[1] += t.calls
    total_us = sum(us for us, _ in merged.values())
    ranked = sorted(merged.items(), key=lambda kv: -kv[1][0])[:top]
    return total_us / 1e3, [KernelShare(name[:NAME_CHARS], us / 1e3, us / total_us, int(calls))
                            for name, (us, calls) in ranked]


def kernel_times(prof, cuda: bool) -> list[KernelTime]:
    """The profiler's averages as KernelTime: CUDA kernels by own device time, or CPU operators by own CPU time."""
    from torch.autograd import DeviceType

    out = []
    for e in prof.key_averages():
        if cuda:
            if getattr(e, "device_type", None) != DeviceType.CUDA:
                continue
            us = float(getattr(e, "self_device_time_total", 0.0) or 0.0)
        else:
            us = float(e.self_cpu_time_total)
        out.append(KernelTime(e.key, us, int(e.count)))
    return out


def profile_case(model, case, device, dtype, top: int) -> list[dict]:
    """One warm-up pass, then one profiled pass of `case` (bench/gpu.py's Case) on `model`; the case's rows."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from ..vae.measuring import sync
    from .gpu import resolve_slice

    cuda = device.type == "cuda"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(case.shape, generator=g)
    x = (x.clamp_(-1, 1) if case.kind == "encode" else x).to(device=device, dtype=dtype)
    temporal_slice = resolve_slice(model, case, dtype, device)
    run = model.decode_latents if case.kind == "decode" else model.encode_moments
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.inference_mode():
        run(x, temporal_slice=temporal_slice)
        sync(device)
        with profile(activities=activities) as prof:
            t0 = time.perf_counter()
            run(x, temporal_slice=temporal_slice)
            sync(device)
            wall_ms = (time.perf_counter() - t0) * 1e3
    total_ms, ranked = top_kernels(kernel_times(prof, cuda), top)
    what = "CUDA kernels, own GPU time" if cuda else "CPU operators, own CPU time"
    rows = [{"section": SECTION, "case": case.name, "variant": "whole pass (profiled, wall)", "ms": wall_ms,
             "share": None, "calls": None,
             "note": f"temporal_slice={temporal_slice}; {what}: {total_ms:.1f} ms in all; default paths, eager"}]
    rows += [{"section": SECTION, "case": case.name, "variant": k.name, "ms": k.ms, "share": k.share,
              "calls": k.calls, "note": f"{k.share:.1%} of the profiled total, {k.calls} calls"} for k in ranked]
    return rows


def run(device_name: str, dtype_name: Optional[str], quick: bool, top: int,
        keys: Sequence[str] = ()) -> dict:
    """Every clip case (more than one latent frame) of bench/gpu.py at this device's sizes; the results payload."""
    import torch

    from ..vae.dtypes import working_dtype
    from .common import BenchOptions, environment
    from .gpu import cases
    from .models import build_model

    device = torch.device(device_name)
    dtype = working_dtype(dtype_name, device)
    clips = [c for c in cases(device.type == "cuda", quick)
             if c.kind == "decode" and c.shape[2] > 1 and (not keys or c.key in keys)]
    rows: list[dict] = []
    models: dict[str, torch.nn.Module] = {}
    for case in clips:
        if case.family not in models:
            models.clear()
            models[case.family] = build_model(case.family, BenchOptions(device=device_name), quick).to(device, dtype)
        try:
            rows += profile_case(models[case.family], case, device, dtype, top)
        except torch.OutOfMemoryError as e:  # a row that says so; the next case still runs
            rows.append({"section": SECTION, "case": case.name, "variant": "whole pass (profiled, wall)",
                         "ms": None, "share": None, "calls": None, "note": f"out of memory: {str(e)[:160]}"})
            torch.cuda.empty_cache()
    env = environment()
    env["dtype"] = str(dtype).replace("torch.", "")
    return {"environment": env, "rows": rows}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m turbovae.bench.kernel_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--dtype", help="bf16/fp16/fp32 (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--quick", action="store_true", help="the tiny-config clip twins (the GPU run's dry run)")
    p.add_argument("--top", type=int, default=15, help="kernels kept per case (default 15)")
    p.add_argument("--cases", help="comma list of case keys (default: every clip case)")
    p.add_argument("--out", required=True, help="the JSON to write")
    args = p.parse_args(argv)
    if args.top < 1:
        p.error("--top must be at least 1")
    keys = tuple(k for k in (args.cases or "").split(",") if k)
    payload = run(args.device, args.dtype, args.quick, args.top, keys)
    Path(args.out).write_text(json.dumps(payload, indent=2))
    for r in payload["rows"]:
        ms = f"{r['ms']:.2f} ms" if isinstance(r["ms"], (int, float)) else "-"
        print(f"{r['case']} | {r['variant'][:60]} | {ms} | {r['note']}", file=sys.stdout)
    return 0 if payload["rows"] else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
