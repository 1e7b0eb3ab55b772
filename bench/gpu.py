"""GPU fast-path ablation: each step adds one lever on top of the previous ones, same weights, same run.

Steps: eager baseline (every architecture fast path off) -> image path / architecture fast paths ->
channels-last -> fused Triton norms -> torch.compile (per region) -> CUDA graphs; then each lever alone
on the eager baseline (channels-last, fused norms, compile) and the architecture paths with fused norms on
contiguous tensors, so a default can be judged by what each path does alone as well as cumulatively
(vae/gpu_defaults.py). Engines are measured by the `engines` section. Each row: median ms, peak CUDA memory, PSNR and max error
against the fp32 eager baseline, and (CUDA) the share of the dense-bf16 FLOP floor reached.

No case aborts the run: the fp32 reference runs in the temporal slices the public path (`TurboVAE.decode`)
would use, with the architecture's fast paths (exact in fp32, and what that slice choice is sized for), and
halves its slice after an out-of-memory (exact by construction) down to one latent; an out-of-memory in a step
(or the diffusers baseline) is that step's row, with the error, and the case goes on with the next step.
Out-of-memory is decided by type (vae/memory/oom.py). `--inject-oom CASE_KEY:VARIANT` (`BenchOptions.inject_oom`,
or a case's own `faults`) makes a variant's first run a simulated out-of-memory: the GPU run's dry run uses it,
so the CPU run exercises the out-of-memory rows.

CUDA cases: Qwen-Image 1024² and 1328² encode and decode; SeedVR2 1080p image decode and 720p×21
decode. CPU (no GPU here): the same code at 64² with fp32 and the CUDA-only steps skipped;
`--quick`: tiny configs (topology only) so the smoke test takes seconds. Random seeded weights
unless `--qwen-checkpoint` / `--seedvr2-checkpoint` are given.
"""

from __future__ import annotations

import copy
import gc
import logging
import math
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from ..trt.video import supports_video
from ..vae.accel.compile import CompileSettings, apply_compile, compile_failed, remove_compile
from ..vae.accel.cuda_graphs import CudaGraphRunner
from ..vae.dtypes import working_dtype
from ..vae.accel.kernels import triton_available
from ..vae.norms import fused_norms
from ..vae.memory.budget import BudgetTooSmall, default_budget_bytes
from ..vae.planning import PlanRequest, fastest_fitting_plan
from ..vae.memory.oom import OutOfMemory, attempt, is_out_of_memory, release_cached
from ..vae.planning.meta_pass import MetaPasses, PassPaths
from .common import BenchOptions, BenchRow, cuda_peak_mb, time_ms
from ..vae.measuring import max_abs, psnr
from .device_peaks import DEVICE_PEAKS
from .op_costs import EXTRA_FLOP_FORMULAS
from .cases import AUTO, AblationCase, for_section
from .gpu_run import CASE_KEYS
from .models import build_model

SECTION = "gpu"
log = logging.getLogger("turbovae")

# Dense bf16 tensor-core peak (TFLOP/s) for the floor column, from the one table of device peaks.
PEAK_TFLOPS = {k: p.bf16_tflops for k, p in DEVICE_PEAKS.items()}


REFERENCE = "fp32 reference"  # AblationCase.faults names for the passes that are not steps
DIFFUSERS = "diffusers AutoencoderKLWan eager"


class InjectedOutOfMemory(torch.OutOfMemoryError):
    """The simulated out-of-memory of a case's `faults` (a real `torch.OutOfMemoryError` by type)."""


def variant_names() -> tuple[str, ...]:
    """The names `AblationCase.faults` and `--inject-oom` accept."""
    return (REFERENCE, DIFFUSERS, *(s.name for s in STEPS))


def parse_injected(entries: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """{case key: variants} from "CASE_KEY:VARIANT" entries; ValueError naming the accepted variants."""
    found: dict[str, tuple[str, ...]] = {}
    for entry in entries:
        key, sep, variant = entry.partition(":")
        if not sep or not key or variant not in variant_names():
            raise ValueError(f"--inject-oom {entry!r}: expected CASE_KEY:VARIANT with VARIANT one of "
                             f"{', '.join(repr(v) for v in variant_names())}")
        found[key] = found.get(key, ()) + (variant,)
    return found


class _Faults:
    """Each variant named in the case's `faults` (and `extra`) fails once, on its first run, with
    InjectedOutOfMemory."""

    def __init__(self, case: AblationCase, extra: Sequence[str] = ()):
        self.pending = set(case.faults) | set(extra)

    def wrap(self, variant: str, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            if variant in self.pending:
                self.pending.discard(variant)
                raise InjectedOutOfMemory(f"simulated out of memory in '{variant}' (injected by the case's faults)")
            return fn()
        return run


def cases(cuda: bool, quick: bool) -> list[AblationCase]:
    """The cases (bench/cases.py). CUDA cases come in the GPU run's priority order (bench/gpu_run.py CASE_KEYS;
    a test checks that every key has its case), and so do their twins. `quick` has tiny-config twins (same keys)
    of one image case, one SeedVR2 clip and the diffusers-baseline Wan clip, so the GPU run's dry run covers each
    kind in seconds (it also injects out-of-memory failures into the SeedVR2 twin: `BenchOptions.inject_oom`)."""
    chosen = list(for_section("gpu", quick=quick, cuda=cuda))
    return sorted(chosen, key=lambda c: CASE_KEYS.index(c.key) if c.key in CASE_KEYS else len(CASE_KEYS))


def set_arch_paths(model: nn.Module, *, fast: bool, channels_last: bool) -> None:
    """Switch the architecture's own fast paths (`model.fast`, a `FastPaths`): all on or all off, with
    channels-last as asked, and exactly those (the per-architecture GPU defaults of vae/gpu_defaults.py
    do not switch any off)."""
    from ..vae.accel.switches import FastPaths

    paths = FastPaths() if fast else FastPaths.plain()
    model.follow_gpu_defaults = False  # each step measures the paths it names, not the measured defaults
    model.fast = replace(paths, channels_last=channels_last)


def predicted_peak_mb(copies: MetaPasses, case: AblationCase, dtype: torch.dtype, temporal_slice: Optional[int],
                      step: "Step", model: nn.Module) -> Optional[float]:
    """The step's pass peak predicted on meta tensors with the paths it runs (what `cuda_peak_mb` measures: the
    rise above the memory held before the pass); compile and CUDA graphs run the fused step's ops in it."""
    try:
        p = copies.predict(case.shape, decode=case.kind == "decode", dtype=dtype, temporal_slice=temporal_slice,
                           paths=PassPaths(model.fast, step.fused, "cuda"))
    except Exception:  # noqa: BLE001 - the prediction is informative only; the measured row stands
        log.warning("bench gpu: predicting the peak of %s / %s failed", case.name, step.name, exc_info=True)
        return None
    return p.pass_bytes / 2**20


def _call(model: nn.Module, case: AblationCase,
          temporal_slice: Optional[int]) -> Callable[[torch.Tensor], torch.Tensor]:
    if case.kind == "decode":
        return lambda x: model.decode_latents(x, temporal_slice=temporal_slice)
    return lambda x: model.encode_moments(x, temporal_slice=temporal_slice)


def resolve_slice(model: nn.Module, case: AblationCase, dtype: torch.dtype, device: torch.device) -> Optional[int]:
    """The case's temporal slice; AUTO is the slice of the fastest untiled plan whose predicted peak fits the
    default budget on `device` (vae/planning; the ablation measures the untiled pass), one latent when none does."""
    if case.temporal_slice != AUTO:
        return case.temporal_slice
    try:
        return fastest_fitting_plan(model, case.shape, decode=case.kind == "decode",
                                    budget_bytes=default_budget_bytes(device),
                                    paths=PassPaths.of(model, device, dtype), dtype=dtype,
                                    request=PlanRequest(allow_tiles=False, allow_host=False)).temporal_slice
    except BudgetTooSmall:
        return 1


def diffusers_baseline(model: nn.Module, case: AblationCase) -> Optional[nn.Module]:
    """diffusers' AutoencoderKLWan with the same weights (fp32, CPU), or None when diffusers is missing."""
    try:
        from diffusers import AutoencoderKLWan
    except ImportError:
        return None
    from ..vae.wan.config import diffusers_kwargs

    ref = AutoencoderKLWan(**diffusers_kwargs(model.config)).eval()
    ref.load_state_dict({k: v.float().cpu() for k, v in model.state_dict().items()})
    return ref


def _diffusers_call(ref: nn.Module, case: AblationCase) -> Callable[[torch.Tensor], torch.Tensor]:
    if case.kind == "decode":
        return lambda x: ref.decode(x).sample
    return lambda x: ref.encode(x).latent_dist.parameters


def conv_flops(model: nn.Module, case: AblationCase, x: torch.Tensor,
               temporal_slice: Optional[int] = None) -> Optional[float]:
    """FLOPs of one pass as counted by torch's FlopCounterMode (convs, matmuls, attention)."""
    try:
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False, custom_mapping=EXTRA_FLOP_FORMULAS)
        with counter, torch.inference_mode():
            _call(model, case, temporal_slice)(x)
        return float(counter.get_total_flops())
    except Exception:  # counting is informative only
        return None


def step_flops(model: nn.Module, case: AblationCase, x: torch.Tensor, temporal_slice: Optional[int], step: "Step",
               counted: dict[bool, Optional[float]]) -> Optional[float]:
    """The FLOPs of the pass a step runs, counted once per setting of the architecture paths (`counted`
    caches them): the image path and the other architecture paths change the FLOPs, layout and kernels do
    not. Called before compile is applied, so the count runs the eager pass."""
    if step.fast not in counted:
        counted[step.fast] = conv_flops(model, case, x, temporal_slice)
        if counted[step.fast] is None and x.device.type == "cuda":
            release_cached(x.device)  # a counting pass that failed may have left its memory cached
    return counted[step.fast]


# -- the ablation --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    name: str
    fast: bool
    channels_last: bool
    fused: bool
    compiled: bool
    graphs: bool
    cuda_only: bool


STEPS = [
    Step("eager baseline", False, False, False, False, False, False),
    Step("+ image path / arch fast paths", True, False, False, False, False, False),
    Step("+ channels-last", True, True, False, False, False, False),
    Step("+ fused norms (Triton)", True, True, True, False, False, True),
    Step("+ compile (per region)", True, True, True, True, False, True),
    Step("+ CUDA graphs", True, True, True, True, True, True),
]
# Each path alone on the eager baseline (the cumulative steps above show it only on top of the ones before),
# and the architecture paths with fused norms on contiguous tensors (the combination the cumulative order skips).
ALONE_STEPS = [
    Step("alone: channels-last", False, True, False, False, False, False),
    Step("alone: fused norms (Triton)", False, False, True, False, False, True),
    Step("alone: compile (per region)", False, False, False, True, False, True),
    Step("arch fast paths + fused norms, contiguous", True, False, True, False, False, True),
]


def engine_build_kwargs(model: nn.Module, case: AblationCase) -> Optional[dict]:
    """What to build for a case: the decoder or encoder engine for images, the video slice engines for a
    clip of a model with the causal-step contract; None when no engine can serve it (clip encodes)."""
    if case.kind == "encode":
        return {"components": ("encoder",)} if case.shape[2] == 1 else None
    if case.shape[2] == 1:
        return {"components": ("decoder",)}
    return {"components": (), "video": True} if supports_video(model) else None


def engine_step_rows(opts: BenchOptions, model32: nn.Module, model: nn.Module, case: AblationCase, x: torch.Tensor,
                     reference: torch.Tensor, baseline_ms: Optional[float], device: torch.device,
                     dtype: torch.dtype) -> list[BenchRow]:
    """The ablation's last step: the case on engines built for exactly its size (a static bucket at the
    pixel size rounded up to 16 px; inputs are padded to it and outputs cropped back, as in use)."""
    from ..trt.buckets import Bucket, static_table
    from .engines import EngineUse, engine_rows, engine_vae

    kw = engine_build_kwargs(model, case)
    if kw is None:
        return [BenchRow(SECTION, case.name, "+ engine", float("nan"), note="no engine serves this case")]
    f = model.latent_format.spatial_factor
    h, w = (case.shape[-2] * f, case.shape[-1] * f) if case.kind == "decode" else case.shape[-2:]
    table = static_table(Bucket(-(-h // 16) * 16, -(-w // 16) * 16))
    run = (lambda ev: ev.decode(x)) if case.kind == "decode" else (lambda ev: ev.encode_moments(x))
    rows = engine_rows(device, opts, lambda be, d: engine_vae(model32, model, d, table, be, dtype, device, **kw),
                        [EngineUse(case.name, baseline_ms or float("nan"), reference, run)])
    for r in rows:
        r.section, r.variant = SECTION, f"+ engine ({r.variant})"
    return rows


def _floor_note(flops: Optional[float], ms: float, cuda: bool) -> str:
    if not (cuda and flops):
        return ""
    gpu = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in gpu), None)
    if peak is None:
        return f"{flops / 1e12:.2f} TFLOP"
    floor_ms = flops / (peak * 1e12) * 1e3
    return f"{flops / 1e12:.2f} TFLOP, floor {floor_ms:.1f} ms = {100 * floor_ms / ms:.0f}%"


def selected_cases(opts: BenchOptions, cuda: bool) -> list[AblationCase]:
    """Cases whose key equals, or whose name contains, one of `opts.cases` (all when none is given)."""
    return [c for c in cases(cuda, opts.quick)
            if not opts.cases or any(s == c.key or s in c.name for s in opts.cases)]


def run(opts: BenchOptions) -> list[BenchRow]:
    device = torch.device(opts.device)
    cuda = device.type == "cuda"
    dtype = working_dtype(opts.dtype, device)
    rows: list[BenchRow] = []
    models: dict[str, nn.Module] = {}
    g = torch.Generator().manual_seed(0)
    injected = parse_injected(opts.inject_oom)
    for case in selected_cases(opts, cuda):
        if injected.get(case.key):
            case = replace(case, faults=case.faults + injected[case.key])
        if case.family not in models:
            models.clear()
            gc.collect()
            models[case.family] = build_model(case.family, opts, opts.quick)
        model = models[case.family]
        x32 = torch.randn(case.shape, generator=g).clamp_(-1, 1) if case.kind == "encode" \
            else torch.randn(case.shape, generator=g)
        failure: Optional[str] = None
        try:
            rows.extend(_ablate(opts, model, case, x32, device, dtype))
        except Exception as exc:  # what no step catches (moving the model, the FLOP count): a row, then the next case
            log.warning("bench gpu: %s failed", case.name, exc_info=not is_out_of_memory(exc))
            failure = failure_note(exc)
        if failure is not None:  # outside the except block: the case's memory can be released
            remove_compile(model)
            model.to(device="cpu", dtype=torch.float32)
            release_cached(device)
            rows.append(BenchRow(SECTION, case.name, "case", float("nan"), note=failure))
    return rows


def _ablate(opts: BenchOptions, model: nn.Module, case: AblationCase, x32: torch.Tensor, device: torch.device,
            dtype: torch.dtype) -> list[BenchRow]:
    cuda = device.type == "cuda"
    repeat, warmup = (1, 1) if case.long else (opts.repeat, opts.warmup)
    faults = _Faults(case)
    # fp32 reference on the device (the PSNR target), then the model in the bench dtype. It runs in the
    # temporal slices the public path would use (exact by construction; the whole fp32 clip of a long case
    # would not fit), smaller after an out-of-memory; without one the rows have no error columns.
    model.to(device=device, dtype=torch.float32)
    x = x32.to(device)
    reference, reference_note = fp32_reference(model, case, x, device, faults)
    model32 = copy.deepcopy(model) if opts.ablation_engines else None  # engines build from fp32 weights
    model.to(dtype=dtype)
    x = x.to(dtype)
    temporal_slice = resolve_slice(model, case, dtype, device)
    copies = MetaPasses(model)
    flops_by_paths: dict[bool, Optional[float]] = {}  # the FLOPs a step runs depend on its paths (image path)
    rows: list[BenchRow] = []
    baseline_ms = None
    slice_note = "; ".join(n for n in (f"temporal_slice={temporal_slice}" if case.temporal_slice == AUTO else "",
                                       reference_note) if n)
    if case.baseline == "diffusers":
        row = _diffusers_row(opts, model, case, x, reference, device, dtype, repeat, warmup, faults)
        rows.append(row)
        baseline_ms = row.ms if math.isfinite(row.ms) else None
    for step in STEPS + ALONE_STEPS:
        if step.cuda_only and not cuda:
            continue
        if step.graphs and case.long:
            rows.append(BenchRow(SECTION, case.name, step.name, float("nan"),
                                 note="skipped: a minutes-long clip gains nothing from graph replay"))
            continue
        if step in ALONE_STEPS and step.compiled and case.long:
            rows.append(BenchRow(SECTION, case.name, step.name, float("nan"),
                                 note="skipped: compiling the plain path again costs minutes on a long clip; "
                                      "the image cases measure compile alone"))
            continue
        if step.fused and not triton_available():
            rows.append(BenchRow(SECTION, case.name, step.name, float("nan"), note="skipped: Triton not installed"))
            continue
        set_arch_paths(model, fast=step.fast, channels_last=step.channels_last)
        flops = step_flops(model, case, x, temporal_slice, step, flops_by_paths) if cuda else None
        if step.compiled:
            apply_compile(model, CompileSettings())
        else:
            remove_compile(model)  # the alone steps after the compiled ones run eager
        fn = _call(model, case, temporal_slice)
        runner = CudaGraphRunner(fn, max_graphs=1) if step.graphs else None

        def once(fn=fn, runner=runner) -> torch.Tensor:
            with torch.inference_mode():
                return runner(x) if runner is not None else fn(x)

        failure: Optional[str] = None
        try:
            with fused_norms(step.fused):
                measured = faults.wrap(step.name, once)
                peak, out = cuda_peak_mb(measured, device)
                ms, out = time_ms(measured, device, repeat=repeat, warmup=warmup)
        except Exception as exc:  # one failing lever (out of memory included) must not hide the rest of the table
            log.warning("bench gpu: %s / %s failed", case.name, step.name, exc_info=not is_out_of_memory(exc))
            failure = failure_note(exc)
        finally:
            if runner is not None:
                runner.invalidate()
        if failure is not None:  # outside the except block: the failed step's memory can be released
            out = None
            release_cached(device)
            rows.append(BenchRow(SECTION, case.name, step.name, float("nan"), note=failure))
            continue
        note = "; ".join(n for n in (slice_note, _floor_note(flops, ms, cuda)) if n)
        if step.compiled and compile_failed(model):
            note = ("compile fell back to eager; " + note).strip("; ")
        baseline_ms = baseline_ms or ms
        rows.append(BenchRow(SECTION, case.name, step.name, ms, baseline_ms=baseline_ms, peak_mb=peak,
                             max_abs_err=_err(max_abs, out, reference), psnr_db=_err(psnr, out, reference),
                             note=note,
                             predicted_peak_mb=predicted_peak_mb(copies, case, dtype, temporal_slice, step, model)
                             if peak is not None else None))
        del out
    remove_compile(model)
    if model32 is not None:
        set_arch_paths(model, fast=True, channels_last=True)
        rows += engine_step_rows(opts, model32, model, case, x, reference, baseline_ms, device, dtype)
        del model32
    model.to(device="cpu", dtype=torch.float32)
    if cuda:
        torch.cuda.empty_cache()
    return rows


def failure_note(exc: BaseException) -> str:
    """'out of memory: Type: first line' for an allocation failure (by type, vae/memory/oom.py), 'failed: …' else."""
    first = (str(exc).splitlines() or [""])[0]
    what = "out of memory" if is_out_of_memory(exc) else "failed"
    return f"{what}: {type(exc).__name__}: {first[:160]}"


def _err(metric: Callable[[torch.Tensor, torch.Tensor], float], out: torch.Tensor,
         reference: Optional[torch.Tensor]) -> Optional[float]:
    return None if reference is None else metric(out, reference)


def _latent_frames(model: nn.Module, case: AblationCase) -> int:
    return case.shape[2] if case.kind == "decode" else model.latent_format.latent_frames(case.shape[2])


def fp32_reference(model: nn.Module, case: AblationCase, x: torch.Tensor, device: torch.device,
                   faults: Optional[_Faults] = None) -> tuple[Optional[torch.Tensor], str]:
    """(the case's fp32 output, a note): the model (already fp32 on `device`) with its architecture fast paths
    (exact in fp32; the GPU-only levers off) in the temporal slices the public path picks for fp32 at this
    size. After an out-of-memory the slice is halved (exact by construction) and the pass runs again, down to
    one latent per slice; (None, why) when even that does not fit, and the case's rows go without errors."""
    set_arch_paths(model, fast=True, channels_last=False)
    frames = _latent_frames(model, case)
    k = resolve_slice(model, case, torch.float32, device)
    faults = faults or _Faults(replace(case, faults=()))
    notes: list[str] = []
    while True:
        def run(k=k) -> torch.Tensor:
            with fused_norms(False), torch.inference_mode():
                return _call(model, case, k)(x).float()

        result = attempt(faults.wrap(REFERENCE, run))
        if not isinstance(result, OutOfMemory):
            return result, "; ".join(notes)
        release_cached(device)  # outside the except block (attempt): the failed pass's memory is free now
        current = frames - 1 if k is None else k  # None: the whole clip, the first slice taking 1 + k latents
        if frames <= 1 or current <= 1:
            log.warning("bench gpu: %s: no fp32 reference (%s)", case.name, result.reason)
            return None, f"no fp32 reference: out of memory at {current or 1} latent(s) per slice ({result.reason})"
        k = max(1, current // 2)
        notes.append(f"fp32 reference out of memory at slice {current}, ran at {k}")
        log.warning("bench gpu: %s: fp32 reference out of memory at temporal slice %d; retrying at %d (%s)",
                    case.name, current, k, result.reason)


def _diffusers_row(opts: BenchOptions, model: nn.Module, case: AblationCase, x: torch.Tensor,
                   reference: Optional[torch.Tensor], device: torch.device, dtype: torch.dtype, repeat: int,
                   warmup: int, faults: Optional[_Faults] = None) -> BenchRow:
    """diffusers' eager pass in the bench dtype on the same weights and input: the case's baseline (a row with
    the error when it fails or runs out of memory; the case goes on)."""
    variant = DIFFUSERS
    ref = diffusers_baseline(model, case)
    if ref is None:
        return BenchRow(SECTION, case.name, variant, float("nan"),
                        note="failed: diffusers is not installed (the GPU run installs carried wheels: docs/gpu.md)")
    try:
        ref.to(device=device, dtype=dtype)
        fn = _diffusers_call(ref, case)

        def once() -> torch.Tensor:
            with torch.inference_mode():
                return fn(x)

        measured = (faults or _Faults(replace(case, faults=()))).wrap(variant, once)
        peak, out = cuda_peak_mb(measured, device)
        ms, out = time_ms(measured, device, repeat=repeat, warmup=warmup)
        return BenchRow(SECTION, case.name, variant, ms, baseline_ms=ms, peak_mb=peak,
                        max_abs_err=_err(max_abs, out, reference), psnr_db=_err(psnr, out, reference),
                        note=str(dtype)[6:])
    except Exception as exc:
        log.warning("bench gpu: %s / diffusers failed", case.name, exc_info=not is_out_of_memory(exc))
        return BenchRow(SECTION, case.name, variant, float("nan"), note=failure_note(exc))
    finally:
        del ref
        release_cached(device)
