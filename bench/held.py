"""What a loaded VAE holds beyond its parameters, step by step (`python -m turbovae bench --sections held`).

A user loads a VAE, then decodes and encodes an image and a clip; a memory-safe VAE must then hold its
weights once, nothing more. Each architecture (real channel counts, seeded weights, loaded as
`load_vae` loads them) runs load -> image decode -> + image encode -> + 5-frame clip decode -> + 5-frame
clip encode in one process, and after each step the rows record the resident memory beyond the parameters
(CPU: RSS after `malloc_trim`, so freed memory does not count; CUDA: `memory_allocated`), the step's peak
and its time. Before the first model the same steps run once on the tiny configs, so the process's one-time
costs (kernel code pages, thread pools) are not charged to whichever model comes first.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..vae.api import TurboVAE
from ..vae.loader import load_checkpoint
from ..vae.dtypes import working_dtype
from ..vae.registry import Family, families
from .common import BenchOptions, BenchRow
from ..vae.measuring import sync
from ..vae.seeded_weights import fan_in_weights
from .main import PeakMemory, resident_mb
from .report import HELD_SECTION

SECTION = HELD_SECTION
IMAGE_PX = {"cpu": 128, "cuda": 512}  # image side; clips use half of it
CLIP_FRAMES = 5


@dataclass(frozen=True)
class Architecture:
    name: str
    config: Callable[[bool], object]  # tiny? -> config
    shapes: Callable[[object], dict]  # config -> the architecture's key -> shape table


def _state_shapes(fam: Family) -> Callable[[object], dict]:
    def shapes(cfg) -> dict:
        with torch.device("meta"):
            return {k: tuple(v.shape) for k, v in fam.build_model(cfg).state_dict().items()}
    return shapes


def architectures() -> tuple[Architecture, ...]:
    """Every registered family (vae/registry.py), in its order."""
    return tuple(Architecture(f.title, lambda tiny, f=f: f.config(real=not tiny), _state_shapes(f)) for f in families())


def _steps(vae: TurboVAE, image_px: int, g: torch.Generator) -> list[tuple[str, Callable[[], torch.Tensor]]]:
    """The user's sequence; inputs are made inside each step's call, outputs dropped after it."""
    fmt, dev, dtype = vae.latent_format, vae.device, vae.dtype
    clip_px = image_px // 2

    def latents(frames: int, px: int) -> torch.Tensor:
        t = 1 + (frames - 1) // fmt.temporal_factor
        return torch.randn((1, fmt.channels, t, px // fmt.spatial_factor, px // fmt.spatial_factor),
                           generator=g).to(device=dev, dtype=dtype)

    def pixels(frames: int, px: int) -> torch.Tensor:
        return (torch.rand((1, fmt.image_channels, frames, px, px), generator=g) * 2 - 1).to(device=dev, dtype=dtype)

    return [
        ("image decode", lambda: vae.decode(latents(1, image_px))),
        ("+ image encode", lambda: vae.encode(pixels(1, image_px))),
        (f"+ {CLIP_FRAMES}-frame clip decode", lambda: vae.decode(latents(CLIP_FRAMES, clip_px))),
        (f"+ {CLIP_FRAMES}-frame clip encode", lambda: vae.encode(pixels(CLIP_FRAMES, clip_px))),
    ]


def _load(arch: Architecture, tiny: bool, device: torch.device, dtype: torch.dtype) -> TurboVAE:
    cfg = arch.config(tiny)
    return load_checkpoint(fan_in_weights(arch.shapes(cfg)), config=cfg, device=device, dtype=dtype)


def parameters_mb(vae: TurboVAE) -> float:
    return sum(p.numel() * p.element_size() for p in vae.model.parameters()) / 2**20


def measure(arch: Architecture, opts: BenchOptions, device: torch.device, dtype: torch.dtype,
            tiny: bool) -> list[BenchRow]:
    """The sequence for one architecture: a row per step, held MB = resident beyond the parameters."""
    peak = PeakMemory(device)
    g = torch.Generator().manual_seed(0)
    tag = str(dtype).replace("torch.", "")
    gc.collect()
    before = resident_mb(device)
    t0 = time.perf_counter()
    vae = _load(arch, tiny, device, dtype)
    sync(device)
    load_ms = (time.perf_counter() - t0) * 1e3
    params = parameters_mb(vae)

    def beyond_parameters() -> Optional[float]:
        now = resident_mb(device)
        return None if now is None or before is None else now - before - params

    rows = [BenchRow(SECTION, "load", arch.name, load_ms, held_mb=beyond_parameters(), model_mb=params, note=tag)]
    image_px = 64 if tiny else IMAGE_PX.get(device.type, IMAGE_PX["cpu"])
    with torch.inference_mode():
        for name, step in _steps(vae, image_px, g):
            t0 = time.perf_counter()
            mb, out = peak(step)
            sync(device)
            ms = (time.perf_counter() - t0) * 1e3
            del out
            rows.append(BenchRow(SECTION, name, arch.name, ms, peak_mb=mb, held_mb=beyond_parameters(),
                                 model_mb=params, note=tag))
    del vae
    gc.collect()
    return rows


def run(opts: BenchOptions) -> list[BenchRow]:
    device = torch.device(opts.device)
    dtype = working_dtype(opts.dtype, device)
    if not opts.quick:
        for arch in architectures():  # the process's one-time costs, on the tiny configs (not reported)
            measure(arch, opts, device, dtype, tiny=True)
    rows: list[BenchRow] = []
    for arch in architectures():
        rows += measure(arch, opts, device, dtype, tiny=opts.quick)
    return rows
