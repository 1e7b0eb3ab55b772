"""Tiling benchmark: untiled vs fast vs exact tiles — time, peak memory, error vs untiled.

CPU peak memory is the peak-RSS increase over the loaded model and inputs, measured in a fresh
subprocess per variant (bench/peak_rss.py); CUDA peak is `max_memory_allocated`. Inputs are latents of
procedural real-content images (bench/content.py) encoded by the same model. With random weights the
fast-mode PSNR is pessimistic (random decoders amplify GroupNorm/attention differences); use
`--seedvr2-checkpoint` / `--qwen-checkpoint` for real numbers.

Child mode: `python -m turbovae.bench.tiling '<json>'` runs one variant and prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch

from ..vae.dtypes import DTYPE_BY_NAME
from ..vae.input_rules import default_overlap
from ..vae.registry import family
from .common import BenchOptions, BenchRow
from ..vae.measuring import max_abs, psnr
from .content import synthetic_clip, synthetic_image
from .cases import for_section
from .models import checkpoint_for


def build_model(key: str, checkpoint: Optional[str], dtype: torch.dtype, device: str):
    """A TurboVAE of the family's real architecture: the user's checkpoint, or seeded random weights."""
    from ..vae.api import TurboVAE
    from ..vae.loader import load_checkpoint

    if checkpoint:
        return load_checkpoint(checkpoint, dtype=dtype, device=device)
    torch.manual_seed(0)
    fam = family(key)
    model = fam.build_model(fam.real())
    return TurboVAE(model.to(device=device, dtype=dtype))


def _content(h: int, w: int, frames: int) -> torch.Tensor:
    if frames == 1:
        return synthetic_image(h, w, seed=1)[None, :, None]
    return synthetic_clip(frames, h, w, seed=1)[None]


def _child(args: dict) -> dict:
    from .peak_rss import peak_increase_mb, reset_peak
    from ..vae.tiled import decode_tiled

    torch.set_num_threads(args["threads"])
    dtype = getattr(torch, args["dtype"])
    vae = build_model(args["family"], args.get("checkpoint"), dtype, args["device"])
    z = torch.load(args["latents"], weights_only=True).to(device=args["device"], dtype=dtype)
    base = reset_peak()
    t0 = time.perf_counter()
    with torch.inference_mode():
        if args["variant"] == "untiled":
            y = vae.decode(z, temporal_slice=args.get("temporal_slice"))
        else:
            y = decode_tiled(vae, z, tile_px=args["tile"], overlap_px=args["overlap"], mode=args["variant"],
                             temporal_slice=args.get("temporal_slice"))
    ms = (time.perf_counter() - t0) * 1e3
    peak = peak_increase_mb(base)
    torch.save(y.float().cpu(), args["out"])
    return {"ms": ms, "peak_mb": peak}


def run(opts: BenchOptions) -> list[BenchRow]:
    from .peak_rss import run_child, supported

    device = opts.device
    dtype = DTYPE_BY_NAME[opts.dtype or ("bf16" if device == "cuda" else "fp32")]
    rows: list[BenchRow] = []
    with tempfile.TemporaryDirectory() as tmp:
        for tiled in for_section("tiling", quick=opts.quick, cuda=device == "cuda"):
            key, h, w, frames, tile = tiled.family, tiled.height, tiled.width, tiled.frames, tiled.tile_px
            ckpt = checkpoint_for(key, opts)
            vae = build_model(key, ckpt, dtype, device)
            with torch.inference_mode():
                z = vae.encode(_content(h, w, frames).to(device=device, dtype=dtype))
            del vae
            zpath = Path(tmp) / "z.pt"
            torch.save(z.cpu(), zpath)
            case = f"{tiled.shown} decode {w}x{h}x{frames}, tile {tile}"
            ref, base_ms = None, None
            for variant in ("untiled", "fast", "exact"):
                args = {"family": key, "checkpoint": ckpt, "dtype": str(dtype).split(".")[-1], "device": device,
                        "latents": str(zpath), "variant": variant, "tile": tile,
                        "overlap": default_overlap(tile),
                        "out": str(Path(tmp) / f"{variant}.pt"), "threads": torch.get_num_threads()}
                if device == "cpu" and supported():
                    res = run_child("turbovae.bench.tiling", args)
                else:
                    res = _in_process(args)
                y = torch.load(args["out"], weights_only=True)
                if ref is None:
                    ref, base_ms = y, res["ms"]
                rows.append(BenchRow("tiling", case, variant, res["ms"], base_ms if variant != "untiled" else None,
                                     res["peak_mb"], None if variant == "untiled" else max_abs(y, ref),
                                     None if variant == "untiled" else psnr(y, ref),
                                     note=f"peak {res['peak_mb'] / max(rows_peak(rows, case), 1e-9):.0%} of untiled"
                                     if variant != "untiled" else "peak = RSS increase" if device == "cpu" else ""))
    return rows


def rows_peak(rows: list[BenchRow], case: str) -> float:
    return next(r.peak_mb for r in rows if r.case == case and r.variant == "untiled")


def _in_process(args: dict) -> dict:
    """CUDA (or non-Linux) variant: run here and read torch's peak counter."""
    from .common import cuda_peak_mb, time_ms
    from ..vae.tiled import decode_tiled

    dtype = getattr(torch, args["dtype"])
    vae = build_model(args["family"], args.get("checkpoint"), dtype, args["device"])
    z = torch.load(args["latents"], weights_only=True).to(device=args["device"], dtype=dtype)

    def go():
        if args["variant"] == "untiled":
            return vae.decode(z)
        return decode_tiled(vae, z, tile_px=args["tile"], overlap_px=args["overlap"], mode=args["variant"])

    ms, y = time_ms(go, args["device"], repeat=1, warmup=1)
    peak, _ = cuda_peak_mb(go, args["device"])
    torch.save(y.float().cpu(), args["out"])
    return {"ms": ms, "peak_mb": peak if peak is not None else float("nan")}


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))))
