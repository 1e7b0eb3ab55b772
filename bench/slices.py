"""Temporal slice cost: a clip decoded whole vs in fixed slices vs the slice TurboVAE picks, same run.

Why: slicing is exact (the causal cache is carried), so the slice size is free to choose for speed within
the memory budget. `vae/memory/device.py` FASTEST_SLICE holds, per device type, the slice these rows measured
fastest; this section is what keeps that table honest. Runs alternate between the variants (round-robin,
`repeat` rounds after one warm-up round) so machine load hits them alike; each variant's minimum is shown.

CPU (fp32): SeedVR2 21 frames at 64² and 128², Wan 2.1 81 frames at 64². CUDA (bench dtype): SeedVR2 21 frames at
512², Wan 2.1 81 frames at 480×832 (bench/cases.py). `--quick`: tiny configs.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..vae.api import TurboVAE
from ..vae.dtypes import working_dtype
from .common import BenchOptions, BenchRow, interleaved_ms
from ..vae.measuring import max_abs, sync
from .cases import Pass, for_section
from .models import family_model, seeded_init

SECTION = "slices"
FIXED = (1, 2, 4)


def _vae(key: str, quick: bool, device: torch.device, dtype: torch.dtype) -> TurboVAE:
    model = family_model(key, real=not quick)
    return TurboVAE(seeded_init(model).to(device=device, dtype=dtype))


def _cases(opts: BenchOptions, cuda: bool) -> tuple[Pass, ...]:
    return for_section("slices", quick=opts.quick, cuda=cuda)


def run(opts: BenchOptions) -> list[BenchRow]:
    device = torch.device(opts.device)
    cuda = device.type == "cuda"
    dtype = working_dtype(opts.dtype, device)
    g = torch.Generator().manual_seed(0)
    rows: list[BenchRow] = []
    for sliced in _cases(opts, cuda):
        case, shape = sliced.name, sliced.shape
        if opts.cases and not any(c in case for c in opts.cases):
            continue
        vae = _vae(sliced.family, opts.quick, device, dtype)
        z = torch.randn(shape, generator=g).to(device=device, dtype=dtype)
        auto = vae.plan(shape, decode=True, mode="auto").temporal_slice  # what the planner takes for the default budget
        variants: dict[str, Optional[int]] = {"whole clip": None}
        variants.update({f"slice={k}": k for k in FIXED if k < shape[2] - 1})
        variants[f"auto (slice={auto})"] = auto

        def runner(ts: Optional[int]) -> Callable[[], torch.Tensor]:
            return lambda: vae.model.decode_latents(z, temporal_slice=ts)

        fns = {name: runner(ts) for name, ts in variants.items()}
        with torch.inference_mode():
            outs = {name: fn() for name, fn in fns.items()}  # warm-up round, and the outputs compared
            sync(device)
            runs_ms, _ = interleaved_ms(list(fns.values()), device, opts.repeat)
        times = dict(zip(fns, runs_ms))
        base = min(times["whole clip"])
        for name, ts in times.items():
            runs = "/".join(f"{t / 1e3:.2f}" for t in ts)
            rows.append(BenchRow(SECTION, case, name, min(ts), base, max_abs_err=max_abs(outs[name], outs["whole clip"]),
                                 note=f"{str(dtype)[6:]}; min of {len(ts)} interleaved runs (s: {runs})"))
        del vae, z, outs
    return rows
