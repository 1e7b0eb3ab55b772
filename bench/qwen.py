"""Qwen-Image / Wan 2.1 VAE: diffusers `AutoencoderKLQwenImage` vs ours, same weights, same run.

CPU (fp32): image decode/encode at 256² and 512², a 5-frame clip at 128² (`--quick`: 256² images only).
CUDA (bench dtype, bf16 by default): images at 1024², 1328², 1664×928, with PSNR against our fp32.
Each row reports ours vs the diffusers baseline (speedup, max abs error); the ablation (image decode
256² on CPU, 1024² on CUDA) turns one of the Wan fast paths (`FastPaths`) off at a time. Weights are random (seeded)
unless `--qwen-checkpoint` is given.
"""

from __future__ import annotations

import gc
from typing import Callable

import torch

from ..vae.loader import load_checkpoint
from ..vae.dtypes import working_dtype
from ..vae.accel.switches import FastPaths, ablations
from ..vae.wan import WAN21, WanConfig, WanVAE, build, expected_shapes
from ..vae.wan.config import diffusers_kwargs
from .common import BenchOptions, BenchRow, measure
from ..vae.measuring import max_abs, psnr

SECTION = "qwen"


def reference_cls():
    try:
        from diffusers import AutoencoderKLQwenImage
    except ImportError:  # diffusers is a test/bench dependency only
        return None
    return AutoencoderKLQwenImage


def weights(opts: BenchOptions, section: str = SECTION, cfg: WanConfig = WAN21) -> dict[str, torch.Tensor]:
    """The section's checkpoint's weights (diffusers names), or seeded random ones of `cfg` with
    randomised gammas."""
    path = opts.checkpoint.get(section)
    if path:
        return load_checkpoint(path, device="cpu", dtype="fp32").state_dict()
    g = torch.Generator().manual_seed(0)
    sd = {}
    for k, shape in expected_shapes(cfg).items():
        if k.endswith("gamma"):
            sd[k] = 1 + 0.2 * torch.randn(shape, generator=g)
        elif k.endswith("bias"):
            sd[k] = 0.02 * torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g)
            sd[k] = t.div_(t[0].numel() ** 0.5)
    return sd


def _cases(opts: BenchOptions, cuda: bool) -> list[tuple[str, str, tuple[int, ...]]]:
    if opts.quick:
        return [("image decode 256²", "decode", (1, 16, 1, 32, 32)), ("image encode 256²", "encode", (1, 3, 1, 256, 256))]
    if cuda:
        return [("image decode 1024²", "decode", (1, 16, 1, 128, 128)),
                ("image encode 1024²", "encode", (1, 3, 1, 1024, 1024)),
                ("image decode 1328²", "decode", (1, 16, 1, 166, 166)),
                ("image encode 1328²", "encode", (1, 3, 1, 1328, 1328)),
                ("image decode 1664×928", "decode", (1, 16, 1, 116, 208)),
                ("image encode 1664×928", "encode", (1, 3, 1, 928, 1664)),
                ("17-frame decode 480×832", "decode", (1, 16, 5, 60, 104))]
    return [("image decode 256²", "decode", (1, 16, 1, 32, 32)), ("image encode 256²", "encode", (1, 3, 1, 256, 256)),
            ("image decode 512²", "decode", (1, 16, 1, 64, 64)), ("image encode 512²", "encode", (1, 3, 1, 512, 512)),
            ("5-frame decode 128²", "decode", (1, 16, 2, 16, 16)), ("5-frame encode 128²", "encode", (1, 3, 5, 128, 128))]


def _ours(model: WanVAE, kind: str, x: torch.Tensor, fast: FastPaths) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        model.fast = fast
        with torch.inference_mode():
            return model.decode_latents(x) if kind == "decode" else model.encode_moments(x)
    return run


def _theirs(ref, kind: str, x: torch.Tensor) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        with torch.inference_mode():
            return ref.decode(x).sample if kind == "decode" else ref.encode(x).latent_dist.parameters
    return run


def run(opts: BenchOptions) -> list[BenchRow]:
    device = torch.device(opts.device)
    cuda = device.type == "cuda"
    dtype = working_dtype(opts.dtype, device)
    sd = weights(opts)
    model = build(sd, source="bench").to(device=device, dtype=dtype).eval()
    ref_cls = reference_cls()
    ref = None
    if ref_cls is not None:
        ref = ref_cls(**diffusers_kwargs(WAN21)).eval()
        ref.load_state_dict(sd)
        ref.to(device=device, dtype=dtype)
    model32 = build(sd, source="bench").to(device).eval() if dtype != torch.float32 else None
    del sd
    g = torch.Generator().manual_seed(0)
    tag = str(dtype)[6:]
    rows: list[BenchRow] = []
    fast = model.fast
    for case, kind, shape in _cases(opts, cuda):
        x = (torch.rand(shape, generator=g) * 2 - 1) if kind == "encode" else torch.randn(shape, generator=g)
        x = x.to(device=device, dtype=dtype)
        if ref is not None:
            base_ms, base_peak, base = measure(opts, device, _theirs(ref, kind, x))
            base_name = "diffusers AutoencoderKLQwenImage"
        else:  # no diffusers: our own code with every fast path off is the baseline
            base_ms, base_peak, base = measure(opts, device, _ours(model, kind, x, FastPaths.plain()))
            base_name = "ours, all flags off (diffusers not installed)"
        rows.append(BenchRow(SECTION, case, base_name, base_ms, base_ms, base_peak, note=tag))
        ms, peak, out = measure(opts, device, _ours(model, kind, x, fast))
        row = BenchRow(SECTION, case, "turbovae", ms, base_ms, peak, max_abs(out, base), note=tag)
        if model32 is not None:
            ref32 = _ours(model32, kind, x.float(), fast)()
            row.psnr_db = psnr(out, ref32)
            row.note += " (PSNR vs our fp32)"
            del ref32
        rows.append(row)
        ablate = (not opts.quick) and case == ("image decode 1024²" if cuda else "image decode 256²")
        if ablate:
            for name, without in ablations(fast, model.fast_fields):
                ms, peak, o = measure(opts, device, _ours(model, kind, x, without))
                rows.append(BenchRow(SECTION, case, f"turbovae without {name}", ms, base_ms, peak,
                                     max_abs(o, base), note=tag))
        del base, out, x
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    model.fast = fast
    return rows
