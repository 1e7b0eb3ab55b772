"""Every case the benchmark's sections measure, in one table keyed by registry key.

Why one table: each section measures given sizes of given families, and those used to be written as family ×
size tables in each section (and the family names in a module of their own). A family's cases for every section
now sit together under its registry key (vae/registry.py), so adding a family's sizes, or reading what the bench
measures of it, is one entry; a section asks `for_section` for its rows, which come in the registry's order of
families (`registry.families()`), each row carrying its family's key. The default job's cases are the registry's
own (`Family.bench`, what the doctor and `python -m turbovae bench` run for any registered family); the rows here
are the sections' (bench/runner.py's SECTIONS) and the GPU lease scripts'.

A row names its family only where its rows show a name other than the key (`label`): the Qwen-Image / Wan 2.1
family's cases say which model they stand for ("qwen" for the Qwen-Image image VAE, "wan2.1" for the Wan 2.1
video VAE: the same weights), and the committed results files and the docs' tables carry those names. Each key is
checked against the registry, and each label against the family it sits under, when this module is imported, so
a renamed or removed family fails here, at once.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Generic, Optional, TypeVar

from ..vae.registry import families, family

T = TypeVar("T")

AUTO = -1  # AblationCase.temporal_slice: resolve with the memory rule TurboVAE uses, at the case's dtype and device


class _Labelled:
    """A case whose rows may name its family otherwise than by its key (`label`)."""

    label: str
    family: str

    @property
    def shown(self) -> str:
        """The family as this case's rows name it: its `label`, else its registry key."""
        return self.label or self.family


class _Directed:
    """A pass of a `kind`: "decode" or "encode"."""

    kind: str

    @property
    def decode(self) -> bool:
        return self.kind == "decode"


@dataclass(frozen=True)
class Sized(Generic[T]):
    """A section's cases at each size: `quick` (--quick, or a lease script's dry run: tiny configs, seconds),
    `cpu` (a run on the CPU) and `cuda` (a run on a GPU; for the sections that count on meta tensors or have no
    CPU size of their own, the real size wherever they run)."""

    quick: tuple[T, ...] = ()
    cpu: tuple[T, ...] = ()
    cuda: tuple[T, ...] = ()

    def pick(self, *, quick: bool, cuda: bool) -> tuple[T, ...]:
        return self.quick if quick else self.cuda if cuda else self.cpu


# -- the kinds of case -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AblationCase:
    """One case of the GPU fast-path ablation (bench/gpu.py). `key` is its stable id (the GPU run and `--cases`
    select by it); `baseline` "diffusers" adds diffusers' eager pass in the bench dtype as the row every step is
    compared with; `long` cases (minutes-long clips) time one repeat, skip CUDA graphs and slice the fp32
    reference."""

    name: str
    kind: str  # "decode" | "encode"
    shape: tuple[int, ...]  # input shape (latents for decode, pixels for encode)
    temporal_slice: Optional[int] = None  # None: whole clip; AUTO: what TurboVAE.decode picks from free memory
    key: str = ""
    baseline: str = "ours"  # "ours" (the eager step is the baseline) | "diffusers"
    long: bool = False
    faults: tuple[str, ...] = ()  # variants (step names, REFERENCE, DIFFUSERS) whose first run is a simulated OOM
    family: str = ""  # the registry key (filled in from the table's key)


@dataclass(frozen=True)
class BudgetCase:
    """One case of the GPU proof of the planner (bench/budget_gpu.py): a pass over `frames` pixel frames of
    `height`×`width`. Memory, three ways: `budget_gb` alone: planned under that budget, in a process limited to
    the budget plus what it already holds (weights, input) plus the slack; `limit_gb` alone: a card of that size —
    the process is limited to it and the budget is what is left after weights, input and the slack; neither:
    unconstrained, the default budget. `expected_s`: what it should take on an H100/H200 (the start, the model's
    build, the plan and the pass). `priority`: the lease runs lower first (families in registry order within
    one): 1 the issue-48 SeedVR2 sizes, 2 the re-checks and what the last lease left open, 3 cards of 8, 12 and
    24 GB against unconstrained, 4 what the last lease measured (docs/results/2026-11-27-h200-budget-gpu-call*.json),
    rerun when time is left."""

    key: str
    decode: bool
    frames: int
    height: int
    width: int
    budget_gb: Optional[float]
    limit_gb: Optional[float]
    expected_s: float
    check: str = "budget"  # "budget": plan, run, measure; "kinds": every plan kind at a small size vs untiled;
    # "diffusers": diffusers' eager decode of the same weights, warm (the reference the clip targets are against)
    priority: int = 0
    family: str = ""  # the registry key (filled in from the table's key)


@dataclass(frozen=True)
class Pass(_Directed, _Labelled):
    """One pass of a family's model on an input of `shape` (latents for a decode, pixels for an encode): `name`
    is the case as its rows name it (bench/gpu.py's name where that section measures it, so measured rows are
    found by it), `temporal_slice` the slice it runs in (None: whole clip), `tile_latent` exact tiles of that
    many latent pixels (0: untiled), `diffusers` whether diffusers' pass of the same weights is counted beside."""

    name: str = ""
    kind: str = "decode"
    shape: tuple[int, ...] = ()
    temporal_slice: Optional[int] = None
    tile_latent: int = 0
    diffusers: bool = False
    label: str = ""
    family: str = ""  # the registry key (filled in from the table's key)


@dataclass(frozen=True)
class Pixels(_Directed, _Labelled):
    """A pass over `frames` pixel frames of `height`×`width`, in exact tiles of `tile_px` pixels where given."""

    kind: str
    frames: int
    height: int
    width: int
    tile_px: int = 0
    label: str = ""
    family: str = ""  # the registry key (filled in from the table's key)


@dataclass(frozen=True)
class CutCase:
    """One pass a byte cut serves (bench/byte_cuts.py): `cut` the fast path that is the cut, "decode" |
    "encode", its input shape at the GPU case's size (counted) and at the CPU size (timed), and the temporal slice
    both use."""

    cut: str
    name: str
    kind: str
    gpu_shape: tuple[int, ...]
    cpu_shape: tuple[int, ...]
    temporal_slice: int
    family: str = ""  # the registry key (filled in from the table's key)


@dataclass(frozen=True)
class ClipCase(_Labelled):
    """One clip decode of bench/engines.py: the released config or its tiny twin (same topology), and the latent
    size (T, h, w)."""

    real_config: bool
    latents: tuple[int, int, int]
    label: str = ""
    family: str = ""  # the registry key (filled in from the table's key)


@dataclass(frozen=True)
class FidelityCase(_Labelled):
    """One pass of bench/fidelity.py: "decode" or "encode", `frames` pixel frames of `height`×`width`."""

    direction: str
    frames: int
    height: int
    width: int
    label: str = ""
    family: str = ""  # the registry key (filled in from the table's key), or any name of the family

    @property
    def name(self) -> str:
        what = "image" if self.frames == 1 else f"{self.frames}-frame"
        return f"{self.shown} {what} {self.direction} {self.width}×{self.height}"


@dataclass(frozen=True)
class DynamicVramCase(_Labelled):
    """A decode of `frames` pixel frames of `height`×`width` after a dynamic stand-in for a diffusion model of
    `stand_in_gb` ran, with all but `free_gb` of the device's remaining free memory taken (a full card)
    (bench/dynamic_vram.py)."""

    frames: int
    height: int
    width: int
    stand_in_gb: float
    free_gb: float
    dtype: str  # the VAE's, as the loader node takes it ("bf16", "fp32")
    label: str = ""
    family: str = ""  # the registry key (filled in from the table's key)


@dataclass(frozen=True)
class PlanKind:
    """A plan kind bench/plan_costs.py measures: the fields a candidate must have (`tile_px`: the tile (SeedVR2:
    the band budget's tile) in pixels, the candidate nearest it)."""

    name: str
    mode: str
    temporal_slice: Optional[int] = None
    frame_stages: bool = False
    cache_on_host: bool = False
    output_on_host: bool = False
    frames_on_host: bool = False
    tile_px: Optional[int] = None


@dataclass(frozen=True)
class FamilyCases:
    """One family's cases in every section, each field named after the bench module that reads it."""

    gpu: Sized[AblationCase] = Sized()
    budget_gpu: tuple[BudgetCase, ...] = ()
    bytes_roofline: Sized[Pass] = Sized()  # cuda: the GPU ablation's sizes, counted on meta tensors
    byte_cuts: Sized[CutCase] = Sized()  # cuda: the full run
    engines: Sized[ClipCase] = Sized()
    fidelity: tuple[FidelityCase, ...] = ()
    layer_fidelity: tuple[FidelityCase, ...] = ()  # its default size (--height, --width change it)
    gpu_memory_probe: Sized[Pass] = Sized()  # quick: the dry run; cuda: the real configs
    parallel: tuple[Pixels, ...] = ()
    peak_prediction: tuple[Pass, ...] = ()  # the passes planned on meta tensors under each budget
    public_decode: tuple[Pass, ...] = ()  # bench/peak_prediction.py: the public decode a GPU run measured
    plan_costs: Sized[Pass] = Sized()
    plan_kinds: tuple[PlanKind, ...] = ()  # what bench/plan_costs.py measures of each of its passes
    profile_layers: Sized[Pixels] = Sized()
    roofline: tuple[Pixels, ...] = ()  # the FLOP cases, counted on meta (--quick: a quarter of each side)
    slices: Sized[Pass] = Sized()
    tiling: Sized[Pixels] = Sized()
    dynamic_vram: Sized[DynamicVramCase] = Sized()  # quick: the dry run


def _priority(priority: int, *cases: BudgetCase) -> tuple[BudgetCase, ...]:
    return tuple(replace(c, priority=priority) for c in cases)


def _profiled(label: str, hw: int) -> tuple[Pixels, ...]:
    """bench/profile_layers.py's cases at one size: decode and encode of a 5-frame clip and an image."""
    return tuple(Pixels(kind, n, hw, hw, label=label) for kind in ("decode", "encode") for n in (5, 1))


SEEDVR2_PLAN_KINDS = (
    PlanKind("untiled, whole clip", "untiled"),
    PlanKind("untiled, slice 1", "untiled", temporal_slice=1),
    PlanKind("untiled, frame stages", "untiled", frame_stages=True),
    PlanKind("untiled, frame stages, host caches", "untiled", frame_stages=True, cache_on_host=True),
    PlanKind("layer-wise bands, slice 1", "exact", temporal_slice=1, tile_px=96),
    PlanKind("layer-wise small bands, slice 1", "exact", temporal_slice=1, tile_px=64),
    PlanKind("streamed bands, slice 1", "exact", temporal_slice=1, tile_px=96, frames_on_host=True,
             cache_on_host=True),
    PlanKind("streamed bands, frame stages", "exact", frame_stages=True, tile_px=96, frames_on_host=True,
             cache_on_host=True),
)
WAN_PLAN_KINDS = (
    PlanKind("untiled, whole clip", "untiled"),
    PlanKind("untiled, slice 1", "untiled", temporal_slice=1),
    PlanKind("exact tiles, slice 1", "exact", temporal_slice=1, tile_px=96),
    PlanKind("exact small tiles, slice 1", "exact", temporal_slice=1, tile_px=64),
    PlanKind("exact tiles, slice 1, host output", "exact", temporal_slice=1, tile_px=96, output_on_host=True),
    PlanKind("untiled, slice 1, host caches", "untiled", temporal_slice=1, cache_on_host=True),
)


# -- the table ---------------------------------------------------------------------------------------------------
TABLE: dict[str, FamilyCases] = {
    "qwen_image": FamilyCases(
        gpu=Sized(
            quick=(AblationCase("qwen decode 16² (tiny)", "decode", (1, 4, 1, 2, 2), key="qwen-decode-1024"),
                   AblationCase("wan2.1 9f decode 16² (tiny) vs diffusers", "decode", (1, 4, 3, 2, 2), AUTO,
                                key="wan21-decode-720p81", baseline="diffusers", long=True)),
            cpu=(AblationCase("qwen decode 64²", "decode", (1, 16, 1, 8, 8), key="qwen-decode-64"),
                 AblationCase("qwen encode 64²", "encode", (1, 3, 1, 64, 64), key="qwen-encode-64")),
            cuda=(AblationCase("qwen decode 1024²", "decode", (1, 16, 1, 128, 128), key="qwen-decode-1024"),
                  AblationCase("qwen encode 1024²", "encode", (1, 3, 1, 1024, 1024), key="qwen-encode-1024"),
                  AblationCase("wan2.1 decode 720p×81 vs diffusers", "decode", (1, 16, 21, 90, 160), AUTO,
                               key="wan21-decode-720p81", baseline="diffusers", long=True),
                  AblationCase("qwen decode 1328²", "decode", (1, 16, 1, 166, 166), key="qwen-decode-1328"),
                  AblationCase("qwen encode 1328²", "encode", (1, 3, 1, 1328, 1328), key="qwen-encode-1328"))),
        budget_gpu=(
            *_priority(2, BudgetCase("wan21-enc-1080p81-6g", False, 81, 1080, 1920, 6, None, 40)),
            *_priority(3, BudgetCase("wan21-dec-720p81-free", True, 81, 720, 1280, None, None, 25),
                       BudgetCase("wan21-dec-720p81-card8g", True, 81, 720, 1280, None, 8, 25),
                       BudgetCase("wan21-dec-720p81-card12g", True, 81, 720, 1280, None, 12, 25),
                       BudgetCase("wan21-dec-720p81-card24g", True, 81, 720, 1280, None, 24, 25)),
            *_priority(4, BudgetCase("kinds-qwen", True, 9, 256, 384, None, None, 30, check="kinds"),
                       BudgetCase("wan21-dec-1080p81-6g", True, 81, 1080, 1920, 6, None, 40),
                       BudgetCase("diffusers-wan21-dec-720p81", True, 81, 720, 1280, None, None, 45,
                                  check="diffusers"),
                       BudgetCase("wan21-dec-720p81-4g", True, 81, 720, 1280, 4, None, 30))),
        bytes_roofline=Sized(
            quick=(Pass("qwen decode 16² (tiny)", "decode", (1, 4, 1, 2, 2)),
                   Pass("wan2.1 9f decode 16² (tiny) vs diffusers", "decode", (1, 4, 3, 2, 2), 1, diffusers=True)),
            cuda=(Pass("qwen decode 1024²", "decode", (1, 16, 1, 128, 128)),
                  Pass("qwen encode 1024²", "encode", (1, 3, 1, 1024, 1024)),
                  Pass("wan2.1 decode 720p×81 vs diffusers", "decode", (1, 16, 21, 90, 160), 5, diffusers=True),
                  Pass("wan2.1 encode 720p×81", "encode", (1, 3, 81, 720, 1280), 5, diffusers=True))),
        byte_cuts=Sized(
            quick=(CutCase("single_buffer", "wan2.1 decode 9f 16² (tiny)", "decode", (1, 16, 3, 2, 2),
                           (1, 16, 3, 2, 2), 1),),
            cuda=(CutCase("single_buffer", "wan2.1 decode 720p×81", "decode", (1, 16, 21, 90, 160),
                          (1, 16, 5, 24, 24), 1),
                  CutCase("single_buffer", "wan2.1 encode 720p×81", "encode", (1, 3, 81, 720, 1280),
                          (1, 3, 17, 192, 192), 1))),
        engines=Sized(
            quick=(ClipCase(False, (3, 8, 8), label="wan2.1"),),  # 64x64 x 9
            cpu=(ClipCase(False, (6, 16, 16), label="wan2.1"),  # 128x128 x 21
                 ClipCase(True, (3, 8, 8), label="wan2.1")),  # 64x64 x 9
            cuda=(ClipCase(True, (6, 60, 104), label="wan2.1"),)),  # 832x480 x 21
        fidelity=(FidelityCase("decode", 1, 256, 256, label="qwen"),
                  FidelityCase("encode", 1, 256, 256, label="qwen"),
                  FidelityCase("decode", 5, 128, 128, label="qwen")),
        gpu_memory_probe=Sized(  # the exact tile in latent pixels (0: untiled), one latent per slice
            quick=(Pass("", "decode", (1, 4, 3, 16, 16), 1), Pass("", "decode", (1, 4, 3, 16, 16), 1, 8)),
            cuda=(Pass("", "decode", (1, 16, 5, 90, 160), 1), Pass("", "decode", (1, 16, 5, 90, 160), 1, 32),
                  Pass("", "encode", (1, 3, 17, 720, 1280), 1), Pass("", "encode", (1, 3, 17, 720, 1280), 1, 32))),
        parallel=(Pixels("decode", 1, 256, 256, label="wan2.1"), Pixels("encode", 1, 256, 256, label="wan2.1")),
        peak_prediction=(Pass("", "decode", (1, 16, 21, 90, 160), label="wan2.1"),
                         Pass("", "encode", (1, 3, 81, 720, 1280), label="wan2.1"),
                         Pass("", "decode", (1, 16, 1, 128, 128))),
        plan_costs=Sized(cpu=(Pass("", "decode", (1, 16, 3, 12, 16)),),
                         cuda=(Pass("", "decode", (1, 16, 21, 90, 160)),)),
        plan_kinds=WAN_PLAN_KINDS,
        profile_layers=Sized(cpu=_profiled("Wan 2.1", 64), cuda=_profiled("Wan 2.1", 256)),
        roofline=(*(Pixels("decode", n, 128, 128, label="Wan 2.1") for n in (1, 5, 21)),
                  Pixels("encode", 5, 128, 128, label="Wan 2.1")),
        slices=Sized(quick=(Pass("wan2.1 decode 17f (tiny)", "decode", (1, 4, 5, 2, 2)),),
                     cpu=(Pass("wan2.1 decode 81f 64²", "decode", (1, 16, 21, 8, 8)),),
                     cuda=(Pass("wan2.1 decode 81f 480×832", "decode", (1, 16, 21, 60, 104)),)),
        tiling=Sized(quick=(Pixels("decode", 1, 128, 128, 64, label="qwen"),),
                     cpu=(Pixels("decode", 1, 512, 512, 256, label="qwen"),
                          Pixels("decode", 1, 1024, 1024, 512, label="qwen")),
                     cuda=(Pixels("decode", 1, 1328, 1328, 512, label="qwen"),
                           Pixels("decode", 1, 2048, 2048, 768, label="qwen"))),
        dynamic_vram=Sized(
            quick=(DynamicVramCase(frames=5, height=32, width=32, stand_in_gb=0.0625, free_gb=0.0, dtype="fp32",
                                   label="wan2.1"),),
            cuda=(DynamicVramCase(frames=81, height=720, width=1280, stand_in_gb=8.0, free_gb=4.0, dtype="bf16",
                                  label="wan2.1"),)),
    ),
    "wan2.2": FamilyCases(
        budget_gpu=_priority(2, BudgetCase("wan22-enc-1088x1920x81-6g", False, 81, 1088, 1920, 6, None, 45),
                             BudgetCase("wan22-dec-1088x1920x81-6g", True, 81, 1088, 1920, 6, None, 45)),
        bytes_roofline=Sized(cuda=(Pass("wan2.2 decode 704×1280×41", "decode", (1, 48, 11, 44, 80), 5,
                                        diffusers=True),)),
        byte_cuts=Sized(cuda=(CutCase("single_buffer", "wan2.2 decode 704×1280×41", "decode", (1, 48, 11, 44, 80),
                                      (1, 48, 5, 12, 12), 1),)),
        engines=Sized(
            quick=(ClipCase(False, (3, 4, 4)),),  # 64x64 x 9 (16x space)
            cpu=(ClipCase(False, (6, 8, 8)),  # 128x128 x 21
                 ClipCase(True, (3, 4, 4))),  # 64x64 x 9
            cuda=(ClipCase(True, (6, 45, 80)),)),  # 1280x720 x 21
        fidelity=(FidelityCase("decode", 1, 256, 256), FidelityCase("decode", 5, 128, 128)),
        gpu_memory_probe=Sized(cuda=(Pass("", "decode", (1, 48, 5, 44, 80), 1),
                                     Pass("", "decode", (1, 48, 5, 44, 80), 1, 16),
                                     Pass("", "encode", (1, 3, 17, 704, 1280), 1))),
        peak_prediction=(Pass("", "decode", (1, 48, 11, 44, 80)),),
    ),
    "seedvr2": FamilyCases(
        gpu=Sized(
            quick=(AblationCase("seedvr2 5f decode 16² (tiny)", "decode", (1, 16, 2, 2, 2),
                                key="seedvr2-decode-720p21"),),
            cpu=(AblationCase("seedvr2 decode 64² image", "decode", (1, 16, 1, 8, 8), key="seedvr2-decode-64"),
                 AblationCase("seedvr2 decode 64²×5", "decode", (1, 16, 2, 8, 8), key="seedvr2-decode-64x5")),
            cuda=(AblationCase("seedvr2 decode 1080p image", "decode", (1, 16, 1, 135, 240),
                               key="seedvr2-decode-1080p"),
                  AblationCase("seedvr2 decode 720p×21", "decode", (1, 16, 6, 90, 160), AUTO,
                               key="seedvr2-decode-720p21", long=True))),
        budget_gpu=(
            # issue 48: SeedVR2 at the sizes upscalers use, exact within the budget (streamed plans: activations in
            # host memory), and the cost of fitting against the untiled pass; first the kinds check (streamed
            # kinds included)
            *_priority(1, BudgetCase("kinds-seedvr2", True, 9, 256, 384, None, None, 40, check="kinds"),
                       BudgetCase("seedvr2-dec-720p21-card8g", True, 21, 720, 1280, None, 8, 35),
                       BudgetCase("seedvr2-dec-720p21-card24g", True, 21, 720, 1280, None, 24, 35),
                       BudgetCase("seedvr2-dec-2160p-6g", True, 1, 2160, 3840, 6, None, 40),
                       BudgetCase("seedvr2-enc-2160p-6g", False, 1, 2160, 3840, 6, None, 40),
                       BudgetCase("seedvr2-dec-4096sq-6g", True, 1, 4096, 4096, 6, None, 50),
                       BudgetCase("seedvr2-enc-4096sq-6g", False, 1, 4096, 4096, 6, None, 50),
                       BudgetCase("seedvr2-dec-1080p81-4g", True, 81, 1080, 1920, 4, None, 150),
                       BudgetCase("seedvr2-dec-1440p81-6g", True, 81, 1440, 2560, 6, None, 240),
                       BudgetCase("seedvr2-enc-1440p81-6g", False, 81, 1440, 2560, 6, None, 150),
                       BudgetCase("seedvr2-dec-2160p81-6g", True, 81, 2160, 3840, 6, None, 500),
                       BudgetCase("seedvr2-enc-2160p81-6g", False, 81, 2160, 3840, 6, None, 300)),
            *_priority(2, BudgetCase("seedvr2-enc-1080p81-6g", False, 81, 1080, 1920, 6, None, 90)),
            *_priority(3, BudgetCase("seedvr2-dec-720p21-free", True, 21, 720, 1280, None, None, 35),
                       BudgetCase("seedvr2-dec-720p21-card12g", True, 21, 720, 1280, None, 12, 35),
                       BudgetCase("seedvr2-dec-1080p81-6g", True, 81, 1080, 1920, 6, None, 130)),
            *_priority(4, BudgetCase("seedvr2-dec-720p81-4g", True, 81, 720, 1280, 4, None, 90))),
        bytes_roofline=Sized(quick=(Pass("seedvr2 5f decode 16² (tiny)", "decode", (1, 16, 2, 2, 2)),),
                             cuda=(Pass("seedvr2 decode 1080p image", "decode", (1, 16, 1, 135, 240)),
                                   Pass("seedvr2 decode 720p×21", "decode", (1, 16, 6, 90, 160)))),
        engines=Sized(quick=(ClipCase(False, (3, 4, 6)),),  # 48x32 x 9
                      cpu=(ClipCase(False, (5, 8, 12)),),  # 96x64 x 17
                      cuda=(ClipCase(True, (6, 90, 160)),)),  # 1280x720 x 21
        fidelity=(FidelityCase("decode", 1, 320, 448),  # the case: a photo encoded, then decoded
                  FidelityCase("decode", 1, 256, 256),
                  FidelityCase("encode", 1, 256, 256),
                  FidelityCase("decode", 5, 128, 128)),
        layer_fidelity=(FidelityCase("decode", 1, 320, 448),),
        gpu_memory_probe=Sized(quick=(Pass("", "decode", (1, 16, 3, 12, 12), 1, 8),),
                               cuda=(Pass("", "decode", (1, 16, 3, 90, 160), 1),
                                     Pass("", "decode", (1, 16, 3, 90, 160), 1, 32),
                                     Pass("", "encode", (1, 3, 9, 720, 1280), 1),
                                     Pass("", "encode", (1, 3, 9, 720, 1280), 1, 32))),
        parallel=(Pixels("decode", 1, 256, 256), Pixels("encode", 1, 256, 256)),
        peak_prediction=(Pass("", "decode", (1, 16, 6, 90, 160)), Pass("", "decode", (1, 16, 1, 135, 240))),
        public_decode=(Pass("seedvr2 decode 720p×21 (public decode)", "decode"),),
        plan_costs=Sized(quick=(Pass("", "decode", (1, 16, 3, 8, 12)),),
                         cpu=(Pass("", "decode", (1, 16, 3, 8, 12)),),
                         cuda=(Pass("", "decode", (1, 16, 6, 90, 160)),)),
        plan_kinds=SEEDVR2_PLAN_KINDS,
        profile_layers=Sized(quick=_profiled("SeedVR2", 32), cpu=_profiled("SeedVR2", 64),
                             cuda=_profiled("SeedVR2", 256)),
        roofline=(*(Pixels("decode", n, hw, hw, label="SeedVR2") for hw in (128, 256) for n in (1, 5, 9, 21)),
                  *(Pixels("encode", n, 128, 128, label="SeedVR2") for n in (5, 21))),
        slices=Sized(quick=(Pass("seedvr2 decode 9f (tiny)", "decode", (1, 16, 3, 2, 2)),),
                     cpu=(Pass("seedvr2 decode 21f 64²", "decode", (1, 16, 6, 8, 8)),
                          Pass("seedvr2 decode 21f 128²", "decode", (1, 16, 6, 16, 16))),
                     cuda=(Pass("seedvr2 decode 21f 512²", "decode", (1, 16, 6, 64, 64)),)),
        tiling=Sized(quick=(Pixels("decode", 1, 64, 96, 64),),
                     cpu=(Pixels("decode", 1, 256, 256, 128), Pixels("decode", 5, 128, 192, 64)),
                     cuda=(Pixels("decode", 1, 1080, 1920, 512), Pixels("decode", 21, 720, 1280, 512))),
    ),
}
SECTIONS = tuple(f.name for f in fields(FamilyCases))


def _rows(entry: FamilyCases, section: str) -> tuple:
    """Every row of one family's `section`, at every size."""
    value = getattr(entry, section)
    return value.quick + value.cpu + value.cuda if isinstance(value, Sized) else value


def check(table: dict[str, FamilyCases]) -> None:
    """Each key a registry key, as the registry spells it, and each row's label a name of the family it sits under
    (however spelled: "Wan 2.1" names the family of "wan2.1"); ValueError (UnknownFamily for a name no family has)
    otherwise."""
    for key, entry in table.items():
        if family(key).key != key:
            raise ValueError(f"{key!r} is not how the registry spells the family's key: use {family(key).key!r}")
        for section in SECTIONS:
            for row in _rows(entry, section):
                label = getattr(row, "label", "")
                if label and family(label).key != key:
                    raise ValueError(f"the {section} case labelled {label!r} sits under {key!r}, but the registry "
                                     f"calls that name {family(label).key!r}")


check(TABLE)


def family_cases(key: str) -> FamilyCases:
    """The cases of the family with this registry key (none for a family the table has no entry for)."""
    return TABLE.get(key, FamilyCases())


def for_section(section: str, *, quick: bool = False, cuda: bool = False) -> tuple[Any, ...]:
    """The rows of `section` (a `FamilyCases` field) of every registered family, in registration order, at the size
    `quick` / `cuda` pick (`Sized.pick`), each row carrying its family's key."""
    if section not in SECTIONS:
        raise ValueError(f"no section {section!r} in the case table; sections: {', '.join(SECTIONS)}")
    out: list = []
    for fam in families():
        value = getattr(family_cases(fam.key), section)
        rows = value.pick(quick=quick, cuda=cuda) if isinstance(value, Sized) else value
        out += [replace(row, family=fam.key) if hasattr(row, "family") else row for row in rows]
    return tuple(out)


__all__ = ["AUTO", "AblationCase", "BudgetCase", "ClipCase", "CutCase", "DynamicVramCase", "FamilyCases",
           "FidelityCase", "Pass", "Pixels", "PlanKind", "SECTIONS", "Sized", "TABLE", "check", "family_cases",
           "for_section"]
