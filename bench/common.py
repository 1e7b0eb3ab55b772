"""Timing, memory and table/JSON helpers shared by every benchmark section.

The error metrics, the device sync and the seeded weights are the library's (vae/measuring.py,
vae/seeded_weights.py: the doctor uses them too); the sections import them from there.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from ..trt.fileio import atomic_write_text
from ..vae.measuring import sync


@dataclass
class BenchOptions:
    """What the command line asked for; sections read only what they need."""

    device: str = "cpu"
    dtype: Optional[str] = None  # None = fp32 on CPU, bf16 on CUDA
    repeat: int = 3
    warmup: int = 1
    quick: bool = False  # smallest sizes only (used by the smoke test)
    checkpoint: dict = field(default_factory=dict)  # section name -> checkpoint path
    cases: tuple = ()  # keep only cases whose name contains one of these (empty: all)
    comfyui: Optional[str] = None  # a ComfyUI tree whose core VAEs join the main job's cases (bench/comfy_core.py)
    comfyui_stubs: tuple = ()  # packages core imports but a VAE never calls, stubbed where missing (e.g. "av")
    ablation_engines: bool = False  # gpu section: end each ablation with engines built for the case
    inject_oom: tuple = ()  # gpu section: "CASE_KEY:VARIANT" runs that fail once with a simulated out-of-memory


@dataclass
class BenchRow:
    section: str
    case: str
    variant: str
    ms: float
    baseline_ms: Optional[float] = None
    peak_mb: Optional[float] = None
    max_abs_err: Optional[float] = None
    psnr_db: Optional[float] = None
    note: str = ""
    reference: bool = False  # the case's reference row (what `speedup` of the other rows divides by)
    # resident memory this path holds after the case beyond its loaded model (CPU: RSS after malloc_trim;
    # CUDA: memory_allocated), summed over the family's cases so far: caches a path keeps show here
    held_mb: Optional[float] = None
    model_mb: Optional[float] = None  # the loaded model's parameters (rows that compare `held_mb` with it)
    core_ms: Optional[float] = None  # --comfyui: ComfyUI core's median ms in this case (on the other rows)
    err_vs_ours: Optional[float] = None  # --comfyui: the core row's max abs error against TurboVAE's output
    # the pass's peak predicted before it ran (vae/planning/meta_pass.py), on rows that measure `peak_mb`: same quantity
    predicted_peak_mb: Optional[float] = None

    @property
    def speedup(self) -> Optional[float]:
        return self.baseline_ms / self.ms if self.baseline_ms and self.ms else None


def time_ms(fn: Callable[[], object], device, repeat: int = 3, warmup: int = 1) -> tuple[float, object]:
    """Median wall time in ms of `fn()` after warm-up; returns the last result too."""
    result = None
    for _ in range(warmup):
        result = fn()
    sync(device)
    times = []
    for _ in range(max(repeat, 1)):
        t0 = time.perf_counter()
        result = fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), result


def interleaved_ms(fns: Sequence[Callable[[], object]], device, repeat: int,
                   tick: Callable[[], None] = lambda: None, *,
                   rotate: bool = False) -> tuple[list[list[float]], list[object]]:
    """Each fn's wall times in ms over `repeat` round-robin rounds (the caller warms up first), and its last
    output. Why alternate: machine load and clock drift then hit every variant alike, instead of whichever
    ran in a block after the others. A fn's previous output is freed before its next run allocates.
    `rotate`: round r starts with fn r (mod n), so no variant always runs right after the same other one (a run
    inherits its predecessor's cache and allocator state)."""
    times: list[list[float]] = [[] for _ in fns]
    outs: list[object] = [None] * len(fns)
    for r in range(max(repeat, 1)):
        first = r % len(fns) if rotate and fns else 0
        for i in [*range(first, len(fns)), *range(first)]:
            fn = fns[i]
            outs[i] = None
            t0 = time.perf_counter()
            outs[i] = fn()
            sync(device)
            times[i].append((time.perf_counter() - t0) * 1e3)
            tick()
    return times, outs


def cuda_peak_mb(fn: Callable[[], object], device) -> tuple[Optional[float], object]:
    """Peak CUDA memory above the starting point while `fn` runs (None on CPU: use a subprocess RSS probe)."""
    if torch.device(device).type != "cuda":
        return None, fn()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = fn()
    sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20, out


def measure(opts: BenchOptions, device, fn: Callable[[], torch.Tensor]) -> tuple[float, Optional[float], torch.Tensor]:
    """(median ms, CUDA peak MB or None, output) of `fn` with the options' repeat/warm-up counts."""
    peak, _ = cuda_peak_mb(fn, device)
    ms, out = time_ms(fn, device, repeat=opts.repeat, warmup=opts.warmup)
    return ms, peak, out


def environment() -> dict:
    env = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        # Other jobs on the machine inflate CPU times; the load at the start says whether it was idle.
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        env["cudnn"] = torch.backends.cudnn.version()
        from ..vae.doctor import gpu_driver_version

        env["driver"] = gpu_driver_version()
    return env


def format_table(rows: list[BenchRow]) -> str:
    head = ["section", "case", "variant", "ms", "speedup", "peak MB", "held MB", "max err", "PSNR dB", "note"]
    lines = []
    for r in rows:
        lines.append([
            r.section, r.case, r.variant, f"{r.ms:.1f}",
            f"{r.speedup:.2f}x" if r.speedup else "",
            f"{r.peak_mb:.0f}" if r.peak_mb is not None else "",
            f"{r.held_mb:.0f}" if r.held_mb is not None else "",
            f"{r.max_abs_err:.2e}" if r.max_abs_err is not None else "",
            f"{r.psnr_db:.1f}" if r.psnr_db is not None else "",
            r.note,
        ])
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = " | ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*head), "-+-".join("-" * w for w in widths)]
    out += [fmt.format(*l) for l in lines]
    return "\n".join(out)


def row_dict(row: BenchRow) -> dict:
    return dict(asdict(row), speedup=row.speedup)


def write_json(rows: list[BenchRow], path: Path, env: Optional[dict] = None, complete: bool = True) -> None:
    """The results file, rewritten whole after every case: complete or absent, never half-written.

    `complete` is False while a run is in progress or after it was interrupted."""
    payload = {"environment": env if env is not None else environment(), "complete": complete,
               "rows": [row_dict(r) for r in rows]}
    atomic_write_text(path, json.dumps(payload, indent=2), overwrite=True)  # rewritten after every case
