"""The rules of a valid pass input, in one place: the tensor or shape a pass reads (its rank, channels, spatial
multiple, frames and the 1 + 4n pad), and the tiling arguments (mode, tile, overlap, temporal slice).

Why one home: the public API, the planner (`plan_pass`), the tiled API, the parallel passes and the nodes take the
same inputs; each used to write the rules again, so one node decode checked its mode three times and could word the
same mistake three ways. A pass checks its input here once, at its entry, and hands the validated value down (a
5-D tensor, a `PassShape`, a `TilingArgs`); the layers below trust it. The 1 + 4n pad itself is the latent format's
(`LatentFormat.padded_frames`): the rules here ask it.

Errors are ValueErrors naming the fix (`error=` lets the planner's front door raise its own `PlanError`, a
ValueError too); nothing here imports the models, so every layer can use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch

from .memory.device import check_fits

MODES = ("auto", "fast", "exact")  # what a caller asks for, the default first (the nodes offer them in this order)
DEFAULT_TILE_PX = 512  # fast/exact tiles asked for without a size (ComfyUI's default too)
DEFAULT_OVERLAP_PX = 64
MIN_TILE_LATENT = 8  # the smallest tile in latents (64 px at 8x): below this tiles are mostly halo/ramp

Error = type  # a ValueError subclass a caller raises its rule failures as


@dataclass(frozen=True)
class PassShape:
    """A validated pass input: `dims` [B, C, T, H, W] as the pass runs it (latents for decode; pixels for encode,
    the clip padded to 1 + 4n frames). Made by `pass_shape`, or by `of` from a tensor `pass_tensor` passed."""

    dims: tuple[int, int, int, int, int]
    decode: bool

    @classmethod
    def of(cls, x: torch.Tensor, *, decode: bool) -> "PassShape":
        """The shape of a tensor the rules have passed (5-D; an encode's clip already padded)."""
        return cls(tuple(int(d) for d in x.shape), decode)  # type: ignore[arg-type]

    def one_item(self) -> "PassShape":
        """The shape of one batch item (the nodes decode latents item by item)."""
        return PassShape((1, *self.dims[1:]), self.decode)  # type: ignore[arg-type]


@dataclass(frozen=True)
class TilingArgs:
    """Validated tiling arguments (`tiling_args`): `mode` one of MODES; `tile_px` None (chosen), 0 (sized by the
    budget) or a tile side in pixels; `overlap_px` in pixels, resolved; `temporal_slice` None (chosen) or ≥ 1."""

    mode: str = "auto"
    tile_px: Optional[int] = None
    overlap_px: Optional[int] = None
    temporal_slice: Optional[int] = None


# -- the tiling arguments ------------------------------------------------------------------------------------
def check_mode(mode: str, error: Error = ValueError) -> str:
    if mode not in MODES:
        raise error(f"mode={mode!r} is not a valid choice; mode must be one of {', '.join(MODES)}")
    return mode


def check_temporal_slice(temporal_slice: Optional[int]) -> Optional[int]:
    """ValueError unless `temporal_slice` is None (chosen from free memory) or an integer ≥ 1 latent frame
    (0 or less would never advance through the clip)."""
    if temporal_slice is None:
        return None
    if isinstance(temporal_slice, bool) or not isinstance(temporal_slice, int):
        raise ValueError(f"temporal_slice must be an integer, got {temporal_slice!r}")
    if temporal_slice < 1:
        raise ValueError(f"temporal_slice={temporal_slice} must be ≥ 1 latent frame (or None to choose it from "
                         "free memory)")
    return temporal_slice


def _integer(name: str, value: Optional[int]) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{name} must be an integer, got {value!r}")


def check_tile(tile_px: Optional[int], min_tile_px: int, name: str = "tile_px", *,
               smaller_clamped: bool = False) -> Optional[int]:
    """A tile side: None (chosen), 0 (sized by the budget) or at least `min_tile_px` pixels (`smaller_clamped`: a
    smaller one is taken as the floor, as the parallel passes do)."""
    _integer(name, tile_px)
    if tile_px is not None and tile_px < 0:
        raise ValueError(f"{name}={tile_px} is negative; use a size ≥ {min_tile_px} pixels, or 0 to size tiles from "
                         "the memory budget")
    if tile_px and tile_px < min_tile_px and not smaller_clamped:
        raise ValueError(f"{name}={tile_px} is too small; use at least {min_tile_px} pixels (or 0 to size tiles "
                         "from the memory budget)")
    return tile_px


def check_overlap(overlap_px: Optional[int], tile_px: Optional[int], spatial_factor: int,
                  names: tuple[str, str] = ("overlap_px", "tile_px")) -> int:
    """The overlap in pixels, ≥ 0 and under half the tile (None: 64 px, or a quarter of a smaller explicit tile)."""
    name, tile_name = names
    if overlap_px is None:
        overlap_px = default_overlap(tile_px)
    _integer(name, overlap_px)
    if overlap_px < 0:
        raise ValueError(f"{name} must be ≥ 0 pixels, got {overlap_px}")
    if tile_px and 2 * overlap_px >= tile_px:
        raise ValueError(f"{name}={overlap_px} must be less than half the tile ({tile_name}={tile_px} pixels): tiles "
                         f"would overlap their neighbours' neighbours; use {name} ≤ {tile_px // 2 - spatial_factor}")
    return overlap_px


def default_overlap(tile_px: Optional[int]) -> int:
    """The overlap of tiles given without one: 64 px, or a quarter of a smaller explicit tile."""
    return min(DEFAULT_OVERLAP_PX, tile_px // 4) if isinstance(tile_px, int) and tile_px > 0 else DEFAULT_OVERLAP_PX


def tiling_args(mode: str, tile_px: Optional[int], overlap_px: Optional[int], temporal_slice: Optional[int], *,
                spatial_factor: int, min_tile_px: Optional[int] = None,
                names: tuple[str, str] = ("tile_px", "overlap_px")) -> TilingArgs:
    """The tiling arguments checked, each once: ValueError naming the fix for a mode, tile, overlap or temporal slice
    the tiler cannot honour. `min_tile_px`: the smallest tile (default MIN_TILE_LATENT latents at `spatial_factor`);
    `names`: what the caller calls the tile and the overlap (the nodes' widgets: tile_size, overlap)."""
    check_mode(mode)
    floor = MIN_TILE_LATENT * spatial_factor if min_tile_px is None else min_tile_px
    tile_px = check_tile(tile_px, floor, names[0])
    overlap_px = check_overlap(overlap_px, tile_px, spatial_factor, (names[1], names[0]))
    return TilingArgs(mode, tile_px, overlap_px, check_temporal_slice(temporal_slice))


# -- the input: a shape ----------------------------------------------------------------------------------------
def _what(decode: bool) -> str:
    return "latents" if decode else "pixels"


def _channels_of(fmt, decode: bool) -> int:
    return fmt.channels if decode else fmt.image_channels


def check_channels(shape: Sequence[int], fmt, kind: str, *, decode: bool, error: Error = ValueError) -> None:
    """The channels of an input of `shape` ([B, C, ...]) are the VAE's; else the error, with the likely fix."""
    what, channels = _what(decode), _channels_of(fmt, decode)
    shape = tuple(shape)
    if shape[1] == channels:
        return
    hint = ""
    if shape[-1] == channels:
        hint = " (channels-last? permute to channels-first)"
    elif what == "pixels" and (shape[1], channels) == (3, 4):
        hint = (" (RGB into an RGBA VAE? append an opaque alpha channel of 1.0: "
                "torch.cat([x, torch.ones_like(x[:, :1])], dim=1))")
    elif what == "pixels" and shape[1] > channels:
        hint = f" (keep the first {channels}: x[:, :{channels}])"
    raise error(f"{what} must have {channels} channels for a {kind} VAE; got shape {shape}{hint}")


def check_spatial(h: int, w: int, fmt, kind: str, error: Error = ValueError) -> None:
    """Pixel height and width are multiples of the VAE's spatial factor."""
    f = fmt.spatial_factor
    if h % f or w % f:
        raise error(f"pixel height and width must be multiples of {f} for a {kind} VAE; got {h}x{w}. "
                    f"Crop or pad to {h - h % f}x{w - w % f} or {math.ceil(h / f) * f}x{math.ceil(w / f) * f} "
                    "(turbovae.pad_to_multiple pads by replication)")


def shape_dims(shape: Union[Sequence[int], torch.Size], *, what: str = "input", channels: Union[int, str] = "C",
               error: Error = ValueError) -> tuple[int, int, int, int, int]:
    """`shape` as 5-D positive integers ([B, C, H, W] an image of one frame)."""
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise error(f"shape must be a sequence of integers, got {shape!r}") from None
    if len(dims) == 4:
        dims = dims[:2] + (1,) + dims[2:]
    if len(dims) != 5 or min(dims) < 1:
        raise error(f"{what} shape must be [B, {channels}, T, H, W] (or [B, {channels}, H, W] for an image) of "
                    f"positive sizes; got {dims}")
    return dims  # type: ignore[return-value]


def pass_shape(shape: Union[Sequence[int], torch.Size], fmt, kind: str, *, decode: bool, pad: bool,
               error: Error = ValueError) -> PassShape:
    """The pass input of `shape` (latents for decode, pixels for encode; 4-D: one frame), checked: 5-D of positive
    sizes, the VAE's channels, pixels a multiple of its spatial factor, and an encode's clip 1 + 4n frames — padded
    to it with `pad` (as an encode pads a clip), else an error saying so."""
    channels = _channels_of(fmt, decode)
    dims = shape_dims(shape, what=_what(decode), channels=channels, error=error)
    check_channels(dims, fmt, kind, decode=decode, error=error)
    if not decode:
        check_spatial(dims[3], dims[4], fmt, kind, error)
        t = fmt.padded_frames(dims[2])
        if t != dims[2] and not pad:
            raise error(f"pixels shape {dims}: the frames must be 1 + {fmt.temporal_factor}n (pad_frames pads a "
                        "clip as encode does)")
        dims = (dims[0], dims[1], t, dims[3], dims[4])
    return PassShape(dims, decode)


# -- the input: a tensor ---------------------------------------------------------------------------------------
def pass_tensor(x: torch.Tensor, fmt, kind: str, *, decode: bool) -> torch.Tensor:
    """The pass input `x` checked and made 5-D (a 4-D tensor is one frame): a floating-point tensor of the VAE's
    channels, not empty, that could fit in memory, finite; pixels a multiple of the spatial factor. An encode's
    clip is padded by `TurboVAE.pad_frames` after this."""
    what, channels = _what(decode), _channels_of(fmt, decode)
    layout = f"[B, {channels}, T, h, w]" if decode else f"[B, {channels}, T, H, W] in [-1, 1]"
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{what} must be a torch.Tensor {layout}, got {type(x).__name__}")
    if x.ndim == 4:
        x = x.unsqueeze(2)
    if x.ndim != 5:
        raise ValueError(f"{what} must be {layout} (or 4-D for a single frame); got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{what} must be a floating-point tensor (got {x.dtype}); convert with .float()")
    check_channels(x.shape, fmt, kind, decode=decode)
    if 0 in x.shape:
        raise ValueError(f"{what} is empty (shape {tuple(x.shape)}); nothing to {'decode' if decode else 'encode'}")
    check_fits(what, tuple(x.shape), torch.float32, x.device)  # an expanded view could be any size
    if not torch.isfinite(x).all():
        raise ValueError(f"{what} contain NaN or inf values; check the upstream node (e.g. an fp16 overflow)")
    if not decode:
        check_spatial(x.shape[-2], x.shape[-1], fmt, kind)
    return x
