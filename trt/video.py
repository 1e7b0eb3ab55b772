"""Video slice engines: what is built (names, static I/O) and how a clip runs on them.

Any VAE with the causal-step contract gets them (SeedVR2, Qwen-Image / Wan 2.1, Wan 2.2):
`decode_step(latents, state) -> (pixels, state)` with the causal cache as explicit tensors, and
`cache_layout(decode=True, ...)` naming their shapes. The engines are decided by that contract, never
by architecture name.

A clip runs as "decode_slice_first" on latents 0..k (the first slice 1 + k) -> (pixels, causal cache),
then "decode_slice_next" on k latents at a time, (latents, memory) -> (pixels, memory'). That is the eager
`decode_latents(z, temporal_slice=k)` schedule, so the chain equals it (and the whole-clip decode) up to
float rounding. k is chosen at build time (`slice_latents`; default: the eager decode's measured fastest
slice on the build device, see `default_slice_latents`) and read back from the engines' static shapes.
A clip whose length does not fill the last slice is padded at the end with zero latents and its pixels
cropped: the decoder is causal, so the padding cannot reach an earlier frame (it costs at most k - 1
latents of work). Both engines are static-shape: one pair per bucket at the bucket's latent size; the
memory is one tensor per entry of `cache_layout()`, in its order. The graphs themselves are
`export.DecodeSliceGraph`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import torch
from torch import nn

from ..vae.memory.device import FASTEST_SLICE
from .interface import EngineRunError, LoadedEngine
from .export import DecodeSliceGraph, slice_graph_names

SLICE_FIRST = "decode_slice_first"
SLICE_NEXT = "decode_slice_next"
VIDEO_COMPONENTS = (SLICE_FIRST, SLICE_NEXT)
MAX_SLICE_LATENTS = 16  # a static next slice longer than this holds a clip's worth of activations at once


def default_slice_latents(device: torch.device) -> int:
    """Latents per next-slice engine call when the build does not say: the slice the eager decode measured
    fastest on this device type (`vae.memory.device.FASTEST_SLICE`), else 1 (the smallest static working set)."""
    return FASTEST_SLICE.get(torch.device(device).type, 1)


def check_slice_latents(k: int) -> int:
    """`k` as latents per next slice, or a ValueError naming the range."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SLICE_LATENTS:
        raise ValueError(f"slice_latents must be an integer from 1 to {MAX_SLICE_LATENTS} (latents per next-slice "
                         f"engine call), got {k!r}")
    return k


CONTRACT = ("decode_step", "cache_layout")  # what a model needs for slice graphs (vae/base.py's causal-step contract)


def supports_video(model: nn.Module) -> bool:
    """A decoder with explicit causal cache (`decode_step` + `cache_layout`) has slice graphs."""
    return all(callable(getattr(model, name, None)) for name in CONTRACT)


def check_video_model(model: nn.Module) -> None:
    """Raise a ValueError naming the fix when `model` has no video slice graphs."""
    missing = [name for name in CONTRACT if not callable(getattr(model, name, None))]
    if missing:
        kind = getattr(model, "kind", type(model).__name__)
        raise ValueError(f"video slice engines need a VAE with explicit causal cache ({' and '.join(CONTRACT)}); "
                         f"this {kind} VAE has no {' or '.join(missing)} — build without video (CLI: drop --video; "
                         "Build Engine: video off), or give the model the causal-step contract")


@dataclass(frozen=True)
class SliceIO:
    """Names and static shapes of one slice engine's inputs and outputs."""

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    input_shapes: Mapping[str, tuple[int, ...]]


def slice_io(model: nn.Module, component: str, latent_hw: tuple[int, int], slice_latents: int = 1) -> SliceIO:
    """I/O of the first (1 + k latents) or next (k latents) slice engine at a latent size (batch 1)."""
    if component not in VIDEO_COMPONENTS:
        raise ValueError(f"{component!r} is not a video slice component ({', '.join(VIDEO_COMPONENTS)})")
    k = check_slice_latents(slice_latents)
    h, w = latent_hw
    c = model.latent_format.channels
    layout = model.cache_layout(decode=True, batch=1, height=h, width=w, first_frames=1 + k)
    ins, outs = slice_graph_names(len(layout))
    if component == SLICE_FIRST:
        return SliceIO(("latents",), tuple(outs), {"latents": (1, c, 1 + k, h, w)})
    shapes = {"latents": (1, c, k, h, w)}
    shapes.update({name: tuple(shape) for name, (_conv, shape) in zip(ins[1:], layout)})
    return SliceIO(tuple(ins), tuple(outs), shapes)


def slice_module(model: nn.Module, component: str) -> nn.Module:
    return DecodeSliceGraph(model, first=component == SLICE_FIRST)


def example_inputs(io: SliceIO, seed: int = 0) -> list[torch.Tensor]:
    """Random tensors of the static input shapes, in input order (export traces shapes, not values)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(io.input_shapes[name], generator=g) for name in io.input_names]


def pixel_frames(latents: int, temporal_factor: int, *, first: bool) -> int:
    """Frames one slice decodes: 1 + tf·(n-1) for the first slice of a clip, tf·n after it."""
    return 1 + temporal_factor * (latents - 1) if first else temporal_factor * latents


def _pixels(out: Mapping[str, torch.Tensor], names: Sequence[str], expected_frames: int, who: str,
            like: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Output 0 of a slice engine, checked: 5-D with `expected_frames` frames, and (`like`: the clip it goes
    into) the clip's batch, channels, frame size and dtype, so no slice is silently broadcast or cast."""
    pixels = out[names[0]]
    if pixels.ndim != 5 or pixels.shape[2] != expected_frames or (like is not None and (
            pixels.shape[:2] != like.shape[:2] or pixels.shape[3:] != like.shape[3:] or pixels.dtype != like.dtype)):
        want = f"{expected_frames} frames" if like is None else \
            f"{(*like.shape[:2], expected_frames, *like.shape[3:])} {like.dtype}"
        raise EngineRunError(f"{who}: pixels {tuple(pixels.shape)} {pixels.dtype}, expected {want}")
    return pixels


def padded_latents(latents: int, first: int, step: int) -> int:
    """Latents the chain runs for a clip of `latents`: one first slice of `first`, then whole steps of `step`."""
    rest = max(latents - first, 0)
    return first + -(-rest // step) * step


def chain_slices(first: LoadedEngine, first_names: tuple[Sequence[str], Sequence[str]], nxt: LoadedEngine,
                 next_names: tuple[Sequence[str], Sequence[str]], z: torch.Tensor, temporal_factor: int, *,
                 first_latents: int, next_latents: int) -> torch.Tensor:
    """Decode a [1, C, T >= 2, h, w] clip: one first slice of `first_latents`, then next slices of
    `next_latents` (the engines' static latent counts), the clip zero-padded at the end to fill the last
    slice and the padding's pixels cropped (causal: exact).

    `*_names` are each engine's (input names, output names) from its identity; output 0 / input 0 are
    pixels / latents, the rest is the causal cache in the same order on both engines. Each slice's pixels
    are written into one clip tensor allocated after the first slice (no list of slices concatenated at
    the end: that held the clip twice at its peak).
    """
    (_fin, fout), (nin, nout) = first_names, next_names
    if not (len(fout) == len(nin) == len(nout)):
        raise EngineRunError(f"slice engines disagree on the causal cache: {len(fout) - 1} tensors out of "
                             f"{first.path.name}, {len(nin) - 1} into {nxt.path.name}; rebuild them together")
    latents = z.shape[2]
    if latents < 2:
        raise EngineRunError(f"a clip for the slice engines needs >= 2 latents, got {latents}")
    padded = padded_latents(latents, first_latents, next_latents)
    if padded > latents:
        z = torch.cat([z, z.new_zeros((*z.shape[:2], padded - latents, *z.shape[3:]))], dim=2)
    total = pixel_frames(latents, temporal_factor, first=True)
    out = first.run({"latents": z[:, :, :first_latents]}, 0)
    done = pixel_frames(first_latents, temporal_factor, first=True)
    pixels = _pixels(out, fout, done, first.path.name)
    clip = torch.empty((*pixels.shape[:2], total, *pixels.shape[3:]), dtype=pixels.dtype, device=pixels.device)
    clip[:, :, :min(done, total)] = pixels[:, :, :total]
    memory = [out[name] for name in fout[1:]]
    step = pixel_frames(next_latents, temporal_factor, first=False)
    for t in range(first_latents, padded, next_latents):
        del out, pixels  # the previous slice's outputs are not needed while the next one runs
        feeds = {nin[0]: z[:, :, t:t + next_latents], **dict(zip(nin[1:], memory))}
        out = nxt.run(feeds, 0)
        pixels = _pixels(out, nout, step, nxt.path.name, like=clip)
        keep = min(step, total - done)
        clip[:, :, done:done + keep] = pixels[:, :, :keep]
        done += keep
        memory = [out[name] for name in nout[1:]]
    return clip
