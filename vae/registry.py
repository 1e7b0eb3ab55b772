"""The family registry: the one place that holds each VAE family's facts.

Why one place: a family's facts (model class and configs, how its checkpoints are recognised, the latent
convention ComfyUI core expects, what the benchmark and the doctor run, the names users read) used to be
spread over hand-written lists in the doctor, the benchmark, the cost model, the nodes and the CLI, so adding a
family meant finding all of them. Every one of those reads this registry instead; adding a family is one
`Family` entry (and its own package under vae/), registered here or, for a plugin or a test, with
`register_family` / `registered`.

A family's exact tiling is not an entry field: it is the model class's `VAEModel.exact_plan` (vae/base.py),
which the entry's `build_model` names. This module sits above the architecture packages (they never import it),
so the registry is complete whenever a VAE can be loaded.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch

from . import seedvr2, wan
from .base import ExactTiling, VAEModel
from .checkpoint import SD_KL, Architecture, register_architecture, registered_architectures, unregister_architecture
from .accel.switches import FastPaths
from .gpu_defaults import GpuDefaults
from .wan.config import diffusers_kwargs as wan_diffusers_kwargs


class UnknownFamily(KeyError):
    """A name that no registered family has; the message lists the names that exist."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Workload:
    """One benchmark case of a family: a pass (`kind` "decode"/"encode") over `frames` pixel frames of
    `height`×`width` pixels; `tile_px` > 0 compares the untiled pass with exact tiles of that size."""

    name: str
    kind: str
    frames: int
    height: int
    width: int
    tile_px: int = 0


@dataclass(frozen=True)
class BenchCases:
    """What `python -m turbovae bench` runs for a family: on a CPU, on a GPU, with `--quick` (tiny configs), and
    the cases `--comfyui` adds on each."""

    cpu: tuple[Workload, ...] = ()
    cuda: tuple[Workload, ...] = ()
    quick: tuple[Workload, ...] = ()
    core_cpu: tuple[Workload, ...] = ()
    core_cuda: tuple[Workload, ...] = ()


@dataclass(frozen=True)
class Family:
    """Everything the package knows about one VAE family.

    `key`: the name the doctor, the benchmark and the cost model show (`aliases` are accepted too);
    `title` and `files`: what users read (the loader's list, the error for an unsupported file);
    `build_model(config)`: a model with random weights; `real()` / `tiny()`: the released config and a
    same-topology tiny one (one idiom for every family); `architectures`: checkpoint detection and strict
    loading; `kinds`: the `VAEModel.kind` values its models report.
    Latent convention: `core_scales_latents` when ComfyUI core's VAE of this family hands out latents times the
    scaling factor (raw otherwise); `core_state_dict(model)` the weights under core's key names (None: core has
    no VAE of this family). Cost model: `split_model(config)` the model a frame split across devices runs
    (default `build_model`). Benchmark: `bench`, and `diffusers_reference` / `diffusers_kwargs(config)` the
    diffusers class it is compared with (None: the family's own plain path, its original not being installable).
    """

    key: str
    title: str
    files: str
    build_model: Callable[[Any], VAEModel]
    real: Callable[[], Any]
    tiny: Callable[[], Any]
    architectures: tuple[Architecture, ...] = ()
    kinds: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    core_scales_latents: bool = False
    core_state_dict: Optional[Callable[[VAEModel], dict]] = None
    split_model: Optional[Callable[[Any], VAEModel]] = None
    diffusers_reference: Optional[str] = None
    diffusers_kwargs: Optional[Callable[[Any], dict]] = None
    bench: BenchCases = field(default_factory=BenchCases)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.key, *self.aliases)

    def config(self, *, real: bool) -> Any:
        return self.real() if real else self.tiny()

    def meta_model(self, *, real: bool = True, for_split: bool = False) -> VAEModel:
        """The model of the real (or tiny) config on the meta device (no memory): its shapes, latent format and
        exact plan cost nothing to read. `for_split`: the model a frame split across devices runs."""
        build = self.split_model if for_split and self.split_model is not None else self.build_model
        with torch.device("meta"):
            return build(self.config(real=real))

    def exact_plan(self, *, decode: bool, for_split: bool = False) -> Optional[ExactTiling]:
        """The family's exact tiling (its model class's `exact_plan`), read off a meta-device model."""
        return self.meta_model(for_split=for_split).exact_plan(decode=decode)


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> None:
    """Add (or replace, by key) a family, registering its checkpoint architectures with the loader."""
    _FAMILIES[family.key] = family
    for arch in family.architectures:
        register_architecture(arch)


def unregister_family(key: str) -> None:
    """Remove a family and its checkpoint architectures; UnknownFamily when none has that key."""
    if key not in _FAMILIES:
        raise UnknownFamily(_unknown(key))
    for arch in _FAMILIES.pop(key).architectures:
        unregister_architecture(arch.name)


@contextmanager
def registered(family: Family) -> Iterator[Family]:
    """`family` registered for the block, the registry (and the loader's architectures) as before afterwards;
    for tests and short-lived plugins."""
    before = dict(_FAMILIES)
    names = {a.name for a in family.architectures}
    archs_before = [a for a in registered_architectures() if a.name in names]
    register_family(family)
    try:
        yield family
    finally:
        _FAMILIES.clear()
        _FAMILIES.update(before)
        for name in names:
            unregister_architecture(name)
        for arch in archs_before:
            register_architecture(arch)


def families() -> tuple[Family, ...]:
    """Every registered family, in registration order."""
    return tuple(_FAMILIES.values())


def family(name: str) -> Family:
    """The family with this key or alias, however the user spelled it ("Wan-2.1", "wan21" and "WAN_2_1" are
    "wan2.1": case, spaces, "-", "_" and "." aside); UnknownFamily naming the known ones otherwise."""
    spelled = _spelling(name)
    for fam in _FAMILIES.values():
        if spelled in map(_spelling, fam.names):
            return fam
    raise UnknownFamily(_unknown(name))


def _spelling(name: str) -> str:
    """A name as compared: lower case, without the separators users vary ("Qwen-Image" matches "qwen_image")."""
    return re.sub(r"[\s._-]", "", str(name).lower())


def family_of_kind(kind: str) -> Optional[Family]:
    """The family whose models report `kind` (`VAEModel.kind`), or None."""
    return next((f for f in _FAMILIES.values() if kind in f.kinds), None)


def core_scales_latents(kind: str) -> bool:
    """Whether ComfyUI core's VAE of this model kind hands out scaled latents (raw latents otherwise)."""
    fam = family_of_kind(kind)
    return fam is not None and fam.core_scales_latents


def gpu_defaults_by_title() -> dict[str, GpuDefaults]:
    """Each registered family's measured GPU defaults (its model's `gpu_defaults()`), by the name users read."""
    return {fam.title: fam.meta_model().gpu_defaults() for fam in families()}


def supported_text() -> str:
    """The supported VAEs as users read them: "SeedVR2 (ema_vae*.safetensors), …"."""
    return ", ".join(f"{f.title} ({f.files})" for f in _FAMILIES.values())


def titles() -> str:
    """The registered families' names as a sentence: "A, B and C" (what the UI and help texts list)."""
    names = [f.title for f in _FAMILIES.values()]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def _unknown(name: str) -> str:
    known = ", ".join(n for f in _FAMILIES.values() for n in f.names)
    return f"no VAE family named {name!r}; registered: {known}"


# --------------------------------------------------------------------------------------------
# The built-in families
# --------------------------------------------------------------------------------------------
def _wan_core_state_dict(model: VAEModel) -> dict:
    """Core loads Wan/Qwen-Image weights under the original checkpoint names."""
    return wan.diffusers_to_original(model.state_dict(), model.config)


SEEDVR2 = Family(
    key="seedvr2", title="SeedVR2", files="ema_vae*.safetensors",
    build_model=lambda cfg: seedvr2.SeedVR2VAE(cfg), real=seedvr2.SeedVR2Config.real, tiny=seedvr2.SeedVR2Config.tiny,
    architectures=seedvr2.ARCHITECTURES, kinds=("seedvr2",),
    core_scales_latents=True, core_state_dict=lambda model: dict(model.state_dict()),
    # A frame split across devices runs layer by layer, where the upsamplers run their convs as they are (the
    # composed upsampler, `subpixel_conv`, is a whole-frame path): the cost model counts what the ranks run.
    split_model=lambda cfg: seedvr2.SeedVR2VAE(cfg, FastPaths().without("subpixel_conv")),
    bench=BenchCases(
        cpu=(Workload("SeedVR2 image decode 128²", "decode", 1, 128, 128),
             Workload("SeedVR2 5-frame decode 64²", "decode", 5, 64, 64)),
        cuda=(Workload("SeedVR2 image decode 1024²", "decode", 1, 1024, 1024),
              Workload("SeedVR2 5-frame decode 512²", "decode", 5, 512, 512)),
        quick=(Workload("SeedVR2 5-frame decode 32² (tiny config)", "decode", 5, 32, 32),),
        # with --comfyui core's SeedVR2 is compared on image and clip, decode and encode
        core_cpu=(Workload("SeedVR2 image encode 128²", "encode", 1, 128, 128),
                  Workload("SeedVR2 5-frame encode 64²", "encode", 5, 64, 64)),
        core_cuda=(Workload("SeedVR2 image encode 1024²", "encode", 1, 1024, 1024),
                   Workload("SeedVR2 5-frame encode 512²", "encode", 5, 512, 512),
                   # 3 latent frames: a core that decodes clips wrongly from the third latent frame on agrees
                   # with ours on 2-latent clips such as the 5-frame ones
                   Workload("SeedVR2 9-frame decode 512²", "decode", 9, 512, 512))),
)

QWEN_IMAGE = Family(
    key="qwen_image", title="Qwen-Image / Wan 2.1", files="qwen_image_vae, wan_2.1_vae",
    aliases=("qwen", "wan2.1"),
    build_model=lambda cfg: wan.WanVAE(cfg, kind="qwen_image"),
    real=lambda: wan.WanConfig.real("wan2.1"), tiny=lambda: wan.WanConfig.tiny("wan2.1"),
    architectures=tuple(a for a in wan.ARCHITECTURES if a.name == wan.WAN21_NAME),
    kinds=("qwen_image", "wan2.1", "qwen_image_layered"),
    core_state_dict=_wan_core_state_dict,
    diffusers_reference="AutoencoderKLQwenImage", diffusers_kwargs=wan_diffusers_kwargs,
    bench=BenchCases(
        cpu=(Workload("Qwen-Image image decode 256²", "decode", 1, 256, 256),
             Workload("Qwen-Image image encode 256²", "encode", 1, 256, 256),
             Workload("Wan 2.1 5-frame decode 64²", "decode", 5, 64, 64),
             Workload("Qwen-Image decode 512², exact tiles 256 px", "decode", 1, 512, 512, tile_px=256)),
        cuda=(Workload("Qwen-Image image decode 1024²", "decode", 1, 1024, 1024),
              Workload("Qwen-Image image encode 1024²", "encode", 1, 1024, 1024),
              Workload("Wan 2.1 17-frame decode 480×832", "decode", 17, 480, 832),
              Workload("Qwen-Image decode 2048², exact tiles 768 px", "decode", 1, 2048, 2048, tile_px=768)),
        quick=(Workload("Qwen-Image image decode 64² (tiny config)", "decode", 1, 64, 64),
               Workload("Qwen-Image decode 128², exact tiles 64 px (tiny config)", "decode", 1, 128, 128,
                        tile_px=64))),
)

WAN22 = Family(
    key="wan2.2", title="Wan 2.2", files="wan2.2_vae",
    build_model=lambda cfg: wan.WanVAE(cfg, kind="wan2.2"),
    real=lambda: wan.WanConfig.real("wan2.2"), tiny=lambda: wan.WanConfig.tiny("wan2.2"),
    architectures=tuple(a for a in wan.ARCHITECTURES if a.name == wan.WAN22_NAME), kinds=("wan2.2",),
    core_state_dict=_wan_core_state_dict,
    diffusers_reference="AutoencoderKLWan", diffusers_kwargs=wan_diffusers_kwargs,
    bench=BenchCases(
        cpu=(Workload("Wan 2.2 image decode 128²", "decode", 1, 128, 128),),
        cuda=(Workload("Wan 2.2 image decode 1024²", "decode", 1, 1024, 1024),),
        quick=(Workload("Wan 2.2 image encode 64² (tiny config)", "encode", 1, 64, 64),),
        # with --comfyui on CUDA: a clip of 3 latent frames (one stored core commit decodes Wan clips wrongly from
        # the third latent frame on, and agrees on 2-latent clips)
        core_cuda=(Workload("Wan 2.2 9-frame decode 512²", "decode", 9, 512, 512),)),
)

# registration order is the order the doctor and the benchmark run them in
BUILTIN_FAMILIES: tuple[Family, ...] = (QWEN_IMAGE, WAN22, SEEDVR2)

for _family in BUILTIN_FAMILIES:
    register_family(_family)
register_architecture(SD_KL)  # recognised only to say what a file is (no family: nothing to build)

__all__ = ["BUILTIN_FAMILIES", "BenchCases", "Family", "UnknownFamily", "Workload", "core_scales_latents",
           "families", "family", "family_of_kind", "gpu_defaults_by_title", "register_family", "registered", "supported_text", "titles",
           "unregister_family"]
