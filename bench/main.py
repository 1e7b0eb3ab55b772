"""The default benchmark (`python -m turbovae bench`): TurboVAE against the reference implementations.

A few small cases chosen so the whole job finishes in a few minutes on 2 CPU cores, each comparing one
TurboVAE path with its reference on the same weights and input, in the same run:

- Qwen-Image / Wan 2.1 and Wan 2.2: diffusers `AutoencoderKLQwenImage` / `AutoencoderKLWan` (the `bench`
  extra installs diffusers; without it the baseline is our own code with every fast path off, labelled so).
- SeedVR2: the original SeedVR code cannot be installed from a package index, so the reference is our
  plain path (every fast path off, the reference's operation order), labelled as such.
  `python -m turbovae.bench.seedvr2_original` compares with the original given a checkout.
- Exact tiles: untiled decode vs exact tiles, for peak memory.

Each side runs once to warm up (that run also measures peak memory: CUDA `max_memory_allocated`, or on
CPU the increase of the process's peak resident size), then `repeat` timed runs of each, alternating between
the sides; the time is their median. "held MB" is what a side keeps resident after its calls beyond its
loaded model, summed over the family's cases so far (CPU: RSS after `malloc_trim`, read around each
warm-up run, which is when a path would build caches; CUDA: `memory_allocated`): a path that caches
derived weights shows them there. Our models are loaded as `TurboVAE` loads them (no autograd on the
parameters). `cases()` lists the work up front so a progress bar can count it.

`--comfyui PATH` adds ComfyUI core's own VAE as a third side of every Qwen/Wan/SeedVR2 case (bench/comfy_core.py),
and SeedVR2 encode cases so that core is compared on decode and encode of every family.
"""

from __future__ import annotations

import copy
import gc
import statistics
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Iterator, Optional

import torch

from ..vae.api import TurboVAE
from ..vae.dtypes import working_dtype
from ..vae.registry import Family, families
from ..vae.registry import family as registry_family
from .common import BenchOptions, BenchRow, interleaved_ms
from ..vae.measuring import max_abs, psnr, sync
from ..vae.seeded_weights import fan_in_weights

if TYPE_CHECKING:
    from .comfy_core import CoreSide

SECTION = "main"
SEEDVR2_REFERENCE = "plain path (original SeedVR2 not installable)"


TILES = "tiles"  # the group of the exact-tiles cases (untiled vs exact tiles of one family's model)


@dataclass(frozen=True)
class Case:
    """One comparison: `family` groups the cases (a registered family's key, or `TILES`), `model` is the family
    whose models run (vae/registry.py), `kind` encode/decode; sizes are in pixels."""

    name: str
    family: str
    kind: str
    frames: int
    height: int
    width: int
    tile: int = 0  # family "tiles": exact tile size in pixels
    model: str = ""  # the registered family whose models run (default: `family`)

    @property
    def vae(self) -> Family:
        return registry_family(self.model or self.family)


def _from_registry(which: str) -> tuple[Case, ...]:
    """Every registered family's `which` cases (`BenchCases` field), the exact-tiles cases last."""
    fams = families()
    plain = [Case(w.name, f.key, w.kind, w.frames, w.height, w.width) for f in fams
             for w in getattr(f.bench, which) if not w.tile_px]
    tiles = [Case(w.name, TILES, w.kind, w.frames, w.height, w.width, tile=w.tile_px, model=f.key) for f in fams
             for w in getattr(f.bench, which) if w.tile_px]
    return tuple(plain + tiles)


# The case lists, read from the registry when asked (a family registered later is in them).
_CASE_LISTS = {"CPU_CASES": "cpu", "CUDA_CASES": "cuda", "SMOKE_CASES": "quick",  # --quick: tiny configs
               "CORE_CPU_CASES": "core_cpu", "CORE_CUDA_CASES": "core_cuda"}  # added by --comfyui


def __getattr__(name: str) -> tuple[Case, ...]:
    if name in _CASE_LISTS:
        return _from_registry(_CASE_LISTS[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cases(opts: BenchOptions) -> tuple[Case, ...]:
    cuda = torch.device(opts.device).type == "cuda"
    chosen = _from_registry("quick" if opts.quick else "cuda" if cuda else "cpu")
    if opts.comfyui and not opts.quick:
        chosen += _from_registry("core_cuda" if cuda else "core_cpu")
    return tuple(c for c in chosen if not opts.cases or any(s in c.name for s in opts.cases))


def has_core_side(case: Case) -> bool:
    """Whether `--comfyui` adds core's VAE to this case: a family core has a VAE for (not the tiles cases)."""
    from .comfy_core import core_families

    return case.family in core_families()


def steps_per_case(opts: BenchOptions, case: Optional[Case] = None) -> int:
    """Runs per case (for a progress bar): reference and ours (and core's with --comfyui), one warm-up each plus
    `repeat` timed runs."""
    sides = 3 if opts.comfyui and (case is None or has_core_side(case)) else 2
    return sides * (1 + max(opts.repeat, 1))


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------
@dataclass
class Pair:
    """The two sides of a case (callables on the same input) and the latent layout of the models."""

    reference_name: str
    reference: Callable[[torch.Tensor], torch.Tensor]
    ours_name: str
    ours: Callable[[torch.Tensor], torch.Tensor]
    latent_channels: int
    spatial: int
    temporal: int
    keep: list = field(default_factory=list)  # models kept alive for the family's cases (ours first)
    held_mb: list = field(default_factory=lambda: [0.0, 0.0, 0.0])  # (reference, ours, core) held so far
    core: Optional["CoreSide"] = None  # ComfyUI core's VAE on the same weights (--comfyui)
    image_channels: int = 3

    def input(self, case: Case, g: torch.Generator) -> torch.Tensor:
        if case.kind == "encode":
            return torch.rand((1, self.image_channels, case.frames, case.height, case.width), generator=g) * 2 - 1
        shape = (1, self.latent_channels, 1 + (case.frames - 1) // self.temporal, case.height // self.spatial,
                 case.width // self.spatial)
        return torch.randn(shape, generator=g)


def _seeded_model(fam: Family, opts: BenchOptions) -> torch.nn.Module:
    """The family's model on the CPU in fp32, loaded as `TurboVAE` loads it (no autograd on the parameters): the
    real checkpoint the options name for it (not with --quick), else seeded random weights of its real config
    (tiny with --quick)."""
    from ..vae.loader import load_checkpoint

    path = None if opts.quick else next((opts.checkpoint[n] for n in fam.names if opts.checkpoint.get(n)), None)
    if path:
        return load_checkpoint(path, device="cpu", dtype="fp32").model
    with torch.device("meta"):
        model = fam.build_model(fam.config(real=not opts.quick))
    model.load_state_dict(fan_in_weights({k: tuple(v.shape) for k, v in model.state_dict().items()}), assign=True)
    return model.eval().requires_grad_(False)


def _family_pair(fam: Family, opts: BenchOptions, device: torch.device, dtype: torch.dtype) -> Pair:
    """Ours against the family's reference: its diffusers class on the same weights, or (no diffusers class, or
    diffusers not installed) our own plain path, labelled so."""
    from ..vae.accel.switches import FastPaths

    model = _seeded_model(fam, opts)
    weights = {k: v.clone() for k, v in model.state_dict().items()} if fam.diffusers_reference else {}
    model = model.to(device=device, dtype=dtype)
    lf = model.latent_format
    layout = dict(latent_channels=lf.channels, spatial=lf.spatial_factor, temporal=lf.temporal_factor,
                  image_channels=lf.image_channels)

    def side(m: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(x: torch.Tensor) -> torch.Tensor:
            return m.decode_latents(x) if x.shape[1] == lf.channels else m.encode_moments(x)
        return run

    diffusers = None
    if fam.diffusers_reference:
        try:
            import diffusers
        except ImportError:
            diffusers = None
    if diffusers is None:  # no diffusers class, or the `bench` extra is missing: say so in the row
        plain = _with_paths(model, FastPaths.plain())
        label = ("plain path (diffusers missing: pip install -e .[bench])" if fam.diffusers_reference
                 else f"plain path (original {fam.title} not installable)")
        return Pair(label, side(plain), "turbovae", side(model), keep=[model, plain], **layout)
    cls = getattr(diffusers, fam.diffusers_reference)
    ref = cls(**fam.diffusers_kwargs(model.config)).eval()
    ref.load_state_dict(weights)
    del weights
    ref.to(device=device) if dtype == torch.float32 else ref.to(device=device, dtype=dtype)  # fp32: no cast notice

    def reference(x: torch.Tensor) -> torch.Tensor:
        return ref.decode(x).sample if x.shape[1] == lf.channels else ref.encode(x).latent_dist.parameters

    return Pair(f"diffusers {cls.__name__}", reference, "turbovae", side(model), keep=[model, ref], **layout)


def _with_paths(model, fast):
    """A second model with the same weights running `fast` (its weights laid out for those paths). The sides of
    a case alternate run by run, so each keeps its own model: switching `model.fast` between runs would re-lay
    the weights inside the timed runs."""
    other = copy.deepcopy(model)
    other.fast = fast
    return other


def _tiles_pair(fam: Family, opts: BenchOptions, device: torch.device, dtype: torch.dtype, tile: int) -> Pair:
    from ..vae.tiled import decode_tiled

    vae = TurboVAE(_seeded_model(fam, replace(opts, checkpoint={})).to(device=device, dtype=dtype))
    lf = vae.model.latent_format
    overlap = min(64, tile // 4)
    return Pair("untiled (ours)", lambda z: vae.decode(z), f"exact tiles {tile} px",
                lambda z: decode_tiled(vae, z, tile_px=tile, overlap_px=overlap, mode="exact"), lf.channels,
                lf.spatial_factor, lf.temporal_factor, [vae], image_channels=lf.image_channels)


def build_pair(case: Case, opts: BenchOptions, device: torch.device, dtype: torch.dtype) -> Pair:
    if case.tile:
        return _tiles_pair(case.vae, opts, device, dtype, case.tile)
    return _family_pair(case.vae, opts, device, dtype)


# ------------------------------------------------------------------------------------------------
# Measuring
# ------------------------------------------------------------------------------------------------
class PeakMemory:
    """Peak memory of one call: CUDA allocator peak, or the CPU process's peak-RSS increase (Linux).

    On CPU, glibc returns every freed block to the OS during the measured call only (so the number is live
    memory, not what the allocator retained) and keeps freed blocks for reuse again afterwards, as in a
    user's process, so the timed runs are not charged a page fault per large tensor."""

    def __init__(self, device: torch.device):
        from . import peak_rss

        self.device = device
        self.cpu = device.type == "cpu" and peak_rss.supported()

    def __call__(self, fn: Callable[[], torch.Tensor]) -> tuple[Optional[float], torch.Tensor]:
        from . import peak_rss

        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
            out = fn()
            sync(self.device)
            return (torch.cuda.max_memory_allocated(self.device) - base) / 2**20, out
        if not self.cpu:
            return None, fn()
        try:
            return peak_rss.peak_increase_of(fn)
        finally:
            peak_rss.retain_freed_memory()


def resident_mb(device: torch.device) -> Optional[float]:
    """What the process holds now: CUDA `memory_allocated`, or on Linux the RSS after `malloc_trim`."""
    from . import peak_rss

    gc.collect()
    if device.type == "cuda":
        sync(device)
        return torch.cuda.memory_allocated(device) / 2**20
    return peak_rss.resident_mb() if device.type == "cpu" and peak_rss.supported() else None


def _sides(ref: Callable[[torch.Tensor], torch.Tensor], ours: Callable[[torch.Tensor], torch.Tensor],
           x: torch.Tensor, opts: BenchOptions, peak: PeakMemory, tick: Callable[[], None],
           core: Optional[Callable[[], torch.Tensor]] = None):
    """((median ms, peak MB, held MB, output) of the reference, the same of ours[, the same of `core`]). Each
    side runs once to warm up (that run also measures its memory: the peak during it, and what stays resident
    after it), then the timed runs alternate between the sides: machine load and clock drift then hit all
    alike, instead of whichever side happened to run last."""
    with torch.inference_mode():
        fns = [lambda: ref(x), lambda: ours(x)] + ([core] if core is not None else [])
        peaks, held = [], []
        for fn in fns:
            before = resident_mb(x.device)
            peaks.append(peak(fn)[0])  # its output is dropped: the timed runs make their own
            after = resident_mb(x.device)
            held.append(after - before if before is not None else None)
            tick()
        times, outs = interleaved_ms(fns, x.device, opts.repeat, tick)
    return tuple((statistics.median(times[i]), peaks[i], held[i], outs[i]) for i in range(len(fns)))


def run_cases(opts: BenchOptions, tick: Callable[[Case], None] = lambda case: None,
              start: Callable[[Case], None] = lambda case: None,
              inspect: Callable[[Case, Pair, torch.Tensor], None] = lambda case, pair, x: None,
              ) -> Iterator[list[BenchRow]]:
    """Yields the rows (reference, [ComfyUI core,] ours) of each case as soon as it is measured. `inspect` sees
    each case's pair and input after the timed runs (the roofline section counts their FLOPs there)."""
    device = torch.device(opts.device)
    dtype = working_dtype(opts.dtype, device)
    with ExitStack() as stack:
        core = stack.enter_context(_core_session(opts.comfyui, device, opts.comfyui_stubs)) if opts.comfyui else None
        yield from _run(opts, device, dtype, core, tick, start, inspect)


def _run(opts: BenchOptions, device: torch.device, dtype: torch.dtype, core, tick: Callable[[Case], None],
         start: Callable[[Case], None], inspect: Callable[[Case, Pair, torch.Tensor], None],
         ) -> Iterator[list[BenchRow]]:
    from .comfy_core import core_rows

    tag = str(dtype).replace("torch.", "")
    peak = PeakMemory(device)
    g = torch.Generator().manual_seed(0)
    pair, pair_key = None, None
    for case in cases(opts):
        start(case)
        key = (case.family, case.tile)
        if key != pair_key:  # models are built once per family and freed before the next family
            pair = pair_key = None
            gc.collect()
            pair, pair_key = build_pair(case, opts, device, dtype), key
            if core is not None and has_core_side(case):
                pair.core = core.side(case.family, pair.keep[0], dtype)
        x = pair.input(case, g).to(device=device, dtype=dtype)
        core_x = pair.core.prepare(x) if pair.core is not None else None
        (ref_ms, ref_mb, ref_held, ref_out), (ms, mb, held, out), *core_side = _sides(
            pair.reference, pair.ours, x, opts, peak, lambda: tick(case),
            (lambda: pair.core.run(core_x)) if core_x is not None else None)
        ref_held, held = _held_so_far(pair, 0, ref_held), _held_so_far(pair, 1, held)
        inspect(case, pair, x)
        row_ref = BenchRow(SECTION, case.name, pair.reference_name, ref_ms, ref_ms, ref_mb, note=tag, reference=True,
                           held_mb=ref_held)
        row = BenchRow(SECTION, case.name, pair.ours_name, ms, ref_ms, mb, max_abs(out, ref_out),
                       psnr(out, ref_out) if case.kind == "decode" else None, note=tag, held_mb=held)
        rows = [row_ref, row]
        if core_side:
            core_ms, core_mb, core_held, core_out = core_side[0]
            measured = core_ms, core_mb, _held_so_far(pair, 2, core_held), core_out
            rows = core_rows(pair.core, row_ref, row, measured, ref_out, out, case.kind == "decode")
        del x, out, ref_out, core_x, core_side
        yield rows


def _core_session(path: str, device: torch.device, stubs: tuple = ()):
    from . import comfy_core

    return comfy_core.session(comfy_core.find_tree(path), device, tuple(stubs))


def _held_so_far(pair: Pair, side: int, held: Optional[float]) -> Optional[float]:
    """A side's held memory after this case: its increments over the family's cases so far (its model is
    kept between them, so what an earlier case left resident is still held)."""
    if held is None:
        return None
    pair.held_mb[side] += held
    return pair.held_mb[side]


def needs_reference_package() -> Optional[str]:
    """A one-line hint when diffusers (the Qwen-Image/Wan reference) is missing, else None."""
    try:
        import diffusers  # noqa: F401
    except ImportError:
        return ("note: diffusers is not installed, so Qwen-Image/Wan rows compare with our own plain path; "
                "install the reference with: pip install -e \".[bench]\"")
    return None
