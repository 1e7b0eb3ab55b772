"""What a GPU's allocator does that the meta-tensor prediction cannot see, measured before planning for it.

Why: the planner (issue 40) predicts a pass's peak by running its code on meta tensors. On CUDA three things
sit outside that count: memory inside one op (cuDNN's layout copies and workspaces, attention kernels), the
speed of moving tensors between host and device (what a plan that keeps tensors in host memory pays), and
whether the tiled and layer-wise passes allocate what their meta runs allocate. This probe measures each on
the lent GPU, in that order (the cheapest first), and rewrites its JSON after every row, so a run cut short
keeps what it measured.

    python -m turbovae.bench.gpu_memory_probe --out DIR            # on the GPU
    python -m turbovae.bench.gpu_memory_probe --out DIR --dry-run  # CPU, tiny configs: the same steps
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..trt.fileio import atomic_write_text
from ..vae.api import TurboVAE
from ..vae.memory.peak import LiveBytes
from ..vae.registry import family
from ..vae.tiling.exact import run_exact
from ..vae.tiling.grid import TileGrid
from .common import environment
from .cases import for_section
from .models import seeded_init

MB = 2**20


class Probe:
    def __init__(self, out: Path, device: torch.device, dry_run: bool):
        self.path = out / "gpu-memory-probe.json"
        self.device, self.dry_run = device, dry_run
        self.payload = {"environment": environment(), "dry_run": dry_run, "rows": []}
        self.t0 = time.perf_counter()

    def add(self, part: str, **row) -> None:
        row = {"part": part, "t_s": round(time.perf_counter() - self.t0, 1), **row}
        self.payload["rows"].append(row)
        atomic_write_text(self.path, json.dumps(self.payload, indent=1), overwrite=True)
        print(json.dumps(row), flush=True)

    def peak(self, fn: Callable[[], object]) -> tuple[float, float, object]:
        """(peak MB above the start, ms, result) of fn: CUDA's allocator; on the CPU (dry run) LiveBytes."""
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            t = time.perf_counter()
            out = fn()
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) * 1e3
            return (torch.cuda.max_memory_allocated() - base) / MB, ms, out
        tracker = LiveBytes()
        t = time.perf_counter()
        with tracker:
            out = fn()
        return tracker.peak / MB, (time.perf_counter() - t) * 1e3, out


def nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def part_ops(p: Probe, dtype: torch.dtype) -> None:
    """Single ops: peak above input + output, per layout (what `LiveBytes` misses inside one op)."""
    dev = p.device
    sizes = [(128, 3, 270, 480), (256, 3, 540, 960), (512, 3, 270, 480), (128, 6, 540, 960), (96, 3, 360, 640)]
    if p.dry_run:
        sizes = [(8, 3, 16, 16)]
    for c, t, h, w in sizes:
        weight = torch.randn(c, c, 3, 3, 3, device=dev, dtype=dtype) * 0.02
        for layout in ("contiguous", "channels_last"):
            fmt = torch.channels_last_3d if layout == "channels_last" else torch.contiguous_format
            wl = weight.contiguous(memory_format=fmt)
            x = torch.randn(1, c, t, h, w, device=dev, dtype=dtype).contiguous(memory_format=fmt)
            try:
                for _ in range(2):  # the first call may pick an algorithm (benchmark off: heuristics)
                    mb, ms, y = p.peak(lambda: F.conv3d(x, wl, None, 1, (0, 1, 1)))
                    out_mb = nbytes(y) / MB
                    del y
                p.add("ops", op="conv3d k3", shape=[1, c, t, h, w], layout=layout, dtype=str(dtype), peak_mb=mb,
                      output_mb=out_mb, input_mb=nbytes(x) / MB, extra_mb=mb - out_mb, ms=ms)
            except Exception as e:  # noqa: BLE001 - a probe row records any failure
                p.add("ops", op="conv3d k3", shape=[1, c, t, h, w], layout=layout, error=repr(e)[:300])
            del x
        del weight
    # attention as the mid blocks run it: one head of 512 (SeedVR2) / 384 (Wan) channels over a frame's tokens
    for dim, tokens in ((512, 14400), (512, 32400), (384, 32400)):
        if p.dry_run:
            dim, tokens = 16, 64
        q = torch.randn(1, 1, tokens, dim, device=dev, dtype=dtype)
        try:
            mb, ms, o = p.peak(lambda: F.scaled_dot_product_attention(q, q, q))
            p.add("ops", op="sdpa", shape=[1, 1, tokens, dim], dtype=str(dtype), peak_mb=mb,
                  output_mb=nbytes(o) / MB, extra_mb=mb - nbytes(o) / MB, ms=ms)
            del o
        except Exception as e:  # noqa: BLE001
            p.add("ops", op="sdpa", shape=[1, 1, tokens, dim], error=repr(e)[:300])
        del q
        if p.dry_run:
            break


def part_transfer(p: Probe) -> None:
    """Pinned host <-> device copies on a side stream, alone and beside compute (what a host-held tensor costs)."""
    if p.device.type != "cuda":
        p.add("transfer", note="no CUDA device: skipped")
        return
    n = 512 * MB
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device=p.device)
    side = torch.cuda.Stream()
    for what, fn in (("h2d", lambda: dev.copy_(host, non_blocking=True)),
                     ("d2h", lambda: host.copy_(dev, non_blocking=True))):
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(4):
            fn()
        torch.cuda.synchronize()
        s = (time.perf_counter() - t) / 4
        p.add("transfer", direction=what, bytes=n, gb_per_s=n / s / 1e9)
    a = torch.randn(8192, 8192, device=p.device, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    alone = time.perf_counter() - t
    t = time.perf_counter()
    with torch.cuda.stream(side):
        for _ in range(4):
            dev.copy_(host, non_blocking=True)
            host.copy_(dev, non_blocking=True)
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    both = time.perf_counter() - t
    p.add("transfer", direction="overlap", matmul_alone_s=alone, matmul_with_copies_s=both,
          copied_bytes=8 * n)


def build(key: str, dtype: torch.dtype, device: torch.device, real: bool) -> TurboVAE:
    fam = family(key)
    model = seeded_init(fam.build_model(fam.config(real=real))).eval()
    return TurboVAE(model.to(device=device, dtype=dtype))


def meta_peak(vae: TurboVAE, shape: tuple, fn: Callable[[object, torch.Tensor], object]) -> float:
    """Peak MB of `fn(meta model, meta input)` counted by LiveBytes (the prediction's method) on a meta copy."""
    clone = vae.model.meta_copy().to(dtype=vae.dtype)
    clone.fast = vae.model.fast
    x = torch.empty(shape, device="meta", dtype=vae.dtype)
    tracker = LiveBytes(exclude=[x, *clone.parameters(), *clone.buffers()])
    with torch.inference_mode(), tracker:
        out = fn(clone, x)
    del out
    return tracker.peak / MB


def part_passes(p: Probe, dtype: torch.dtype) -> None:
    """Real passes: allocator peak vs the meta prediction, untiled (one latent per step) and exact tiles (the case
    table's passes: bench/cases.py; tiny configs in the dry run)."""
    real = not p.dry_run
    built: dict[str, TurboVAE] = {}
    for case in for_section("gpu_memory_probe", quick=p.dry_run, cuda=True):
        key, decode, shape, tile, ts = case.family, case.decode, case.shape, case.tile_latent, case.temporal_slice
        try:
            if key not in built:
                built.clear()
                gc.collect()
                if p.device.type == "cuda":
                    torch.cuda.empty_cache()
                built[key] = build(key, dtype, p.device, real)
            vae = built[key]
            x = torch.randn(shape, device=p.device, dtype=dtype).clamp_(-1, 1)
            lat_hw = (shape[-2], shape[-1]) if decode else (shape[-2] // vae.spatial_factor,
                                                            shape[-1] // vae.spatial_factor)

            def run(model, inp):
                if tile:
                    grid = TileGrid.build(*lat_hw, tile, 0)
                    return run_exact(model, inp, grid, decode=decode, temporal_slice=ts, progress=None)
                return model.decode_latents(inp, temporal_slice=ts) if decode else \
                    model.encode_moments(inp, temporal_slice=ts)

            with torch.inference_mode():
                run(vae.model, x)  # warm-up: self-checks, kernel compiles
                mb, ms, y = p.peak(lambda: run(vae.model, x))
            del y
            predicted = meta_peak(vae, shape, run)
            p.add("passes", family=key, direction="decode" if decode else "encode", shape=list(shape),
                  tile_latent=tile, temporal_slice=ts, dtype=str(dtype), measured_mb=mb, predicted_mb=predicted,
                  error_pct=(predicted - mb) / mb * 100 if mb else None, ms=ms,
                  fast=str(vae.model.active_fast()))
            del x
        except Exception as e:  # noqa: BLE001
            p.add("passes", family=key, shape=list(shape), tile_latent=tile, error=repr(e)[:400],
                  trace=traceback.format_exc()[-1500:])


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny configs (checks the script runs)")
    ap.add_argument("--parts", default="ops,transfer,passes")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu" if args.dry_run or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    p = Probe(args.out, device, args.dry_run)
    parts = {"ops": lambda: part_ops(p, dtype), "transfer": lambda: part_transfer(p),
             "passes": lambda: part_passes(p, dtype)}
    for name in args.parts.split(","):
        try:
            parts[name]()
        except Exception as e:  # noqa: BLE001 - the next part still runs
            p.add(name, error=repr(e)[:400], trace=traceback.format_exc()[-1500:])
    p.payload["complete"] = True
    atomic_write_text(p.path, json.dumps(p.payload, indent=1), overwrite=True)


if __name__ == "__main__":
    main()
