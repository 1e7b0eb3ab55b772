"""Qwen-Image-Layered (RGBA) VAE: the layered decode vs diffusers, same weights, same run.

The pipeline decodes `layers + 1` single-frame latents as one batch ((b f) c 1 h w; diffusers
QwenImageLayeredPipeline); so does ComfyUI's graph after LatentCutToBatch(dim="t"), where VAE Decode
runs one layer at a time on our VAE. Rows: diffusers `AutoencoderKLQwenImage(input_channels=4)` on the
batch (baseline), ours on the batch, ours layer by layer (the node's path).

Sizes, layers + 1 = 5: CUDA 1024² (bench dtype, PSNR vs our fp32); CPU 512² at fp32 (1024² × 5 in
diffusers at fp32 needs more memory than a shared CPU box has); `--quick` 64² at a reduced width (the
tiny config, for the smoke test). Weights are random (seeded) unless `--qwen-layered-checkpoint` is given.
"""

from __future__ import annotations

import gc
from dataclasses import replace
from typing import Callable

import torch

from ..vae.api import TurboVAE
from ..vae.dtypes import working_dtype
from ..vae.wan import QWEN_IMAGE_LAYERED, TINY_WAN21, build
from ..vae.wan.config import diffusers_kwargs
from .common import BenchOptions, BenchRow, measure
from ..vae.measuring import max_abs, psnr
from .qwen import reference_cls, weights

SECTION = "qwen_layered"
LAYERS = 4  # the pipeline's default; it decodes LAYERS + 1 latents (the input image is the first)


TINY_LAYERED = replace(TINY_WAN21, image_channels=4)


def cases(opts: BenchOptions, cuda: bool) -> list[tuple[str, int]]:
    """(case name, side in pixels) of the square layered decodes to run."""
    if opts.quick:
        return [(f"layered decode 64²×{LAYERS + 1} (tiny)", 64)]
    side = 1024 if cuda else 512
    return [(f"layered decode {side}²×{LAYERS + 1}", side)]


def _batch(vae: TurboVAE, z: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: vae.decode(z)


def _layer_by_layer(vae: TurboVAE, z: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: torch.cat([vae.decode(z[i:i + 1]) for i in range(z.shape[0])])


def _theirs(ref, z: torch.Tensor) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        with torch.inference_mode():
            return ref.decode(z).sample
    return run


def run(opts: BenchOptions) -> list[BenchRow]:
    device = torch.device(opts.device)
    cuda = device.type == "cuda"
    dtype = working_dtype(opts.dtype, device)
    cfg = TINY_LAYERED if opts.quick else QWEN_IMAGE_LAYERED
    sd = weights(opts, SECTION, cfg)
    # The real size reads its 4 channels off the weights as a loaded file would; the tiny one needs its config.
    vae = TurboVAE(build(sd, config=cfg if opts.quick else None, source="bench").to(device=device, dtype=dtype))
    ref = None
    ref_cls = reference_cls()
    if ref_cls is not None:
        ref = ref_cls(**diffusers_kwargs(cfg)).eval()
        ref.load_state_dict(sd)
        ref.to(device=device, dtype=dtype)
    vae32 = None
    if dtype != torch.float32:
        vae32 = TurboVAE(build(sd, config=cfg if opts.quick else None, source="bench").to(device))
    del sd
    g = torch.Generator().manual_seed(0)
    tag = str(dtype)[6:]
    rows: list[BenchRow] = []
    for case, side in cases(opts, cuda):
        z = torch.randn(LAYERS + 1, cfg.z_dim, 1, side // 8, side // 8, generator=g).to(device=device, dtype=dtype)
        if ref is not None:
            base_ms, base_peak, base = measure(opts, device, _theirs(ref, z))
            base_name = "diffusers AutoencoderKLQwenImage(input_channels=4), batch"
        else:  # no diffusers: our own layer-by-layer pass is the baseline
            base_ms, base_peak, base = measure(opts, device, _layer_by_layer(vae, z))
            base_name = "ours layer by layer (diffusers not installed)"
        rows.append(BenchRow(SECTION, case, base_name, base_ms, base_ms, base_peak, note=tag))
        want32 = vae32.decode(z.float()) if vae32 is not None else None
        for name, fn in (("turbovae, batch", _batch(vae, z)), ("turbovae, layer by layer", _layer_by_layer(vae, z))):
            ms, peak, out = measure(opts, device, fn)
            assert out.shape == (LAYERS + 1, 4, 1, side, side), out.shape  # RGBA per layer
            row = BenchRow(SECTION, case, name, ms, base_ms, peak, max_abs(out, base), note=tag)
            if want32 is not None:
                row.psnr_db = psnr(out, want32)
                row.note += " (PSNR vs our fp32)"
            rows.append(row)
            del out
        del base, want32, z
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return rows
