"""Engine vs eager vs torch.compile, same run, same input: image decode at a static bucket, and clips
of SeedVR2, Wan 2.1 and Wan 2.2 decoded by the video slice engines (first -> next -> ...) vs eager.

CPU: AOTInductor engines of tiny configs (real topologies) at small sizes, and for the Wan clips also the
released configs at 64x64 px (see `clip_cases` for why). GPU: the real-size VAEs (Qwen-Image/Wan 2.1 image
and 832x480 x 21 frames, Wan 2.2 and SeedVR2 1280x720 x 21 frames), random weights, with AOTInductor and
TensorRT when it is installed.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from .common import BenchOptions, BenchRow, interleaved_ms, time_ms
from ..vae.measuring import max_abs, psnr
from ..vae.seeded_weights import fan_in_weights
from .cases import ClipCase, for_section
from .models import checkpoint_for, family_model

SECTION = "engines"


def _model(cpu: bool):
    from ..vae.wan.config import TINY_WAN21, WAN21 as WAN21_CONFIG
    from ..vae.wan.model import WanVAE

    torch.manual_seed(0)
    return WanVAE(TINY_WAN21 if cpu else WAN21_CONFIG).eval()


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
    from ..trt.interface import EngineError
    from ..trt.backends import get_backend

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
    from ..vae.tiled import decode_tiled

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


def clip_cases(cuda: bool, quick: bool) -> list[ClipCase]:
    """The clip decodes (bench/cases.py): on a GPU the real-size VAEs; on the CPU the tiny configs at 21 frames
    (SeedVR2: 17, its earlier size) and the released Wan configs at a small size, `quick` the tiny configs at 9.
    Why both on the CPU: on tiny channel counts PyTorch's CPU conv3d takes its slow reference path (oneDNN's size
    heuristic skips small tensors) while Inductor does not, so tiny rows flatter the engines; at released widths
    eager runs oneDNN too."""
    return list(for_section("engines", quick=quick and not cuda, cuda=cuda))


def clip_model(case: ClipCase, opts: BenchOptions) -> tuple[nn.Module, str]:
    """(the architecture in fp32 on CPU, its label): the user's checkpoint (--seedvr2-checkpoint,
    --qwen-checkpoint) for a released-config case, else fan-in-scaled seeded weights (activations stay O(1) at
    any size)."""
    from ..vae.loader import load_checkpoint

    ckpt = checkpoint_for(case.family, opts) if case.real_config else None
    if ckpt:
        return load_checkpoint(ckpt, device="cpu", dtype=torch.float32).model, "checkpoint"
    model = family_model(case.family, real=case.real_config)
    model.load_state_dict(fan_in_weights({k: tuple(v.shape) for k, v in model.state_dict().items()}))
    return model.eval().requires_grad_(False), "real" if case.real_config else "tiny"


def clip_rows(clip: ClipCase, opts: BenchOptions, device: torch.device, dtype: torch.dtype) -> list[BenchRow]:
    """One clip decode, all sides in the same run on the same weights and latents: eager as a user gets it
    (`TurboVAE.decode(z)`, the reference), eager sliced k latents per slice (the schedule the engines
    reproduce), and the video slice-engine chain per backend. Each side runs its warm-up, then one call whose
    peak memory is measured, then `repeat` timed runs alternating between the sides."""
    from ..trt.interface import EngineError
    from ..trt.backends import get_backend
    from ..trt.buckets import Bucket, static_table
    from ..trt.video import default_slice_latents
    from ..vae.api import TurboVAE
    from .main import PeakMemory

    model32, label = clip_model(clip, opts)
    model32 = model32.to(device)
    model = copy.deepcopy(model32).to(dtype=dtype)
    lf = model.latent_format
    shape = (1, lf.channels, *clip.latents)
    h, w, frames = shape[3] * lf.spatial_factor, shape[4] * lf.spatial_factor, 1 + lf.temporal_factor * (shape[2] - 1)
    case = f"{label} {clip.shown} clip decode {w}x{h}x{frames} {str(dtype)[6:]}"
    if opts.cases and not any(c in case for c in opts.cases):
        return []
    z = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)
    vae = TurboVAE(model, source="random weights")
    k = default_slice_latents(device)  # what the engines are built with: the chain runs eager's k-latent schedule
    sides: list[tuple[str, Callable[[], torch.Tensor], object]] = [
        ("eager", lambda: vae.decode(z), None),
        (f"eager sliced ({k} latent{'s' if k > 1 else ''}/slice)", lambda: vae.decode(z, temporal_slice=k), None)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for be in _backends(device):
            try:
                get_backend(be).check_available(device)
                ev = engine_vae(model32, model, Path(tmp) / be, static_table(Bucket(h, w)), be, dtype, device,
                                 components=(), video=True)
            except (EngineError, ImportError) as e:
                rows.append(BenchRow(SECTION, case, f"{be} slice chain", float("nan"),
                                     note=f"unavailable: {str(e)[:80]}"))
                continue
            sides.append((f"{be} slice chain", lambda ev=ev: ev.decode(z), ev))
        peak = PeakMemory(device)
        peaks, outs = [], []
        with torch.inference_mode():
            for _name, fn, _ev in sides:
                for _ in range(opts.warmup):
                    fn()
                mb, out = peak(fn)
                peaks.append(mb)
                outs.append(out)
            calls = [ev.engine_calls if ev is not None else 0 for _n, _f, ev in sides]
            times, _ = interleaved_ms([fn for _n, fn, _e in sides], device, opts.repeat)
    ref_ms = statistics.median(times[0])
    for i, (name, _fn, ev) in enumerate(sides):
        ms = statistics.median(times[i])
        fell_back = ev is not None and ev.engine_calls < calls[i] + opts.repeat
        rows.insert(i, BenchRow(SECTION, case, name, ms, baseline_ms=None if i == 0 else ref_ms, peak_mb=peaks[i],
                                max_abs_err=None if i == 0 else max_abs(outs[i], outs[0]),
                                psnr_db=None if i == 0 else psnr(outs[i], outs[0]), reference=i == 0,
                                note="FELL BACK to PyTorch" if fell_back else ""))
    return rows


def run(opts: BenchOptions) -> list[BenchRow]:
    from ..vae.dtypes import working_dtype

    device = torch.device(opts.device)
    dtype = working_dtype(opts.dtype, device)
    clips = clip_cases(device.type == "cuda", opts.quick)
    return image_rows(opts, device, dtype) + [r for clip in clips for r in clip_rows(clip, opts, device, dtype)]
