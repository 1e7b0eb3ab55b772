"""Byte roofline of the GPU cases (`--sections bytes`): FLOPs and bytes per layer kind, and the floor they set.

At 720p a clip pass moves far more bytes than its convolutions need, so a FLOP floor alone flatters it. Each
case of the GPU ablation (bench/gpu.py, CUDA sizes) and the clip cases the clip targets name are run once on
the meta device (no weights, no data: instant at 720p×81) under bench/op_costs.py's counter, which adds up per
kind (conv, copy/pad, concat, upsample, norm/act, attention, add/mul, other) the FLOPs and the bytes every
ATen operation reads and writes. The floor on a device (bench/device_peaks.py) is
max(FLOPs / peak FLOP/s, bytes / bandwidth): no schedule of the same operations beats it, and the larger term
says which resource bounds the pass. The bytes are what the operations touch (an upper bound on traffic when
caches hold nothing): a fused kernel that keeps a tensor on chip moves less, so the floor is that of the
operations as the eager pass issues them, the count a byte removal lowers.

The counted pass is ours with the default architecture paths in eager mode and unfused norms (what a device
without Triton runs, the "+ channels-last" step of the GPU ablation; the layout changes no byte count), and,
for the Wan cases, diffusers' AutoencoderKLWan, both in bf16. Measured GPU times from the committed H100 run
(`MEASURED_FILES`) are joined by case name: the time of the step that runs the counted operations (diffusers'
row for the reference) and, beside it, the best time of any step (fused norms, compile and graphs move fewer
bytes than the counted eager operations, so that one can pass the floor of the operations counted here).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import torch

from . import op_costs
from .common import BenchOptions, BenchRow
from .device_peaks import DEVICE_PEAKS, DevicePeak
from .cases import CutCase, Pass, for_section

SECTION = "bytes"
TABLE = "bytes"
DIFFUSERS = "diffusers AutoencoderKLWan eager"


def cases(quick: bool) -> tuple[Pass, ...]:
    """The passes counted (bench/cases.py): the GPU ablation's CUDA cases under bench/gpu.py's names (the measured
    rows are found by them) and the clip cases the clip targets name, each with the temporal slice the measured
    run used (None: whole clip), diffusers' pass counted beside for the Wan cases; `quick`: tiny configs."""
    return for_section("bytes_roofline", quick=quick, cuda=True)


@dataclass
class BytesRow(BenchRow):
    """One side of a case: counted FLOPs and bytes per kind, the floor on `device`, and (when a measured file
    holds the case) the measured time. `ms` is the floor; `measured_ms` the time it is held against."""

    table: str = TABLE
    device: str = ""
    gflop: Optional[float] = None
    gb_touched: Optional[float] = None
    gb_by_kind: dict = field(default_factory=dict)
    flop_floor_ms: Optional[float] = None
    byte_floor_ms: Optional[float] = None
    bound: str = ""
    measured_ms: Optional[float] = None  # the measured step that runs the counted operations
    pct_of_floor: Optional[float] = None  # floor / measured_ms, percent
    best_ms: Optional[float] = None  # the fastest measured step of the case (it may fuse operations away)
    best_path: str = ""


def _meta_model(key: str, quick: bool):
    """A registered family's (real or tiny) model on the meta device, default fast paths."""
    from ..vae.registry import family

    return family(key).meta_model(real=not quick).eval()


def _diffusers_model(model) -> Optional[torch.nn.Module]:
    try:
        from diffusers import AutoencoderKLWan
    except ImportError:
        return None
    from ..vae.wan.config import diffusers_kwargs

    with torch.device("meta"):
        return AutoencoderKLWan(**diffusers_kwargs(model.config)).eval()


def pass_of(model, case: Union[Pass, CutCase]) -> Callable[[torch.Tensor], torch.Tensor]:
    if case.kind == "decode":
        return lambda x: model.decode_latents(x, temporal_slice=case.temporal_slice)
    return lambda x: model.encode_moments(x, temporal_slice=case.temporal_slice)


def diffusers_pass_of(ref: torch.nn.Module, case: Pass) -> Callable[[torch.Tensor], torch.Tensor]:
    if case.kind == "decode":
        return lambda x: ref.decode(x).sample
    return lambda x: ref.encode(x).latent_dist.parameters


def floor_row(case_name: str, variant: str, costs: op_costs.Costs, peak: DevicePeak, dtype: torch.dtype,
              reference: bool = False) -> BytesRow:
    """The row of one counted pass: FLOPs, bytes by kind and the floor on `peak`'s device."""
    flops, nbytes = costs.total_flops, costs.total_bytes
    flop_ms, byte_ms = peak.flop_floor_ms(flops), peak.byte_floor_ms(nbytes)
    return BytesRow(SECTION, case_name, variant, max(flop_ms, byte_ms), reference=reference,
                    note=str(dtype).replace("torch.", ""), device=peak.name, gflop=flops / 1e9,
                    gb_touched=nbytes / 1e9, gb_by_kind={k: costs.bytes.get(k, 0.0) / 1e9 for k in op_costs.KINDS},
                    flop_floor_ms=flop_ms, byte_floor_ms=byte_ms,
                    bound="memory bandwidth" if byte_ms > flop_ms else "arithmetic")


def load_measured(paths: Sequence[Path]) -> list[dict]:
    """Rows of GPU results files (bench/gpu.py's JSON); a file that is not one is a ValueError naming it."""
    rows: list[dict] = []
    for path in paths:
        try:
            rows += json.loads(Path(path).read_text())["rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a benchmark results file ({type(e).__name__}: {e}); pass the JSON "
                             "that `python -m turbovae bench --sections gpu` wrote") from e
    return rows


COUNTED_STEP = "+ channels-last"  # bench/gpu.py's ablation step whose operations the count runs


def _finite(rows: Sequence[dict], case_name: str, reference: bool) -> list[dict]:
    return [r for r in rows if r.get("case") == case_name and isinstance(r.get("ms"), (int, float))
            and math.isfinite(r["ms"]) and (r.get("variant") == DIFFUSERS) == reference]


def attach_measured(row: BytesRow, measured: Sequence[dict]) -> BytesRow:
    """Join the measured rows of the row's case: diffusers' row for the reference side; for ours the
    `COUNTED_STEP` row, and the fastest step of all."""
    mine = _finite(measured, row.case, row.reference)
    counted = mine if row.reference else [r for r in mine if r.get("variant") == COUNTED_STEP]
    if counted:
        row.measured_ms = float(counted[0]["ms"])
        row.pct_of_floor = 100 * row.ms / row.measured_ms
    if mine:
        best = min(mine, key=lambda r: r["ms"])
        row.best_ms, row.best_path = float(best["ms"]), str(best["variant"])
    return row


def rows_for(passes: Sequence[Pass], quick: bool, dtype: torch.dtype, peak: DevicePeak,
             measured: Sequence[dict] = ()) -> list[BytesRow]:
    """Count every case on meta, ours and (Wan cases) diffusers', and hold each against the floor."""
    rows: list[BytesRow] = []
    models: dict[str, object] = {}
    for case in passes:
        if case.family not in models:
            models[case.family] = _meta_model(case.family, quick).to(dtype)
        model = models[case.family]
        x = torch.empty(case.shape, device="meta", dtype=dtype)
        sides: list[tuple[str, Callable, bool]] = []
        if case.diffusers:
            ref = _diffusers_model(model)
            if ref is not None:
                sides.append((DIFFUSERS, diffusers_pass_of(ref.to(dtype), case), True))
        sliced = f", temporal_slice={case.temporal_slice}" if case.temporal_slice else ""
        sides.append((f"turbovae (eager, default paths{sliced})", pass_of(model, case), False))
        for variant, fn, is_ref in sides:
            costs = op_costs.count(lambda: fn(x))
            rows.append(attach_measured(floor_row(case.name, variant, costs, peak, dtype, is_ref), measured))
    return rows


# `--sections bytes` has no option of its own for the measured files: the committed H100 run is read when
# present (docs/results), so the section's output is reproducible from the checkout alone.
MEASURED_FILES = ("docs/results/2026-11-26-nvidia-h100-80gb-hbm3.json",
                  "docs/results/2026-11-26-h100-w81.json")


def run(opts: BenchOptions) -> list[BenchRow]:
    """The section: every case counted in bf16 against the H100's floor, joined with the committed H100 run."""
    root = Path(__file__).resolve().parents[1]
    measured = load_measured([root / f for f in MEASURED_FILES if (root / f).exists()])
    passes = [c for c in cases(opts.quick) if not opts.cases or any(s in c.name for s in opts.cases)]
    return rows_for(passes, opts.quick, torch.bfloat16, DEVICE_PEAKS["H100"], measured)
