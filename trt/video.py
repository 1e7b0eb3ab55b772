"""Video slice engines: what is built (names, static I/O) and how a clip runs on them.

Any VAE with the causal-step contract gets them (SeedVR2, Qwen-Image / Wan 2.1, Wan 2.2):
`decode_step(latents, state) -> (pixels, state)` with the causal memory as explicit tensors, and
`memory_layout(decode=True, ...)` naming their shapes. The engines are decided by that contract, never
by architecture name.

A clip of T >= 2 latents runs as "decode_slice_first" on latents 0..1 (a first slice of 1 + k with
k = 1) -> (pixels, causal memory), then "decode_slice_next" once per further latent, (latent, memory)
-> (pixels, memory'). That is the eager `decode_latents(z, temporal_slice=1)` slice for slice, so the
chain equals it (and the whole-clip decode) up to float rounding. Both engines are static-shape: one
pair per bucket at the bucket's latent size; the memory is one tensor per entry of `memory_layout()`,
in its order. The graphs themselves are `export.DecodeSliceGraph`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import torch
from torch import nn

from .backend import EngineRunError, LoadedEngine
from .export import DecodeSliceGraph, slice_graph_names

SLICE_FIRST = "decode_slice_first"
SLICE_NEXT = "decode_slice_next"
VIDEO_COMPONENTS = (SLICE_FIRST, SLICE_NEXT)
NEXT_LATENTS = 1  # latents per next-slice call: the smallest step, so any clip length T >= 2 chains
FIRST_LATENTS = 1 + NEXT_LATENTS  # the first slice of `temporal_slice=NEXT_LATENTS`


CONTRACT = ("decode_step", "memory_layout")  # what a model needs for slice graphs (vae/base.py's causal-step contract)


def supports_video(model: nn.Module) -> bool:
    """A decoder with explicit causal memory (`decode_step` + `memory_layout`) has slice graphs."""
    return all(callable(getattr(model, name, None)) for name in CONTRACT)


def check_video_model(model: nn.Module) -> None:
    """Raise a ValueError naming the fix when `model` has no video slice graphs."""
    missing = [name for name in CONTRACT if not callable(getattr(model, name, None))]
    if missing:
        kind = getattr(model, "kind", type(model).__name__)
        raise ValueError(f"video slice engines need a VAE with explicit causal memory ({' and '.join(CONTRACT)}); "
                         f"this {kind} VAE has no {' or '.join(missing)} — build without video (CLI: drop --video; "
                         "Build Engine: video off), or give the model the causal-step contract")


@dataclass(frozen=True)
class SliceIO:
    """Names and static shapes of one slice engine's inputs and outputs."""

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    input_shapes: Mapping[str, tuple[int, ...]]


def slice_io(model: nn.Module, component: str, latent_hw: tuple[int, int]) -> SliceIO:
    """I/O of the first or next slice engine at a latent size (batch 1)."""
    if component not in VIDEO_COMPONENTS:
        raise ValueError(f"{component!r} is not a video slice component ({', '.join(VIDEO_COMPONENTS)})")
    h, w = latent_hw
    c = model.latent_format.channels
    layout = model.memory_layout(decode=True, batch=1, height=h, width=w, first_frames=FIRST_LATENTS)
    ins, outs = slice_graph_names(len(layout))
    if component == SLICE_FIRST:
        return SliceIO(("latents",), tuple(outs), {"latents": (1, c, FIRST_LATENTS, h, w)})
    shapes = {"latents": (1, c, NEXT_LATENTS, h, w)}
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


def chain_slices(first: LoadedEngine, first_names: tuple[Sequence[str], Sequence[str]], nxt: LoadedEngine,
                 next_names: tuple[Sequence[str], Sequence[str]], z: torch.Tensor,
                 temporal_factor: int) -> torch.Tensor:
    """Decode a [1, C, T >= 2, h, w] clip: first slice, then one next slice per further latent.

    `*_names` are each engine's (input names, output names) from its identity; output 0 / input 0 are
    pixels / latents, the rest is the causal memory in the same order on both engines. Each slice's pixels
    are written into one clip tensor allocated after the first slice (no list of slices concatenated at
    the end: that held the clip twice at its peak).
    """
    (_fin, fout), (nin, nout) = first_names, next_names
    if not (len(fout) == len(nin) == len(nout)):
        raise EngineRunError(f"slice engines disagree on the causal memory: {len(fout) - 1} tensors out of "
                             f"{first.path.name}, {len(nin) - 1} into {nxt.path.name}; rebuild them together")
    if z.shape[2] < FIRST_LATENTS:
        raise EngineRunError(f"a clip for the slice engines needs >= {FIRST_LATENTS} latents, got {z.shape[2]}")
    out = first.run({"latents": z[:, :, :FIRST_LATENTS]}, 0)
    done = pixel_frames(FIRST_LATENTS, temporal_factor, first=True)
    pixels = _pixels(out, fout, done, first.path.name)
    total = done + pixel_frames(z.shape[2] - FIRST_LATENTS, temporal_factor, first=False)
    clip = torch.empty((*pixels.shape[:2], total, *pixels.shape[3:]), dtype=pixels.dtype, device=pixels.device)
    clip[:, :, :done] = pixels
    memory = [out[name] for name in fout[1:]]
    step = pixel_frames(NEXT_LATENTS, temporal_factor, first=False)
    for t in range(FIRST_LATENTS, z.shape[2], NEXT_LATENTS):
        del out, pixels  # the previous slice's outputs are not needed while the next one runs
        feeds = {nin[0]: z[:, :, t:t + NEXT_LATENTS], **dict(zip(nin[1:], memory))}
        out = nxt.run(feeds, 0)
        pixels = _pixels(out, nout, step, nxt.path.name, like=clip)
        clip[:, :, done:done + step] = pixels
        done += step
        memory = [out[name] for name in nout[1:]]
    return clip
