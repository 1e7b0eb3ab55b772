"""Roofline of the main job (`--sections roofline`): how close each case runs to what this machine can do.

In one run: this machine's peaks are measured (a large 3x3x3 conv3d, a large 3x3 conv2d and a large GEMM in
the bench dtype, best of `repeat` runs, and a large copy for memory bandwidth), then every main-job case
(bench/main.py, both sides, timed as the main job times them) is counted once more under
bench/op_costs.py: FLOPs from the real layer shapes and the bytes its operations touch. Each case's row gives
its achieved GFLOP/s, the percent of the peak that bounds it (the conv peak where convolutions do most of the
FLOPs, else the GEMM peak), and its arithmetic intensity against the machine's ridge point
(peak FLOP/s / bandwidth): below the ridge the roofline says memory bandwidth bounds it, above it arithmetic.

The same run counts, on the meta device (no weights, instant), the FLOPs of the clip lengths and sizes the
clip targets name (bench/cases.py), ours and reference: the time those FLOPs need at the measured conv peak is a
floor no formulation of the same operations can beat, and the FLOP ratio is the speedup fewer FLOPs alone give.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..vae.dtypes import working_dtype
from ..vae.norms import matmul
from ..vae.registry import family
from . import main, op_costs
from .common import BenchOptions, BenchRow
from ..vae.measuring import sync
from .cases import for_section

SECTION = "roofline"
TABLE = "roofline"


@dataclass
class RooflineRow(BenchRow):
    """A BenchRow with the roofline's numbers (the report renders rows whose `table` is "roofline")."""

    table: str = TABLE
    gflop: Optional[float] = None
    gflop_per_s: Optional[float] = None
    gb_touched: Optional[float] = None  # bytes the operations read + wrote (machine peaks: bytes copied)
    gb_per_s: Optional[float] = None
    peak_used: str = ""  # which measured peak bounds this case
    pct_of_peak: Optional[float] = None
    flop_per_byte: Optional[float] = None
    bound: str = ""


@dataclass(frozen=True)
class PeakProbe:
    """One operation that shows a machine limit; `make` builds its inputs, `run` is what is timed."""

    name: str
    make: Callable[[torch.device, torch.dtype], tuple]
    run: Callable[..., torch.Tensor]


def _conv3d_inputs(c: int, t: int, hw: int):
    return lambda d, dt: (torch.randn(1, c, t + 2, hw + 2, hw + 2, device=d, dtype=dt),
                          torch.randn(c, c, 3, 3, 3, device=d, dtype=dt) / (27 * c) ** 0.5)


def _conv2d_inputs(c: int, hw: int):
    return lambda d, dt: (torch.randn(1, c, hw + 2, hw + 2, device=d, dtype=dt),
                          torch.randn(c, c, 3, 3, device=d, dtype=dt) / (9 * c) ** 0.5)


def _gemm_inputs(n: int):
    return lambda d, dt: (torch.randn(n, n, device=d, dtype=dt), torch.randn(n, n, device=d, dtype=dt))


def probes(device: torch.device, quick: bool) -> tuple[PeakProbe, ...]:
    """Sizes large enough to reach the peak (GPU: larger), small with `--quick` (the test of the job)."""
    cuda = device.type == "cuda"
    c, hw, n, mib = (64, 16, 256, 16) if quick else (512, 128, 8192, 1024) if cuda else (512, 32, 2048, 256)
    return (
        PeakProbe(f"conv3d 3×3×3 {c}→{c}, 5×{hw}²", _conv3d_inputs(c, 5, hw), torch.nn.functional.conv3d),
        PeakProbe(f"conv2d 3×3 {c}→{c}, {2 * hw}²", _conv2d_inputs(c, 2 * hw), torch.nn.functional.conv2d),
        PeakProbe(f"GEMM {n}×{n}×{n}", _gemm_inputs(n), torch.mm),
        # The same product through `vae.norms.matmul` (a 1×1 conv on CPU): the baseline above, in the same run.
        PeakProbe(f"matmul {n}×{n}×{n} (ops.matmul)", _gemm_inputs(n), matmul),
        PeakProbe(f"copy {mib} MiB", lambda d, dt: (torch.empty(mib * 2**20 // 4, device=d),
                                                  torch.randn(mib * 2**20 // 4, device=d)),
                  lambda dst, src: dst.copy_(src)),
    )


def measure_peak(probe: PeakProbe, device: torch.device, dtype: torch.dtype, repeat: int) -> RooflineRow:
    """Best time of `repeat` runs after a warm-up; FLOPs and bytes counted as the cases' are."""
    args = probe.make(device, dtype)
    with torch.inference_mode():
        probe.run(*args)
        sync(device)
        best = float("inf")
        for _ in range(max(repeat, 2)):
            t0 = time.perf_counter()
            probe.run(*args)
            sync(device)
            best = min(best, time.perf_counter() - t0)
    costs = op_costs.count(lambda: probe.run(*args))
    flops, nbytes = costs.total_flops, costs.total_bytes
    if flops == 0:  # the copy: its bytes are its work (read + write)
        return RooflineRow(SECTION, "machine peak", probe.name, best * 1e3, gb_touched=nbytes / 1e9,
                           gb_per_s=nbytes / best / 1e9, note=f"{dtype_tag(torch.float32)}; best of {repeat}")
    return RooflineRow(SECTION, "machine peak", probe.name, best * 1e3, gflop=flops / 1e9,
                       gflop_per_s=flops / best / 1e9, gb_touched=nbytes / 1e9, flop_per_byte=flops / nbytes,
                       note=f"{dtype_tag(dtype)}; best of {repeat}")


def dtype_tag(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class Peaks:
    conv_gflop_per_s: float  # the better of the two conv probes
    gemm_gflop_per_s: float
    gb_per_s: float


def peaks_of(rows: list[RooflineRow]) -> Peaks:
    conv = max(r.gflop_per_s for r in rows if r.variant.startswith("conv"))
    gemm = max(r.gflop_per_s for r in rows if r.variant.startswith("GEMM"))
    return Peaks(conv, gemm, max(r.gb_per_s for r in rows if r.gflop is None))


def case_row(case_name: str, row: BenchRow, costs: op_costs.Costs, peaks: Peaks) -> RooflineRow:
    """The roofline numbers of one side of a case from its time and counted costs."""
    flops, nbytes = costs.total_flops, costs.total_bytes
    conv_bound = costs.flops.get("conv", 0.0) >= 0.5 * flops
    peak = peaks.conv_gflop_per_s if conv_bound else peaks.gemm_gflop_per_s
    achieved = flops / (row.ms / 1e3) / 1e9
    intensity = flops / nbytes if nbytes else None
    ridge = peak / peaks.gb_per_s  # FLOP/byte where bandwidth stops bounding
    bound = ("memory bandwidth" if intensity is not None and intensity < ridge
             else "conv arithmetic" if conv_bound else "GEMM arithmetic")
    return RooflineRow(SECTION, case_name, row.variant, row.ms, row.baseline_ms, row.peak_mb, note=row.note,
                       reference=row.reference, gflop=flops / 1e9, gflop_per_s=achieved, gb_touched=nbytes / 1e9,
                       gb_per_s=nbytes / (row.ms / 1e3) / 1e9, peak_used="conv" if conv_bound else "GEMM",
                       pct_of_peak=100 * achieved / peak, flop_per_byte=intensity, bound=bound)


@dataclass
class FlopRow(BenchRow):
    """FLOPs of one side of a clip case counted on the meta device (no weights, no time): `ms` is the time
    the FLOPs need at the measured conv peak, so `speedup` is the reference's FLOPs over ours."""

    table: str = "flops"
    gflop: Optional[float] = None
    gb_touched: Optional[float] = None
    flop_per_byte: Optional[float] = None


def _meta_sides(arch: str, quick: bool) -> tuple[tuple[str, Callable], tuple[str, Callable], int, int, int]:
    """(reference name, fn), (ours name, fn) and the latent layout of the registered family `arch`, models built
    on the meta device: the reference is the family's diffusers class, or its plain path (as the main job)."""
    from ..vae.accel.switches import FastPaths

    fam = family(arch)
    cfg = fam.config(real=not quick)

    def side(fast: Optional[FastPaths] = None) -> Callable:
        """A side on its own model (its weights laid out for its paths once): `fast`, or the family's defaults."""
        with torch.device("meta"):
            model = fam.build_model(cfg).eval()
            if fast is not None:
                model.fast = fast

        def run(x: torch.Tensor) -> torch.Tensor:
            return model.decode_latents(x) if x.shape[1] == lf.channels else model.encode_moments(x)
        return run

    with torch.device("meta"):
        lf = fam.build_model(cfg).latent_format
    layout = (lf.channels, lf.spatial_factor, lf.temporal_factor)
    diffusers = None
    if fam.diffusers_reference:
        try:
            import diffusers
        except ImportError:
            diffusers = None
    if diffusers is None:
        label = ("plain path (diffusers missing)" if fam.diffusers_reference
                 else f"plain path (original {fam.title} not installable)")
        return (label, side(FastPaths.plain())), ("turbovae", side()), *layout
    with torch.device("meta"):
        ref = getattr(diffusers, fam.diffusers_reference)(**fam.diffusers_kwargs(cfg)).eval()
    reference = (f"diffusers {fam.diffusers_reference}",
                 lambda x: ref.decode(x).sample if x.shape[1] == lf.channels else ref.encode(x).latent_dist.parameters)
    return reference, ("turbovae", side()), *layout


def flop_rows(opts: BenchOptions, dtype: torch.dtype, peaks: Peaks) -> list[FlopRow]:
    """FLOPs and touched bytes of the clip cases (bench/cases.py: the clip lengths and sizes the clip targets name;
    `--quick`: a quarter of each side), ours and reference, counted on meta tensors (instant)."""
    rows: list[FlopRow] = []
    sides_of: dict[str, tuple] = {}
    for case in for_section("roofline"):
        if case.family not in sides_of:
            sides_of[case.family] = _meta_sides(case.family, opts.quick)
        (ref_name, ref), (our_name, ours), latent, spatial, temporal = sides_of[case.family]
        kind, frames, hw = case.kind, case.frames, case.height // 4 if opts.quick else case.height
        what = f"{frames}-frame" if frames > 1 else "image"
        name = f"{case.shown} {what} {kind} {hw}²"
        if opts.cases and not any(c in name for c in opts.cases):
            continue
        shape = ((1, 3, frames, hw, hw) if kind == "encode"
                 else (1, latent, 1 + (frames - 1) // temporal, hw // spatial, hw // spatial))
        x = torch.empty(shape, device="meta", dtype=dtype)
        costs = [op_costs.count(lambda: fn(x)) for fn in (ref, ours)]
        ms = [c.total_flops / (peaks.conv_gflop_per_s * 1e9) * 1e3 for c in costs]
        for (variant, c, t, is_ref) in ((ref_name, costs[0], ms[0], True), (our_name, costs[1], ms[1], False)):
            rows.append(FlopRow(SECTION, name, variant, t, ms[0], reference=is_ref, note=dtype_tag(dtype),
                                gflop=c.total_flops / 1e9, gb_touched=c.total_bytes / 1e9,
                                flop_per_byte=c.total_flops / c.total_bytes if c.total_bytes else None))
    return rows


def run(opts: BenchOptions) -> list[BenchRow]:
    device = torch.device(opts.device)
    dtype = working_dtype(opts.dtype, device)
    peak_rows = [measure_peak(p, device, dtype, max(opts.repeat, 3)) for p in probes(device, opts.quick)]
    costs: dict[str, tuple[op_costs.Costs, op_costs.Costs]] = {}

    def count_case(case: main.Case, pair: main.Pair, x: torch.Tensor) -> None:
        costs[case.name] = (op_costs.count(lambda: pair.reference(x)), op_costs.count(lambda: pair.ours(x)))

    peaks = peaks_of(peak_rows)
    rows: list[BenchRow] = peak_rows + flop_rows(opts, dtype, peaks)
    for ref_row, our_row in main.run_cases(opts, inspect=count_case):
        ref_costs, our_costs = costs[ref_row.case]
        rows += [case_row(ref_row.case, ref_row, ref_costs, peaks), case_row(our_row.case, our_row, our_costs, peaks)]
    return rows
