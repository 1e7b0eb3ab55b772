"""The contract every VAE architecture in this package implements.

`TurboVAE` (vae/api.py), the tiling engine, the engine exporters and the ComfyUI nodes only talk to a
model through `VAEModel`; architecture modules (vae/seedvr2, vae/wan) never need to know about them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional, Sequence

import torch
from torch import nn


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

    def pixel_frames(self, latent_frames: int) -> int:
        """Pixel frames a decoder produces for `latent_frames` latents (n+1 -> 4n+1)."""
        return (latent_frames - 1) * self.temporal_factor + 1


@dataclass(frozen=True)
class MemoryModel:
    """Working memory of one pass, used to pick temporal slices and tile sizes automatically.

    Bytes are per pixel of the *pixel-space* frame (output for decode, input for encode) per frame
    processed at once, for a 2-byte dtype; fp32 doubles them. `fixed_bytes` covers
    latent-resolution work (attention, mid block) that does not shrink with tiles.
    """

    encode_bytes_per_pixel: float
    decode_bytes_per_pixel: float
    fixed_bytes: int = 0

    def bytes_needed(self, pixels: int, frames: int, dtype: torch.dtype, *, decode: bool) -> int:
        per_px = self.decode_bytes_per_pixel if decode else self.encode_bytes_per_pixel
        scale = torch.finfo(dtype).bits / 16
        return int(per_px * scale * pixels * frames + self.fixed_bytes)


# progress(done, total) after each unit of work; raising from it cancels the pass
Progress = Optional[Callable[[int, int], None]]


class CausalStream(ABC):
    """Runs a clip through a causal encoder or decoder slice by slice, carrying the causal memory.

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


class CausalState(ABC):
    """What a pass carries from layer to layer and slice to slice (causal caches, memory read and written)
    and may advance in any layer call.

    Why: a layer run that fails part-way (a compiled region whose later sub-graph fails after an earlier
    one advanced the cache) must be re-run from the state it started from, or that slice reads the wrong
    history and comes out silently wrong. `snapshot` is cheap (references, not copies: the architectures
    replace cache entries, they never write into them).
    """

    @abstractmethod
    def snapshot(self) -> object:
        """An opaque record of the current state."""

    @abstractmethod
    def restore(self, saved: object) -> None:
        """Back to the state `snapshot` recorded."""


class VAEModel(nn.Module, ABC):
    """An architecture: holds the weights and runs validated tensors.

    Inputs reaching these methods are already checked by `TurboVAE`: 5-D, right channels, model
    dtype and device, spatial dims multiples of `latent_format.spatial_factor`, and pixel clips of
    4n+1 frames.
    """

    kind: ClassVar[str]
    latent_format: LatentFormat
    memory_model: MemoryModel

    # -- whole-clip passes -------------------------------------------------------------------
    @abstractmethod
    def encode_moments(self, pixels: torch.Tensor, *, temporal_slice: Optional[int] = None,
                       progress: Progress = None) -> torch.Tensor:
        """[B, I, T, H, W] in [-1, 1] -> posterior moments [B, 2C, T', h, w] (mean ‖ logvar).

        I is `latent_format.image_channels` here and below. `progress(done, total)` runs after each temporal
        slice; raising from it (a cancel) stops the pass there."""

    @abstractmethod
    def decode_latents(self, latents: torch.Tensor, *, temporal_slice: Optional[int] = None,
                       progress: Progress = None) -> torch.Tensor:
        """Raw latents [B, C, T', h, w] -> pixels [B, I, 4(T'-1)+1, H, W] (clamped as the reference does);
        `progress` as for `encode_moments`."""

    # -- streaming (temporal slicing, tiling) ------------------------------------------------
    @abstractmethod
    def encode_stream(self) -> CausalStream:
        """A fresh causal encode stream yielding moments per step."""

    @abstractmethod
    def decode_stream(self) -> CausalStream:
        """A fresh causal decode stream yielding pixels per step."""

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


def check_temporal_slice(temporal_slice: Optional[int]) -> None:
    """ValueError unless `temporal_slice` is None (chosen from free memory) or an integer ≥ 1 latent frame
    (0 or less would never advance through the clip)."""
    if temporal_slice is None:
        return
    if isinstance(temporal_slice, bool) or not isinstance(temporal_slice, int):
        raise ValueError(f"temporal_slice must be an integer, got {temporal_slice!r}")
    if temporal_slice < 1:
        raise ValueError(f"temporal_slice={temporal_slice} must be ≥ 1 latent frame (or None to choose it from "
                         "free memory)")


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


def tracing() -> bool:
    """True under torch.compile / torch.export / jit tracing, where tensors are fake (no storage to reuse)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None:
        if compiler.is_compiling():
            return True
        is_exporting = getattr(compiler, "is_exporting", None)
        if is_exporting is not None and is_exporting():
            return True
    return torch.jit.is_tracing()
