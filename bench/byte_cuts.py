"""Byte cuts (`--sections cuts`): each removal of non-convolution bytes, counted and timed against its absence.

A byte cut is a fast path that makes a pass move fewer bytes without changing its result (a norm writing straight
into the padded input a causal conv reads, instead of the conv concatenating history and input). For every cut and
every clip case it serves, in one run:

- the bytes the pass touches at the GPU case's size (bench/bytes_roofline.py's counter on the meta device, the
  counted eager pass with unfused norms), with the cut and without it, and so the bytes it removes;
- the pass timed on this machine at a CPU size (seeded real-config weights, several slices so the cut's later
  slices run), with and without the cut, alternating in rounds whose order rotates, and the largest difference
  between the two outputs (a cut is exact: it must be 0 up to fp32 summation order).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from . import op_costs
from .bytes_roofline import pass_of
from .fidelity import model_shapes
from .cases import CutCase, for_section
from .common import BenchOptions, BenchRow, interleaved_ms
from ..vae.seeded_weights import fan_in_weights
from ..vae.accel.switches import FastPaths

SECTION = "cuts"
TABLE = "cuts"


def cuts(quick: bool) -> dict[str, tuple[CutCase, ...]]:
    """The fast paths that are byte cuts, with the cases each serves (bench/cases.py; `quick`: a tiny size)."""
    out: dict[str, tuple[CutCase, ...]] = {}
    for case in for_section("byte_cuts", quick=quick, cuda=True):
        out[case.cut] = out.get(case.cut, ()) + (case,)
    return out


@dataclass
class CutRow(BenchRow):
    """One side of a cut on one case: `ms` is the CPU time at `cpu_shape`; `gb_touched` the bytes counted at the
    GPU size; on the side with the cut, `gb_removed` and `max_abs_err` (against the side without it)."""

    table: str = TABLE
    cut: str = ""
    gpu_shape: tuple = ()
    cpu_shape: tuple = ()
    gb_touched: Optional[float] = None
    gb_by_kind: Optional[dict] = None
    gb_removed: Optional[float] = None
    rounds_ms: Optional[list] = None


def counted_gb(model, case: CutCase, fast: FastPaths, dtype: torch.dtype) -> op_costs.Costs:
    """The counted pass at the GPU size on a meta `model` running `fast`."""
    model.fast = fast
    x = torch.empty(case.gpu_shape, device="meta", dtype=dtype)
    run = pass_of(model, case)
    return op_costs.count(lambda: run(x))


def _cpu_model(family: str):
    from ..vae.loader import load_checkpoint

    return load_checkpoint(fan_in_weights(model_shapes(family), 0), dtype=torch.float32, device="cpu").model


def rows_for(by_cut: dict[str, Sequence[CutCase]], repeat: int, dtype: torch.dtype = torch.bfloat16) -> list[CutRow]:
    from ..vae.registry import family as registry_family

    rows: list[CutRow] = []
    for cut, cases in by_cut.items():
        for case in cases:
            with_cut, without = FastPaths(), FastPaths().without(cut)
            meta = registry_family(case.family).meta_model(real=True).to(dtype)
            if cut not in meta.fast_fields:
                raise ValueError(f"{cut} is not a fast path of {case.family} ({meta.fast_fields})")
            costs = {name: counted_gb(meta, case, fast, dtype) for name, fast in (("on", with_cut), ("off", without))}
            del meta
            model = _cpu_model(case.family)
            g = torch.Generator().manual_seed(0)
            x = torch.randn(case.cpu_shape, generator=g).clamp_(-1, 1)
            run = pass_of(model, case)

            def side(fast: FastPaths) -> Callable[[], torch.Tensor]:
                def call() -> torch.Tensor:
                    model.fast = fast
                    with torch.inference_mode():
                        return run(x)
                return call

            fns = [side(with_cut), side(without)]
            for fn in fns:  # warm-up
                fn()
            times, outs = interleaved_ms(fns, "cpu", repeat, rotate=True)
            err = (outs[0].double() - outs[1].double()).abs().max().item()
            off_gb = costs["off"].total_bytes / 1e9
            for label, ts, cost, is_ref in ((f"with {cut}", times[0], costs["on"], False),
                                            (f"without {cut}", times[1], costs["off"], True)):
                gb = cost.total_bytes / 1e9
                rows.append(CutRow(SECTION, case.name, label, statistics.median(ts),
                                   baseline_ms=statistics.median(times[1]), reference=is_ref,
                                   max_abs_err=None if is_ref else err, note=str(dtype).replace("torch.", "") +
                                   " bytes; fp32 CPU time", cut=cut, gpu_shape=case.gpu_shape,
                                   cpu_shape=case.cpu_shape, gb_touched=gb,
                                   gb_by_kind={k: cost.bytes.get(k, 0.0) / 1e9 for k in op_costs.KINDS},
                                   gb_removed=None if is_ref else off_gb - gb,
                                   rounds_ms=[round(t, 1) for t in ts]))
    return rows


def run(opts: BenchOptions) -> list[BenchRow]:
    chosen = {cut: tuple(c for c in cases if not opts.cases or any(s in c.name for s in opts.cases))
              for cut, cases in cuts(opts.quick).items()}
    return rows_for({k: v for k, v in chosen.items() if v}, opts.repeat)
