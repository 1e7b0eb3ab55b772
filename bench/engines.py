"""Engine vs eager vs torch.compile, same run, same input (image decode/encode at a static bucket).

CPU: AOTInductor engines of the tiny Wan 2.1 config (a real topology; full-size compiles take too
long on small CPUs). GPU: the real-size Qwen-Image/Wan 2.1 VAE (random weights) with AOTInductor,
and TensorRT when it is installed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from .common import BenchOptions, BenchRow, max_abs, time_ms


def _model(cpu: bool):
    from ..vae.wan.config import TINY_WAN21, WAN21
    from ..vae.wan.model import WanVAE

    torch.manual_seed(0)
    return WanVAE(TINY_WAN21 if cpu else WAN21).eval()


def run(opts: BenchOptions) -> list[BenchRow]:
    from ..trt.backend import get_backend, EngineError
    from ..trt.buckets import Bucket, static_table
    from ..trt.build import build_engine_set
    from ..trt.engine_set import EngineSet
    from ..trt.engine_vae import EngineVAE
    from ..trt.identity import model_hash
    from ..vae.api import TurboVAE, parse_dtype

    device = torch.device(opts.device)
    cpu = device.type == "cpu"
    dtype = parse_dtype(opts.dtype) or (torch.float32 if cpu else torch.bfloat16)
    size = 256 if cpu else 1024
    model32 = _model(cpu).to(device=device)  # engines are built from fp32 weights in the engine dtype
    weights_hash = model_hash(model32.state_dict())
    model = _model(cpu).to(device=device, dtype=dtype)
    vae = TurboVAE(model, source="random weights")
    rows: list[BenchRow] = []
    backends = ["aoti"] + ([] if cpu else ["tensorrt"])
    z = torch.randn(1, model.latent_format.channels, size // 8, size // 8, device=device, dtype=dtype)
    case = f"{'tiny' if cpu else 'real'} wan2.1 decode {size}x{size} {str(dtype)[6:]}"
    with torch.inference_mode():
        eager_ms, ref = time_ms(lambda: vae.decode(z), device, opts.repeat, opts.warmup)
    rows.append(BenchRow("engines", case, "eager", eager_ms))
    dec = model.image_decoder()
    compiled = torch.compile(dec)
    with torch.inference_mode():
        c_ms, c_out = time_ms(lambda: compiled(z), device, opts.repeat, max(opts.warmup, 1))
    rows.append(BenchRow("engines", case, "torch.compile", c_ms, baseline_ms=eager_ms, max_abs_err=max_abs(c_out, ref)))
    with tempfile.TemporaryDirectory() as tmp:
        for be in backends:
            try:
                get_backend(be).check_available(device)
                out_dir = Path(tmp) / be
                build_engine_set(TurboVAE(model32, source="random weights"), out_dir, static_table(Bucket(size, size)),
                                 backend=be, dtype=dtype, device=device, components=("decoder",))
                # Built straight from the in-memory model (the tiny config has no checkpoint loader).
                ev = EngineVAE(model, EngineSet(out_dir, device, model_hash=weights_hash))
                e_ms, e_out = time_ms(lambda: ev.decode(z), device, opts.repeat, opts.warmup)
                note = "" if ev.engine_calls else "FELL BACK to PyTorch"
                rows.append(BenchRow("engines", case, be, e_ms, baseline_ms=eager_ms,
                                     max_abs_err=max_abs(e_out, ref), note=note))
            except (EngineError, ImportError) as e:
                rows.append(BenchRow("engines", case, be, float("nan"), note=f"unavailable: {str(e)[:80]}"))
    return rows
