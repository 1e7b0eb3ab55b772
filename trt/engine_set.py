"""An engine set: the engines of one folder (or one file) for one model, run through the shared table.

Input geometry policy: pick the table entry (`BucketTable.choose`), replicate-pad the input up to
it, run, and crop the output back so its size always equals the request. Nothing is ever resized.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

import torch

from .backend import EngineLoadError, EngineRunError, LoadedEngine, ShapeRange, get_backend
from .buckets import BucketTable, Selection, crop_to, pad_to
from .formats import ENGINE_SUFFIXES
from .identity import EngineIdentity, IdentityError, mismatches, read_identity, verify_file
from .video import SLICE_FIRST, SLICE_NEXT, VIDEO_COMPONENTS, chain_slices

log = logging.getLogger(__name__)

COMPONENTS = ("encoder", "decoder")
ENGINE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
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
    engines: latents + causal memory), else the image component's ranges from the table."""
    if ident.input_shapes:
        return [{name: (tuple(shape),) * 3 for name, shape in ident.input_shapes.items()}]
    lf = ident.latent_format
    return component_profiles(ident.component, table, ident.entries, lf["channels"], lf["spatial_factor"],
                              image_channels=lf.get("image_channels", 3))


def engine_files(path: Path) -> list[Path]:
    path = Path(path)
    if path.is_file():
        return [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in ENGINE_SUFFIXES)
    if not files:
        raise EngineLoadError(f"{path}: no engine files ({', '.join(ENGINE_SUFFIXES)}) in this folder")
    return files


@dataclass
class _Slot:
    path: Path
    ident: EngineIdentity
    engine: Optional[LoadedEngine] = None


class EngineSet:
    """Engines for the encoder, decoder and/or video slice decoder of one model.

    Every identity is read and checked (model hash, device, GPU, backend version, file hash) before
    anything is deserialised; `lazy=False` then loads them all (eager), `lazy=True` on first use.
    """

    def __init__(self, path: Path, device: torch.device, *, model_hash: Optional[str] = None, lazy: bool = False):
        self.path = Path(path)
        self.device = torch.device(device)
        self.lazy = lazy
        idents = []
        for f in engine_files(self.path):
            idents.append((f, read_identity(f)))
        first = idents[0][1]
        self.table = BucketTable.from_json(first.table)
        self.kind = first.model_kind
        self.backend = get_backend(first.backend)
        self.backend.check_available(self.device)
        version = self.backend.version()
        for f, ident in idents:
            if ident.table != first.table or ident.model_hash != first.model_hash or ident.backend != first.backend:
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
            slot.engine = self.backend.load(slot.path, profiles, self.device, ident.input_names, ident.output_names)
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
        if component not in self.routes:
            raise EngineRunError(f"this engine set has no {component} engine")
        sel = self.table.choose(height, width)
        if sel is None or sel.index not in self.routes[component]:
            raise EngineRunError(f"{width}x{height} px is outside every {component} bucket/profile "
                                 f"({self.table.describe()})")
        return sel

    def run(self, component: str, x: torch.Tensor, factor: int) -> torch.Tensor:
        """One 4-D sample batch through the engine: pad to the entry, run, crop back to the request."""
        scale = 1 if component == "encoder" else factor
        h, w = x.shape[-2] * scale, x.shape[-1] * scale
        sel = self.select(component, h, w)
        slot, k = self.routes[component][sel.index]
        engine = self._load(slot)
        ph, pw = sel.padded[0] // scale, sel.padded[1] // scale
        xin = pad_to(x.to(ENGINE_DTYPES[slot.ident.dtype]), ph, pw)  # the engine's dtype, whatever the model's
        name_in, name_out = IO_NAMES[component][0][0], IO_NAMES[component][1][0]
        out = engine.run({name_in: xin}, k)[name_out]
        oh, ow = (h // factor, w // factor) if component == "encoder" else (h, w)
        full = (sel.padded[0] // factor, sel.padded[1] // factor) if component == "encoder" else sel.padded
        if tuple(out.shape[-2:]) != tuple(full):
            raise EngineRunError(f"{slot.path.name}: output {tuple(out.shape)} does not match the bucket {full}")
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
        zin = pad_to(z[0].to(ENGINE_DTYPES[first.ident.dtype]), ph, pw).unsqueeze(0)  # [C, T, h, w] pads as 4-D
        out = chain_slices(self._load(first), (first.ident.input_names, first.ident.output_names), self._load(nxt),
                           (nxt.ident.input_names, nxt.ident.output_names), zin, temporal_factor)
        if tuple(out.shape[-2:]) != tuple(sel.padded):
            raise EngineRunError(f"{first.path.name}: output {tuple(out.shape)} does not match the bucket {sel.padded}")
        return crop_to(out, h, w)


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


def dump_identity_summary(path: Path) -> str:
    return json.dumps([json.loads(read_identity(f).to_json()) for f in engine_files(path)], indent=1)
