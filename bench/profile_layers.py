"""Where clips lose (`--sections profile`): time per kind of layer for clip and image passes, ours and reference.

For SeedVR2 and Wan 2.1, decode and encode, each of a clip and of a single image at the same size: the
reference (diffusers for Wan; our plain path for SeedVR2, whose original code cannot be installed) and
TurboVAE on the same weights and input (bench/main.py builds both sides, as for the main job). Each side runs
once to warm up, once under torch.profiler (self time per ATen operation, summed per kind by
bench/op_costs.py: convolutions, copies and pads, concatenation, upsampling and pixel shuffles, norms and
activations, attention, elementwise arithmetic), and once under the FLOP counter, so each row also says how
fast its convolutions ran (conv GFLOP/s). Per-frame times let a clip be compared with its image.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from ..vae.dtypes import working_dtype
from . import main, op_costs
from .common import BenchOptions, BenchRow
from .cases import for_section

SECTION = "profile"
TABLE = "profile"


@dataclass
class ProfileRow(BenchRow):
    """A BenchRow with the time per kind of operation (the report renders rows whose `table` is "profile")."""

    table: str = TABLE
    frames: int = 1
    ms_by_kind: dict = field(default_factory=dict)
    gflop_by_kind: dict = field(default_factory=dict)

    @property
    def conv_gflop_per_s(self) -> Optional[float]:
        conv_ms = self.ms_by_kind.get("conv", 0.0)
        return self.gflop_by_kind.get("conv", 0.0) / (conv_ms / 1e3) if conv_ms else None


def _cases(opts: BenchOptions, cuda: bool) -> tuple[main.Case, ...]:
    """The main job's kind of case at each of the case table's sizes (bench/cases.py)."""
    out = []
    for c in for_section("profile_layers", quick=opts.quick, cuda=cuda):
        what = f"{c.frames}-frame" if c.frames > 1 else "image"
        out.append(main.Case(f"{c.shown} {what} {c.kind} {c.height}²", c.family, c.kind, c.frames, c.height,
                             c.width))
    return tuple(c for c in out if not opts.cases or any(s in c.name for s in opts.cases))


def run(opts: BenchOptions) -> list[BenchRow]:
    device = torch.device(opts.device)
    dtype = working_dtype(opts.dtype, device)
    tag = str(dtype).replace("torch.", "")
    g = torch.Generator().manual_seed(0)
    rows: list[BenchRow] = []
    pair, family = None, None
    for case in _cases(opts, device.type == "cuda"):
        if case.family != family:
            pair = family = None
            pair, family = main.build_pair(case, opts, device, dtype), case.family
        x = pair.input(case, g).to(device=device, dtype=dtype)
        sides = ((True, pair.reference_name, pair.reference), (False, pair.ours_name, pair.ours))
        for _, _, fn in sides:
            with torch.inference_mode():
                fn(x)  # warm-up: first-call work (kernel selection, derived weights) is not profiled
        best: list[Optional[dict]] = [None, None]
        for _ in range(max(opts.repeat, 1)):  # sides alternate; each keeps its least disturbed (fastest) run
            for i, (_, _, fn) in enumerate(sides):
                ms = op_costs.time_by_kind(lambda: fn(x), device)
                if best[i] is None or sum(ms.values()) < sum(best[i].values()):
                    best[i] = ms
        for (reference, name, fn), ms in zip(sides, best):
            costs = op_costs.count(lambda: fn(x))
            rows.append(ProfileRow(SECTION, case.name, name, sum(ms.values()), note=f"{tag}; fastest of {opts.repeat}",
                                   reference=reference, frames=case.frames,
                                   ms_by_kind={k: round(v, 2) for k, v in ms.items()},
                                   gflop_by_kind={k: round(v / 1e9, 4) for k, v in costs.flops.items()}))
    return rows
