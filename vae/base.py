"""The contract every VAE architecture in this package implements.

`TurboVAE` (vae/api.py), the tiling engine, the engine exporters and the ComfyUI nodes only talk to a
model through `VAEModel`; architecture modules (vae/seedvr2, vae/wan) never need to know about them. The causal
cache a step reads and writes (`CausalCache`, `State`) is vae/causal_cache.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Callable, ClassVar, Generic, Optional, Protocol, Sequence, TypeVar

import torch
from torch import nn

from .accel.switches import FastPaths, active
from .accel.channels_last import channels_last_keeps_fp32
from .accel import self_checks
from .gpu_defaults import UNMEASURED, GpuDefaults, channels_last_applies
from .norms import fused_norms_run
from .memory.placement import Placement
from .tracing import tracing

from .accel.weight_layout import PassScratch, conv_modules, hold_layout
from .causal_cache import CacheHandoff, CausalCache, State, recorded_cache_owners
from .input_rules import check_temporal_slice


@dataclass(frozen=True)
class LatentFormat:
    """Geometry and statistics of a VAE's latent space, exposed as data.

    Latents produced and consumed by this package are always *raw* (ComfyUI's convention):
    callers that need normalised latents apply `scaling_factor`/`shift_factor` or `mean`/`std` themselves.
    `image_channels` is what the latents map to and from: 3 (RGB), or 4 (RGBA) for the
    Qwen-Image-Layered VAE; it is what tells the two Qwen-Image VAEs apart, so it lives with the rest
    of the geometry (engine identities record it with it).
    """

    channels: int
    spatial_factor: int
    temporal_factor: int
    scaling_factor: float = 1.0
    shift_factor: float = 0.0
    mean: Optional[tuple[float, ...]] = None
    std: Optional[tuple[float, ...]] = None
    image_channels: int = 3

    def latent_frames(self, frames: int) -> int:
        """Latent frames for a clip of `frames` pixel frames (4n+1 -> n+1)."""
        return (frames - 1) // self.temporal_factor + 1

    def padded_frames(self, frames: int) -> int:
        """Pixel frames of a clip of `frames` once an encode pads it to 1 + 4n (the last frame repeated: the one
        home of that rule; `TurboVAE.pad_frames` pads, the planner, tiles and nodes size the padded clip)."""
        return frames + (-(frames - 1)) % self.temporal_factor

    def pixel_frames(self, latent_frames: int) -> int:
        """Pixel frames a decoder produces for `latent_frames` latents (n+1 -> 4n+1)."""
        return (latent_frames - 1) * self.temporal_factor + 1


# progress(done, total) after each unit of work; raising from it cancels the pass
Progress = Optional[Callable[[int, int], None]]


class CausalStream(ABC):
    """Runs a clip through a causal encoder or decoder slice by slice, carrying the causal cache.

    Slices must respect the temporal stride: an encode stream takes 1+4k frames first, then 4k
    frames per step; a decode stream takes k+1 latent frames first, then k per step. Concatenating the
    step outputs along time equals the whole-clip pass. `close()` drops the cached frames.
    """

    @abstractmethod
    def step(self, x: torch.Tensor) -> torch.Tensor: ...

    def close(self) -> None:  # pragma: no cover - default: nothing to release
        pass

    def __enter__(self) -> "CausalStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


R = TypeVar("R")


class ExactTilingRunner(Protocol[R]):
    """What runs an exact plan, one method per way of tiling exactly (`ExactTiling.run_with` picks it)."""

    def staged(self, plan) -> R:
        """A plan of local stages per tile and one global part at latent resolution (`vae.tiling.exact.ExactPlan`)."""

    def layerwise(self, plan) -> R:
        """A plan that runs the model's own forward layer by layer (`vae.tiling.exact.LayerwisePlan`)."""


class ExactTiling(ABC, Generic[R]):
    """What `VAEModel.exact_plan` returns: how a model's pass is split so that tiles give the untiled result.

    Two implementations (vae/tiling/exact.py): `ExactPlan` (local stages per tile, one global part; Wan 2.1/2.2,
    Qwen-Image) and `LayerwisePlan` (the whole forward layer by layer with tile-bounded working memory; SeedVR2,
    whose every GroupNorm spans the frame). Callers never test which one they hold: they pass a runner with a
    method for each, and the plan calls its own (`run_with`); what a planner needs to know to price and bound a
    plan it reads off `holds_whole_frames`."""

    @abstractmethod
    def run_with(self, runner: "ExactTilingRunner[R]") -> R:
        """`runner.staged(self)` or `runner.layerwise(self)`, whichever this plan is."""

    @property
    @abstractmethod
    def holds_whole_frames(self) -> bool:
        """Whether the pass keeps whole-frame tensors while its tiles run — the activations between layers and, in
        a temporally sliced pass, the causal caches (a layer-wise plan) — rather than each tile carrying its own
        state (a staged plan): what its peak follows (the slice more than the tile) and what a planner bounds it
        by (vae/planning)."""


class PassContext(CausalCache):
    """The context of one encode/decode step, one type for every architecture: what its layers read besides their
    input. The fast paths it runs (`fast`), its causal cache in and out (`CausalCache`; `collect=False` builds
    none), the frame split across devices (`shard`: this rank's band, vae/parallel; None on one device), the
    progress `tick` of a layer-by-layer pass, and the `scratch` where its convs pack a weight view the kernel
    cannot read in place (freed with the pass). An architecture reads what it uses; SeedVR2 adds its layer-wise
    split policy in a subclass (vae/seedvr2/layers.py)."""

    def __init__(self, fast: FastPaths, cache_in: Optional[Sequence[torch.Tensor]] = None, collect: bool = True,
                 shard: Optional[object] = None):
        super().__init__(cache_in, collect)
        self.fast = fast
        self.shard = shard
        self.tick: Optional[Callable[[], None]] = None
        self.scratch = PassScratch()

    def clear(self) -> None:
        """Back to a fresh stream: no cache, first slice next, scratch freed."""
        self.start(None, self.collect)
        self.scratch.clear()


@dataclass(frozen=True)
class FrameStage:
    """One stage: `run(x, ctx)` over a chunk of `first` input frames on its first step, `rest` on every later one
    (the product of the temporal strides inside it), with its own pass context `ctx`."""

    name: str
    run: Callable[[torch.Tensor, PassContext], torch.Tensor]
    first: int
    rest: int


@dataclass(frozen=True)
class FrameStages:
    """What `VAEModel.frame_stages(decode=...)` returns (run by vae/tiling/frame_stages.py): the stages in order;
    `open_context(split)` a fresh pass context for one stage (`split`: the architecture's layer-wise tiling policy,
    or None); `join(parts, split)` the frames a stage's steps emitted, joined along time for a next stage whose step
    takes more of them (default: concatenated; a pass keeping its activations in host memory joins them there)."""

    stages: Sequence[FrameStage]
    open_context: Callable[[Optional[object]], PassContext]
    join: Callable[[Sequence[torch.Tensor], Optional[object]], torch.Tensor] = \
        lambda parts, split: torch.cat(list(parts), dim=2)


class VAEModel(nn.Module, ABC):
    """An architecture: holds the weights and runs validated tensors.

    The architecture supplies the two causal steps (`encode_step`, `decode_step`: pure functions of (slice,
    causal cache) -> (output, cache')), the single-frame export graphs and `meta_copy`; whole-clip passes
    with temporal slicing, streams and `cache_layout` are written once, here, on top of the steps.

    Inputs reaching these methods are already checked by `TurboVAE`: 5-D, right channels, model
    dtype and device, spatial dims multiples of `latent_format.spatial_factor`, and pixel clips of
    4n+1 frames.
    """

    kind: ClassVar[str]
    latent_format: LatentFormat
    fast_fields: ClassVar[tuple[str, ...]]  # the `FastPaths` fields this architecture reads
    follow_gpu_defaults: bool = True  # False: run exactly `fast` on a GPU (vae/gpu_defaults.py; the ablation)

    @property
    def fast(self) -> FastPaths:
        """The optimisations this model runs with (settable; each exact in fp32)."""
        return self._fast

    @fast.setter
    def fast(self, value: FastPaths) -> None:
        self._fast = value
        self.hold_weights()

    def hold_weights(self, channels_last: Optional[bool] = None) -> None:
        """Lay every conv weight out, in place, in the layout this model's convs read: channels-last where that
        path is on (default: `fast.channels_last`, unless fp32 on the CPU keeps it off where the weights are now:
        vae/accel/channels_last.py), else the checkpoint's contiguous layout. The weights stay
        the only copy (`vae/accel/weight_layout.py`); a conv handed weights in the other layout would reorder them, or
        its input, on every call. Architectures call it at the end of `__init__` and after every
        `load_state_dict` (`hold_weights_after_loads`); setting `fast` calls it too. Laying them out here, not in
        the first pass, matters beyond that pass's time: a re-layout inside `torch.inference_mode` makes inference
        tensors of the parameters, which a later pass with autograd cannot use."""
        weight = next(self.parameters(), None)  # none yet while a subclass's __init__ sets `fast` first
        if channels_last is None:
            channels_last = self._fast.channels_last and (
                weight is None or channels_last_keeps_fp32(weight.device, weight.dtype))
        hold_layout(conv_modules(self), channels_last)

    def hold_weights_after_loads(self) -> None:
        """`hold_weights` now and after every `load_state_dict` (a load with `assign=True` puts the checkpoint's
        own tensors in place, in the file's layout)."""
        self.hold_weights()
        self.register_load_state_dict_post_hook(lambda module, _keys: module.hold_weights())

    def gpu_defaults(self) -> GpuDefaults:
        """What the GPU ablation measured for this architecture (vae/gpu_defaults.py): whether compile and
        channels-last without fused norms make its passes faster on a GPU. An architecture declares its own; the
        default is `UNMEASURED` (every path on)."""
        return UNMEASURED

    def active_fast(self) -> FastPaths:
        """The fast paths a pass runs with: channels-last only where it passed its self-check and, on CUDA, where
        the architecture's measured GPU defaults keep it (vae/gpu_defaults.py: without fused norms SeedVR2 runs
        contiguous). `follow_gpu_defaults = False` runs exactly `fast` (the GPU ablation measures each path).
        Only a choice: the weights are left as they are (`start_pass` lays them out for a pass)."""
        fast = active(self.fast, self.device, self.dtype)
        if fast.channels_last and self.follow_gpu_defaults and self_checks.applies_to(self.device) \
                and not channels_last_applies(self.gpu_defaults(), True, fused_norms_run(self.device)):
            fast = replace(fast, channels_last=False)
        return fast

    def lay_out_weights(self, fast: FastPaths) -> None:
        """Lay the weights out for a pass running `fast` (`active_fast`'s choice): contiguous where the pass runs
        contiguous though `self.fast` has channels-last on (a device that failed the check must not run
        channels-last convs through its weights); nothing is copied where they are laid out so already. Under a
        tracer the weights are left as they are: re-laying parameters out inside a trace would put fake tensors
        in their place, which export lifts as constants; the traced convs read either layout."""
        if fast.channels_last != self.fast.channels_last and not tracing():
            self.hold_weights(fast.channels_last)

    def start_pass(self) -> FastPaths:
        """The paths of a pass that starts now (a step without causal state in: a clip's first slice, a fresh
        stream, tile or stage), with the weights laid out for them: `active_fast`, then `lay_out_weights`. The one
        call that may re-lay the weights, once where a pass starts; a later slice reads `active_fast` alone."""
        fast = self.active_fast()
        self.lay_out_weights(fast)
        return fast

    # -- the causal steps (the architecture's part) -------------------------------------------
    @abstractmethod
    def encode_step(self, pixels: torch.Tensor, state: Optional[Sequence[torch.Tensor]] = None, *,
                    collect: bool = True) -> tuple[torch.Tensor, State]:
        """One causal encode slice: [B, I, T, H, W] -> (moments [B, 2C, T', h, w], cache for the next slice).

        I is `latent_format.image_channels` here and below. First slice (`state=None`): T = 1 + tf·k frames
        (tf = `latent_format.temporal_factor`); later slices tf·k frames, with `state` the tuple the previous
        step returned. `collect=False` skips building the cache (the last slice of a clip)."""

    @abstractmethod
    def decode_step(self, latents: torch.Tensor, state: Optional[Sequence[torch.Tensor]] = None, *,
                    collect: bool = True, clamp: bool = True) -> tuple[torch.Tensor, State]:
        """One causal decode slice: [B, C, n, h, w] -> (pixels, cache). The first slice (`state=None`) gives
        1 + tf·(n-1) frames, later slices tf·n. `clamp` limits pixels to [-1, 1] (the pipelines' final clamp)."""

    @abstractmethod
    def meta_copy(self) -> "VAEModel":
        """The same architecture and options on the meta device (no memory): `cache_layout` runs it."""

    # -- whole-clip passes -------------------------------------------------------------------
    def encode_moments(self, pixels: torch.Tensor, *, temporal_slice: Optional[int] = None,
                       progress: Progress = None) -> torch.Tensor:
        """[B, I, T, H, W] in [-1, 1] -> posterior moments [B, 2C, T', h, w] (mean ‖ logvar), whole or in
        temporal slices of `temporal_slice` latent frames. `progress(done, total)` runs after each temporal
        slice; raising from it (a cancel) stops the pass there."""
        check_temporal_slice(temporal_slice)
        fmt = self.latent_format
        if fmt.padded_frames(pixels.shape[2]) != pixels.shape[2]:
            raise ValueError(f"encode needs 1+{fmt.temporal_factor}n frames, got {pixels.shape[2]}; TurboVAE.encode "
                             "pads for you")
        return self.encode_slices(pixels, temporal_slice=temporal_slice, progress=progress)

    def encode_slices(self, pixels: torch.Tensor, *, temporal_slice: Optional[int] = None,
                      progress: Progress = None) -> torch.Tensor:
        """`encode_moments` of a clip and slice the input rules have passed (vae/input_rules.py): what a pass that
        checked its input once at its entry runs (`TurboVAE`'s own pass), so nothing is checked again."""
        bounds = self.slice_bounds(pixels.shape[2], temporal_slice, decode=False)
        return run_slices(self.encode_step, pixels, bounds, {}, progress,
                          out_frames=self.latent_format.latent_frames(pixels.shape[2]))

    def decode_latents(self, latents: torch.Tensor, *, temporal_slice: Optional[int] = None,
                       clamp: bool = True, progress: Progress = None) -> torch.Tensor:
        """Raw latents [B, C, T', h, w] -> pixels [B, I, tf(T'-1)+1, H, W] (clamped as the reference does);
        `temporal_slice` and `progress` as for `encode_moments`."""
        check_temporal_slice(temporal_slice)
        return self.decode_slices(latents, temporal_slice=temporal_slice, clamp=clamp, progress=progress)

    def decode_slices(self, latents: torch.Tensor, *, temporal_slice: Optional[int] = None, clamp: bool = True,
                      progress: Progress = None) -> torch.Tensor:
        """`decode_latents` of latents and a slice the input rules have passed, as `encode_slices`."""
        bounds = self.slice_bounds(latents.shape[2], temporal_slice, decode=True)
        return run_slices(self.decode_step, latents, bounds, {"clamp": clamp}, progress,
                          out_frames=self.latent_format.pixel_frames(latents.shape[2]))

    def slice_bounds(self, frames: int, temporal_slice: Optional[int], *, decode: bool) -> list[tuple[int, int]]:
        """Whole clip, or slices of 1+k then k latent frames (1+tf·k then tf·k pixel frames for encode)."""
        if temporal_slice is None:
            return [(0, frames)]
        step = temporal_slice if decode else self.latent_format.temporal_factor * temporal_slice
        return list(split_slices(frames, 1 + step, step))

    # -- streaming (temporal slicing, tiling) ------------------------------------------------
    def encode_stream(self) -> CausalStream:
        """A fresh causal encode stream yielding moments per step (1+tf·k pixel frames first, then tf·k)."""
        tf = self.latent_format.temporal_factor
        return StepStream(self.encode_step, first=lambda t: t >= 1 and (t - 1) % tf == 0,
                          rest=lambda t: t >= tf and t % tf == 0,
                          rule=f"pixel frames: 1+{tf}k first, then {tf}k (multiples of {tf})")

    def decode_stream(self) -> CausalStream:
        """A fresh causal decode stream yielding clamped pixels per step (any number ≥ 1 of latent frames)."""
        return StepStream(self.decode_step, first=lambda t: t >= 1, rest=lambda t: t >= 1,
                          rule="latent frames: at least 1 per step")

    # -- causal cache -----------------------------------------------------------------------
    def cache_layout(self, *, decode: bool, batch: int, height: int, width: int,
                      first_frames: int = 2) -> list[tuple[str, tuple[int, ...]]]:
        """(module name, cache shape) in state order after a first slice of `first_frames` frames (latent
        frames for decode, pixel frames 1+tf·k for encode) at `height`×`width` of the step's input.
        Runs a meta-device copy, so it costs nothing; engines use it to declare the cache I/O."""
        clone = self.meta_copy()
        names = {id(m): n for n, m in clone.named_modules()}
        channels = self.latent_format.channels if decode else self.latent_format.image_channels
        x = torch.empty(batch, channels, first_frames, height, width, device="meta")
        with recorded_cache_owners() as owners:
            _, state = clone.decode_step(x, None, clamp=False) if decode else clone.encode_step(x, None)
        if len(owners) != len(state):
            raise RuntimeError(f"{type(self).__name__}: {len(state)} cache tensors but {len(owners)} recorded "
                               "owners; every cache tensor must be `put` with the module that owns it")
        return [(names[id(o)], tuple(t.shape)) for o, t in zip(owners, state)]

    # -- exact tiling ------------------------------------------------------------------------
    def exact_plan(self, *, decode: bool) -> Optional[ExactTiling]:
        """How exact tiles split this model's decode (or encode) pass, or None when the architecture has no exact
        tiling (then tiles overlap and blend, `mode="fast"`). The default is None: an architecture opts in by
        overriding it, as it supplies `decode_step`."""
        return None

    # -- frame streaming ---------------------------------------------------------------------
    def frame_stages(self, *, decode: bool) -> Optional[FrameStages]:
        """This model's decode (or encode) as stages streamed frame by frame (vae/tiling/frame_stages.py: the
        smallest step any layer can take, each stage with its own causal cache), or None: the default, an
        architecture that has not declared them runs whole steps. Equal to the whole-clip pass."""
        return None

    # -- export (engines) --------------------------------------------------------------------
    @abstractmethod
    def image_encoder(self) -> nn.Module:
        """Single-frame graph for export: [B, I, H, W] -> moments [B, 2C, h, w]; no cache logic."""

    @abstractmethod
    def image_decoder(self) -> nn.Module:
        """Single-frame graph for export: [B, C, h, w] -> pixels [B, I, H, W]; no cache logic."""

    # -- helpers shared by all architectures -------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device


def run_slices(step: Callable[..., tuple[torch.Tensor, State]], x: torch.Tensor,
               bounds: Sequence[tuple[int, int]], kwargs: dict, progress: Progress = None, *,
               out_frames: Optional[int] = None, canvas: Optional[Placement] = None,
               sample: bool = False) -> torch.Tensor:
    """A clip through `step` slice by slice (time bounds `bounds`), cache carried, the last slice collecting
    none; each slice's output is written into one output canvas of `out_frames` frames as it finishes (contiguous),
    which `canvas` allocates (default: where the outputs are made). `progress(i, n)` after each slice.

    Why a canvas, not a list of outputs concatenated at the end: the concatenation held the whole output twice,
    and a canvas can live in host memory when the output does not fit beside the pass.

    `sample` (meta-tensor predictions only, vae/planning): run the first two slices and the last, each on the
    cache the one before it left: every middle slice repeats the second on caches of the same shapes, and the
    canvas holds the whole output from the first slice on, so the peak is the same as running them all."""
    if len(bounds) > 1 and out_frames is None:
        raise ValueError("run_slices needs out_frames for a pass of several slices (the canvas's frames)")
    steps = list(enumerate(bounds))
    if sample and len(steps) > 3:
        steps = [steps[0], steps[1], steps[-1]]
    state: Optional[State] = None
    out_canvas: Optional[torch.Tensor] = None
    at = 0
    for n, (i, (a, b)) in enumerate(steps):
        carried, state = (None if state is None else CacheHandoff(state)), None  # freed as the step reads it
        out, state = step(x[:, :, a:b], carried, collect=i < len(bounds) - 1, **kwargs)
        if len(bounds) == 1:
            if canvas is not None and canvas.on_host:
                held = canvas.empty(out.shape, out.dtype)
                held.copy_(out)
                out = held
            if progress is not None:
                progress(1, 1)
            return out.contiguous()
        if out_canvas is None:
            shape = (*out.shape[:2], out_frames, *out.shape[3:])
            out_canvas = canvas.empty(shape, out.dtype) if canvas is not None else \
                torch.empty(shape, dtype=out.dtype, device=out.device)
        frames = out.shape[2]
        at = min(at, out_frames - frames) if sample else at  # a sampled run skips slices: stay inside the canvas
        out_canvas[:, :, at:at + frames].copy_(out)
        at += frames
        del out
        if progress is not None:
            progress(i + 1, len(bounds))
    return out_canvas


class StepStream(CausalStream):
    """A `CausalStream` over a step function: checks each slice's length against the stream's rule (other
    lengths would break the causal cache) and carries the cache from step to step."""

    def __init__(self, step: Callable[..., tuple[torch.Tensor, State]], *, first: Callable[[int], bool],
                 rest: Callable[[int], bool], rule: str):
        self._step, self._first, self._rest, self._rule = step, first, rest, rule
        self._state: Optional[State] = None
        self._started = False

    def step(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[2]
        ok = self._rest(t) if self._started else self._first(t)
        if not ok:
            raise ValueError(f"stream slice of {t} frames is not allowed ({self._rule}; this was the "
                             f"{'first' if not self._started else 'a later'} slice); other lengths would break the "
                             "causal cache")
        out, self._state = self._step(x, self._state, collect=True)
        self._started = True
        return out

    def close(self) -> None:
        self._state = None
        self._started = False



def split_slices(total: int, first: int, rest: int) -> Sequence[tuple[int, int]]:
    """(start, stop) pairs: one slice of `first` items, then slices of `rest` (the last may be shorter).

    The causal caches are exact for any slicing of this form because every slice after the first
    is a multiple of the temporal stride (the callers guarantee that by choosing `rest`).
    """
    if total <= 0:
        return []
    out = [(0, min(first, total))]
    start = out[0][1]
    while start < total:
        stop = min(start + rest, total)
        out.append((start, stop))
        start = stop
    return out
