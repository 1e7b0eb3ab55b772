"""SeedVR2 VAE: plain path (every fast path off, whole clip) vs the optimised path, same weights, same run.

CPU: fp32 image (T=1) decode/encode at 256² and 5-frame decode/encode at 128² (`--quick`: 64² images).
CUDA: the bench dtype (bf16 by default) at larger sizes, plus PSNR of the optimised path against fp32.
The ablation turns one fast path off at a time on the image decode (skipped with `--quick`).
"""

from __future__ import annotations

import gc
from typing import Callable, Optional

import torch

from ..vae.loader import load_checkpoint
from ..vae.dtypes import working_dtype
from ..vae.accel.switches import FastPaths, ablations
from ..vae.seedvr2 import SeedVR2VAE, expected_shapes
from .common import BenchOptions, BenchRow, measure
from ..vae.measuring import max_abs, psnr
from ..vae.seeded_weights import fan_in_weights

SECTION = "seedvr2"


def random_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded fan-in-scaled weights for the real architecture (activations stay O(1))."""
    return fan_in_weights(expected_shapes(), seed)


def _model(opts: BenchOptions, device: torch.device, dtype: torch.dtype) -> SeedVR2VAE:
    source = opts.checkpoint.get(SECTION) or random_weights()
    return load_checkpoint(source, device=device, dtype=dtype).model


def _cases(opts: BenchOptions, cuda: bool) -> list[tuple[str, str, tuple[int, ...]]]:
    """(case name, 'encode'|'decode', input shape)."""
    if opts.quick:
        return [("image decode 64²", "decode", (1, 16, 1, 8, 8)), ("image encode 64²", "encode", (1, 3, 1, 64, 64))]
    if cuda:
        return [("image decode 1024²", "decode", (1, 16, 1, 128, 128)),
                ("image encode 1024²", "encode", (1, 3, 1, 1024, 1024)),
                ("5-frame decode 512²", "decode", (1, 16, 2, 64, 64)),
                ("5-frame encode 512²", "encode", (1, 3, 5, 512, 512)),
                ("21-frame decode 512² slice=1", "decode", (1, 16, 6, 64, 64))]
    return [("image decode 256²", "decode", (1, 16, 1, 32, 32)), ("image encode 256²", "encode", (1, 3, 1, 256, 256)),
            ("5-frame decode 128²", "decode", (1, 16, 2, 16, 16)), ("5-frame encode 128²", "encode", (1, 3, 5, 128, 128))]


def _runner(model: SeedVR2VAE, kind: str, x: torch.Tensor, fast: FastPaths, slice_: Optional[int]) -> Callable:
    def run() -> torch.Tensor:
        model.fast = fast
        with torch.inference_mode():
            if kind == "decode":
                return model.decode_latents(x, temporal_slice=slice_)
            return model.encode_moments(x, temporal_slice=slice_)
    return run


def run(opts: BenchOptions) -> list[BenchRow]:
    device = torch.device(opts.device)
    cuda = device.type == "cuda"
    dtype = working_dtype(opts.dtype, device)
    model = _model(opts, device, dtype)
    reference32 = _model(opts, device, torch.float32) if cuda and dtype != torch.float32 else None
    g = torch.Generator().manual_seed(0)
    rows: list[BenchRow] = []
    for case, kind, shape in _cases(opts, cuda):
        x = (torch.rand(shape, generator=g) * 2 - 1) if kind == "encode" else torch.randn(shape, generator=g)
        x = x.to(device=device, dtype=dtype)
        slice_ = 1 if "slice=1" in case else None
        base_ms, base_peak, base = measure(opts, device, _runner(model, kind, x, FastPaths.plain(), None))
        rows.append(BenchRow(SECTION, case, "plain (whole clip)", base_ms, base_ms, base_peak, note=str(dtype)[6:]))
        fast_ms, fast_peak, out = measure(opts, device, _runner(model, kind, x, FastPaths(), slice_))
        row = BenchRow(SECTION, case, "optimised" + (" sliced" if slice_ else ""), fast_ms, base_ms, fast_peak,
                       max_abs(out, base), note=str(dtype)[6:])
        if reference32 is not None:
            ref = _runner(reference32, kind, x.float(), FastPaths(), None)()
            row.psnr_db = psnr(out, ref)
            row.note += " (PSNR vs fp32)"
            del ref
        rows.append(row)
        if not opts.quick and case.startswith("image decode"):
            for name, without in ablations(FastPaths(), model.fast_fields):
                ms, peak, o = measure(opts, device, _runner(model, kind, x, without, None))
                rows.append(BenchRow(SECTION, case, f"optimised without {name}", ms, base_ms, peak,
                                     max_abs(o, base), note=str(dtype)[6:]))
        del base, out, x
        gc.collect()
    model.fast = FastPaths()
    return rows
