"""Engine vs eager vs torch.compile, same run, same input: image decode at a static bucket, and a
SeedVR2 clip decoded by the video slice engines (first -> next -> ...) vs the eager sliced decode.

CPU: AOTInductor engines of tiny configs (real topologies; full-size compiles take too long on small
CPUs). GPU: the real-size Qwen-Image/Wan 2.1 VAE and SeedVR2 VAE (720p x 21 frames: latents
(1, 16, 6, 90, 160)), random weights unless a checkpoint is given, with AOTInductor and TensorRT when
it is installed.
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from .common import BenchOptions, BenchRow, max_abs, psnr, time_ms

SECTION = "engines"


def _model(cpu: bool):
    from ..vae.wan.config import TINY_WAN21, WAN21
    from ..vae.wan.model import WanVAE

    torch.manual_seed(0)
    return WanVAE(TINY_WAN21 if cpu else WAN21).eval()


def _backends(device: torch.device) -> list[str]:
    return ["aoti"] + ([] if device.type == "cpu" else ["tensorrt"])


def engine_vae(model32: nn.Module, run_model: nn.Module, out_dir: Path, table, backend: str, dtype: torch.dtype,
               device: torch.device, **build_kw):
    """Build into `out_dir` from a private fp32 copy (a build casts the module it exports to the engine
    dtype/device, so the next backend must not see that) and wrap the engines around `run_model`."""
    from ..trt.build import build_engine_set
    from ..trt.engine_set import EngineSet
    from ..trt.engine_vae import EngineVAE
    from ..trt.identity import model_hash
    from ..vae.api import TurboVAE

    weights_hash = model_hash(model32.state_dict())
    build_engine_set(TurboVAE(copy.deepcopy(model32), source="random weights"), out_dir, table, backend=backend,
                     dtype=dtype, device=device, **build_kw)
    # Built straight from the in-memory model (the tiny configs have no checkpoint loader).
    return EngineVAE(run_model, EngineSet(out_dir, device, model_hash=weights_hash))


@dataclass(frozen=True)
class EngineUse:
    """One timed use of a built engine set: its table case, the eager baseline and how to run it."""

    case: str
    eager_ms: float
    reference: torch.Tensor
    run: Callable[[object], torch.Tensor]


def engine_rows(device: torch.device, opts: BenchOptions, make: Callable[[str, Path], object],
                uses: list[EngineUse]) -> list[BenchRow]:
    """Per backend: build once with `make(backend, folder)`, then one row per use, timed against its eager."""
    from ..trt.backend import EngineError
    from ..trt.backend_registry import get_backend

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for be in _backends(device):
            try:
                get_backend(be).check_available(device)
                ev = make(be, Path(tmp) / be)
            except (EngineError, ImportError) as e:
                rows += [BenchRow(SECTION, u.case, be, float("nan"), note=f"unavailable: {str(e)[:80]}") for u in uses]
                continue
            for use in uses:
                calls = ev.engine_calls
                e_ms, out = time_ms(lambda: use.run(ev), device, opts.repeat, opts.warmup)
                note = "" if ev.engine_calls > calls else "FELL BACK to PyTorch"
                rows.append(BenchRow(SECTION, use.case, be, e_ms, baseline_ms=use.eager_ms,
                                     max_abs_err=max_abs(out, use.reference), psnr_db=psnr(out, use.reference),
                                     note=note))
    return rows


def image_rows(opts: BenchOptions, device: torch.device, dtype: torch.dtype) -> list[BenchRow]:
    """Wan 2.1 image decode at a static bucket (eager vs torch.compile vs engines), and an image of twice
    the bucket's side in fast tiles of the bucket's size (PyTorch tiles vs tiles on the same engines)."""
    from ..trt.buckets import Bucket, static_table
    from ..vae.api import TurboVAE
    from ..vae.tiling import decode_tiled

    cpu = device.type == "cpu"
    size = 256 if cpu else 1024
    model32 = _model(cpu).to(device=device)  # engines are built from fp32 weights in the engine dtype
    model = _model(cpu).to(device=device, dtype=dtype)
    vae = TurboVAE(model, source="random weights")
    c = model.latent_format.channels
    z = torch.randn(1, c, size // 8, size // 8, device=device, dtype=dtype)
    z2 = torch.randn(1, c, 1, size // 4, size // 4, device=device, dtype=dtype)
    kind, dt = "tiny" if cpu else "real", str(dtype)[6:]
    case = f"{kind} wan2.1 decode {size}x{size} {dt}"
    tiled_case = f"{kind} wan2.1 fast tiles {2 * size}x{2 * size} in {size} px {dt}"
    with torch.inference_mode():
        eager_ms, ref = time_ms(lambda: vae.decode(z), device, opts.repeat, opts.warmup)
    rows = [BenchRow(SECTION, case, "eager", eager_ms)]
    compiled = torch.compile(model.image_decoder())
    with torch.inference_mode():
        c_ms, c_out = time_ms(lambda: compiled(z), device, opts.repeat, max(opts.warmup, 1))
    rows.append(BenchRow(SECTION, case, "torch.compile", c_ms, baseline_ms=eager_ms, max_abs_err=max_abs(c_out, ref)))

    def tiles(v) -> torch.Tensor:
        return decode_tiled(v, z2, tile_px=size, overlap_px=size // 4, mode="fast")

    tiled_ms, tiled_ref = time_ms(lambda: tiles(vae), device, opts.repeat, opts.warmup)
    tiled_row = BenchRow(SECTION, tiled_case, "eager tiles", tiled_ms)
    table = static_table(Bucket(size, size))
    on_engines = engine_rows(device, opts,
                             lambda be, d: engine_vae(model32, model, d, table, be, dtype, device,
                                                      components=("decoder",)),
                             [EngineUse(case, eager_ms, ref, lambda ev: ev.decode(z)),
                              EngineUse(tiled_case, tiled_ms, tiled_ref, tiles)])
    rows += [r for r in on_engines if r.case == case] + [tiled_row]
    rows += [r for r in on_engines if r.case == tiled_case]
    for r in rows:
        if r.case == tiled_case and r.variant != "eager tiles":
            r.variant = f"{r.variant} tiles"
    return rows


def clip_latent_shape(cpu: bool, quick: bool) -> tuple[int, ...]:
    """SeedVR2 clip latents: 720p x 21 frames on CUDA; 96x64 x 17 frames (quick: 48x32 x 9) on CPU."""
    if not cpu:
        return (1, 16, 6, 90, 160)
    return (1, 16, 3, 4, 6) if quick else (1, 16, 5, 8, 12)


def seedvr2_clip_rows(opts: BenchOptions, device: torch.device, dtype: torch.dtype) -> list[BenchRow]:
    """SeedVR2 clip decode: eager sliced (`temporal_slice=1`, the slicing the engines reproduce) vs the
    video slice-engine chain, same weights and latents."""
    from ..trt.buckets import Bucket, static_table
    from ..vae.api import TurboVAE
    from .models import build_model

    cpu = device.type == "cpu"
    shape = clip_latent_shape(cpu, opts.quick)
    model32 = build_model("seedvr2", opts, quick=cpu).to(device)
    model = copy.deepcopy(model32).to(dtype=dtype)
    f, tf = model.latent_format.spatial_factor, model.latent_format.temporal_factor
    h, w, frames = shape[3] * f, shape[4] * f, 1 + tf * (shape[2] - 1)
    z = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)
    case = f"{'tiny' if cpu else 'real'} seedvr2 clip decode {w}x{h}x{frames} {str(dtype)[6:]}"
    vae = TurboVAE(model, source="random weights")
    eager_ms, ref = time_ms(lambda: vae.decode(z, temporal_slice=1), device, opts.repeat, opts.warmup)
    rows = [BenchRow(SECTION, case, "eager sliced (1 latent/slice)", eager_ms)]
    table = static_table(Bucket(h, w))
    rows += engine_rows(device, opts,
                        lambda be, d: engine_vae(model32, model, d, table, be, dtype, device, components=(),
                                                 video=True),
                        [EngineUse(case, eager_ms, ref, lambda ev: ev.decode(z))])
    for r in rows[1:]:
        r.variant = f"{r.variant} slice chain"
    return rows


def run(opts: BenchOptions) -> list[BenchRow]:
    from ..vae.api import parse_dtype

    device = torch.device(opts.device)
    dtype = parse_dtype(opts.dtype) or (torch.float32 if device.type == "cpu" else torch.bfloat16)
    return image_rows(opts, device, dtype) + seedvr2_clip_rows(opts, device, dtype)
