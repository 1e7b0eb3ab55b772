"""An engine set: the engines a folder's manifest lists (or one of them) for one model, run through the
shared table.

Input geometry policy: an input runs on an engine only at a size the engine computes exactly (a
static bucket's own size, or a size on a profile's grid inside its range); any other size raises
SizeNotServed, and the engine VAE runs PyTorch for it. Padding into a larger bucket (replicate-pad,
run, crop back) happens only when the caller opted in with `pad_to_bucket`, because the padded rows
change the result (global attention, border convolutions). Nothing is ever resized.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import torch

from .interface import EngineRunError, LoadedEngine, ShapeRange
from .backends import get_backend
from .buckets import BucketTable, Selection, crop_to, pad_to
from .identity import COMPONENTS, EngineIdentity, IdentityError, mismatches, verify_file
from .manifest import Manifest, read_manifest
from .video import SLICE_FIRST, SLICE_NEXT, VIDEO_COMPONENTS, chain_slices

log = logging.getLogger(__name__)

IO_NAMES = {"encoder": (("pixels",), ("moments",)), "decoder": (("latents",), ("pixels",))}


def component_profiles(component: str, table: BucketTable, entries: Sequence[int], channels: int,
                       factor: int, batch: int = 1, image_channels: int = 3) -> list[dict[str, ShapeRange]]:
    """Per engine profile, the (min, opt, max) shape of the graph input for the table entries it serves
    (`channels`: latent channels, the decoder's input; `image_channels`: the encoder's, 4 for RGBA)."""
    div = 1 if component == "encoder" else factor
    ch = image_channels if component == "encoder" else channels
    name = IO_NAMES[component][0][0]
    out = []
    for e in entries:
        if table.mode == "multi_profile":
            p = table.profiles[e]
            lo, opt, hi = ((batch, ch, hw[0] // div, hw[1] // div) for hw in (p.min_hw, p.opt_hw, p.max_hw))
        else:
            b = table.buckets[e]
            lo = opt = hi = (batch, ch, b.height // div, b.width // div)
        out.append({name: (lo, opt, hi)})
    return out


def engine_profiles(ident: EngineIdentity, table: BucketTable) -> list[dict[str, ShapeRange]]:
    """The shape ranges an engine was built for: its recorded static input shapes (video slice
    engines: latents + causal cache), else the image component's ranges from the table."""
    if ident.input_shapes:
        return [{name: (tuple(shape),) * 3 for name, shape in ident.input_shapes.items()}]
    lf = ident.latent_format
    return component_profiles(ident.component, table, ident.entries, lf["channels"], lf["spatial_factor"],
                              image_channels=lf.get("image_channels", 3))


class SizeNotServed(EngineRunError):
    """No engine of the set computes this size exactly (and padding was not opted in): run PyTorch."""


def load_manifest(path: Union[Path, Manifest]) -> Manifest:
    """A folder's manifest, restricted to one engine when `path` is an engine file."""
    if isinstance(path, Manifest):
        return path
    manifest, selected = read_manifest(Path(path))
    return manifest.only(selected) if selected is not None else manifest


@dataclass
class _Slot:
    path: Path
    ident: EngineIdentity
    engine: Optional[LoadedEngine] = None


class EngineSet:
    """Engines for the encoder, decoder and/or video slice decoder of one model.

    `source` is a folder, one engine file in it, or an already-read Manifest: only the engines the
    manifest lists are used. Every identity is checked (model hash, device, GPU, backend version, file
    size and hash) before anything is deserialised; `lazy=False` then loads them all (eager), `lazy=True`
    on first use. `pad_to_bucket` (or the manifest's own option) lets sizes between buckets run padded.
    """

    def __init__(self, source: Union[Path, Manifest], device: torch.device, *, model_hash: Optional[str] = None,
                 lazy: bool = False, pad_to_bucket: bool = False):
        manifest = load_manifest(source)
        self.path = manifest.folder
        self.device = torch.device(device)
        self.lazy = lazy
        self.pad_to_bucket = pad_to_bucket or manifest.pad_to_bucket
        idents = manifest.files()
        first = idents[0][1]
        self.table = BucketTable.from_json(first.table)
        self.kind = first.model_kind
        self.backend = get_backend(first.backend)
        self.backend.check_available(self.device)
        version = self.backend.version()
        for f, ident in idents:
            if (ident.table, ident.model_hash, ident.model_kind, ident.backend) != \
                    (first.table, first.model_hash, first.model_kind, first.backend):
                raise IdentityError(f"{f}: belongs to a different engine set than {idents[0][0].name} "
                                    "(table, model or backend differ); keep one set per folder")
            problems = mismatches(ident, backend_version=version, device=self.device, model_hash_now=model_hash)
            if problems:
                raise IdentityError(f"{f}: cannot be used here: {'; '.join(problems)}. Rebuild with "
                                    f"{rebuild_hint(ident)}")
            verify_file(f, ident)
        # component -> table entry -> (slot, profile index inside that engine)
        self.routes: dict[str, dict[int, tuple[_Slot, int]]] = {}
        self.slots = []
        for f, ident in idents:
            slot = _Slot(f, ident)
            self.slots.append(slot)
            for k, entry in enumerate(ident.entries):
                if entry in self.routes.setdefault(ident.component, {}):
                    raise IdentityError(f"{f}: table entry {entry} of {ident.component} is served twice")
                self.routes[ident.component][entry] = (slot, k)
        if not lazy:
            for slot in self.slots:
                self._load(slot)

    # -- loading -------------------------------------------------------------------------------
    def _load(self, slot: _Slot) -> LoadedEngine:
        if slot.engine is None:
            ident = slot.ident
            profiles = engine_profiles(ident, self.table)
            slot.engine = self.backend.load(slot.path, profiles, self.device, ident.input_names, ident.output_names,
                                            ident.torch_dtype)
            log.info("loaded engine %s (%.0f MiB)", slot.path.name, slot.engine.memory_bytes / 2**20)
        return slot.engine

    @property
    def components(self) -> tuple[str, ...]:
        return tuple(c for c in COMPONENTS + VIDEO_COMPONENTS if c in self.routes)

    def memory_bytes(self) -> int:
        """Memory the loaded engines hold (0 for engines not loaded yet or released)."""
        return sum(s.engine.memory_bytes for s in self.slots if s.engine is not None)

    def footprint_bytes(self) -> int:
        """What the whole set holds once loaded: loaded engines' own figure, the serialised size for the
        rest. Why: a memory manager must reserve room for lazily loaded engines before their first use."""
        return sum(s.engine.memory_bytes if s.engine is not None else s.ident.engine_bytes for s in self.slots)

    def release(self) -> None:
        """Drop every deserialised engine; they reload on next use."""
        for s in self.slots:
            if s.engine is not None:
                s.engine.release()
                s.engine = None

    def describe(self) -> str:
        b = self.slots[0].ident
        return (f"{self.path.name}: {b.backend} {b.dtype} {self.table.mode} [{self.table.describe()}], "
                f"components {', '.join(self.components)}, {len(self.slots)} engine file(s), "
                f"{self.memory_bytes() / 2**20:.0f} MiB loaded")

    # -- running -------------------------------------------------------------------------------
    def select(self, component: str, height: int, width: int) -> Selection:
        """The table entry that runs (height, width) px; SizeNotServed when none runs it exactly and
        padding was not opted in, or when nothing contains it."""
        if component not in self.routes:
            raise EngineRunError(f"this engine set has no {component} engine")
        sel = self.table.choose(height, width)
        if sel is None or sel.index not in self.routes[component]:
            raise SizeNotServed(f"{width}x{height} px is outside every {component} bucket/profile "
                                f"({self.table.describe()})")
        if not sel.exact and not self.pad_to_bucket:
            raise SizeNotServed(f"{width}x{height} px is not a size the {component} engines compute exactly "
                                f"({self.table.describe()}; profiles run {self.table.multiple}-px steps); "
                                "pad_to_bucket=True would run it padded into "
                                f"{sel.padded[1]}x{sel.padded[0]}, approximately")
        return sel

    def _checked(self, slot: _Slot, out: torch.Tensor, name: str, shape: Sequence[Optional[int]]) -> torch.Tensor:
        """An engine output exactly as the manifest says (dtype, device, shape; finite), else EngineRunError:
        an engine whose real dtype differs from its record computes garbage, which must never be returned."""
        ident = slot.ident
        problems = []
        if not isinstance(out, torch.Tensor):
            raise EngineRunError(f"{slot.path.name}: output {name} is a {type(out).__name__}, not a tensor")
        if out.dtype != ident.torch_dtype:
            problems.append(f"dtype {out.dtype}, manifest says {ident.dtype}")
        if out.device.type != self.device.type:
            problems.append(f"on {out.device}, engines run on {self.device}")
        if out.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, out.shape)):
            problems.append(f"shape {tuple(out.shape)}, expected {tuple('*' if s is None else s for s in shape)}")
        if not problems and not bool(torch.isfinite(out).all()):
            problems.append("NaN/Inf values (an engine whose inputs are not the dtype it was built for, or an "
                            "overflow in a reduced-precision engine)")
        if problems:
            raise EngineRunError(f"{slot.path.name}: output {name} {'; '.join(problems)}; rebuild the engine set")
        return out

    def run(self, component: str, x: torch.Tensor, factor: int) -> torch.Tensor:
        """One 4-D sample batch through the engine: pad to the entry, run, crop back to the request."""
        scale = 1 if component == "encoder" else factor
        h, w = x.shape[-2] * scale, x.shape[-1] * scale
        sel = self.select(component, h, w)
        slot, k = self.routes[component][sel.index]
        engine = self._load(slot)
        ph, pw = sel.padded[0] // scale, sel.padded[1] // scale
        xin = pad_to(x.to(self.device, slot.ident.torch_dtype), ph, pw)  # the engine's dtype, whatever the model's
        name_in, name_out = IO_NAMES[component][0][0], IO_NAMES[component][1][0]
        outs = engine.run({name_in: xin}, k)
        if name_out not in outs:
            raise EngineRunError(f"{slot.path.name}: no output {name_out!r} (has {', '.join(outs)}); rebuild it")
        oh, ow = (h // factor, w // factor) if component == "encoder" else (h, w)
        full = (sel.padded[0] // factor, sel.padded[1] // factor) if component == "encoder" else sel.padded
        channels = 2 * slot.ident.latent_format["channels"] if component == "encoder" else None
        out = self._checked(slot, outs[name_out], name_out, (x.shape[0], channels, *full))
        return crop_to(out, oh, ow)

    def run_clip(self, z: torch.Tensor, factor: int, temporal_factor: int) -> torch.Tensor:
        """A [1, C, T >= 2, h, w] clip through the video slice engines of its bucket: replicate-pad to the
        bucket, chain first -> next -> ..., crop the pixels back to the request."""
        h, w = z.shape[-2] * factor, z.shape[-1] * factor
        sel = self.select(SLICE_FIRST, h, w)
        if sel.index not in self.routes.get(SLICE_NEXT, {}):
            raise EngineRunError(f"this engine set has {SLICE_FIRST} but no {SLICE_NEXT} engine for {sel.label}; "
                                 "rebuild the video engines (--video)")
        first, _ = self.routes[SLICE_FIRST][sel.index]
        nxt, _ = self.routes[SLICE_NEXT][sel.index]
        if first.ident.dtype != nxt.ident.dtype:
            raise EngineRunError(f"{first.path.name} ({first.ident.dtype}) and {nxt.path.name} ({nxt.ident.dtype}) "
                                 "differ in dtype; rebuild them together")
        ph, pw = sel.padded[0] // factor, sel.padded[1] // factor
        zin = pad_to(z[0].to(self.device, first.ident.torch_dtype), ph, pw).unsqueeze(0)  # [C,T,h,w] pads as 4-D
        out = chain_slices(self._load(first), (first.ident.input_names, first.ident.output_names), self._load(nxt),
                           (nxt.ident.input_names, nxt.ident.output_names), zin, temporal_factor,
                           first_latents=_slice_latents(first), next_latents=_slice_latents(nxt))
        out = self._checked(first, out, "pixels", (1, None, None, *sel.padded))
        return crop_to(out, h, w)


def _slice_latents(slot) -> int:
    """Latents per call of a video slice engine, from the static input shapes its identity records."""
    shape = slot.ident.input_shapes.get("latents")
    if not shape or len(shape) != 5 or int(shape[2]) < 1:
        raise EngineRunError(f"{slot.path.name}: its identity records no static latents shape "
                             f"(got {shape!r}); rebuild the video engines (--video)")
    return int(shape[2])


def rebuild_hint(ident: EngineIdentity) -> str:
    table = BucketTable.from_json(ident.table)
    if table.mode == "multi_profile":
        shape = "--multi-profile"
    elif table.mode == "static":
        shape = "--static " + table.buckets[0].name
    else:
        shape = "--multi-ratio " + " ".join(b.name for b in table.buckets)
    src = ident.source or "<checkpoint>"
    video = " --video" if ident.component in VIDEO_COMPONENTS else ""
    return (f"`python -m turbovae build-engines --vae {src} --out <folder> {shape} --backend {ident.backend} "
            f"--dtype {ident.dtype}{video} --overwrite`")

