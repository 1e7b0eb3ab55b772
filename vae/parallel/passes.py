"""`decode_parallel` / `encode_parallel`: the exact pass with its frame split across devices or ranks.

Two ways to supply the devices, one code path (`sharded.sharded_pass`):
- `devices=[...]`: this process drives every listed device, one thread per device (what ComfyUI needs; CPU
  entries work too, which is how the tests run it). The model is copied once per extra device.
- `group=` (or the default process group when initialised, e.g. under torchrun): every rank calls with the
  same full input and gets the whole result; the model runs on each rank's `vae.device`.
The result equals the single-device exact tiled pass (`decode_tiled(..., mode="exact")`).
"""

from __future__ import annotations

import copy
import logging
import weakref
from typing import Optional, Sequence, Union

import torch
import torch.distributed as dist

from ..base import Progress
from ..api import TurboVAE, moments_to_latents
from ..loader import DeviceUnavailable, resolve_device
from ..input_rules import (DEFAULT_TILE_PX, MIN_TILE_LATENT, PassShape, TilingArgs, check_temporal_slice, check_tile,
                           pass_shape)
from ..tiling.exact import ExactPlan, supports_exact
from .bands import BandPlan
from .collectives import DistCollective, process_group_trusted, run_on_devices
from .plan import RankBudget, ShardedPlan, plan_sharded
from .predict import GROUP, THREADS, RankSetup
from .sharded import sharded_pass

log = logging.getLogger(__name__)

DeviceList = Optional[Sequence[Union[str, torch.device]]]

_replicas: "weakref.WeakKeyDictionary[torch.nn.Module, dict[str, torch.nn.Module]]" = weakref.WeakKeyDictionary()


def parse_devices(devices: Union[str, Sequence[Union[str, torch.device]]]) -> list[torch.device]:
    """`"all"` (every visible CUDA device, else the CPU), `"cuda:0,cuda:1"`, or a list of names/devices."""
    if isinstance(devices, str):
        if devices.strip().lower() == "all":
            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            return [torch.device("cuda", i) for i in range(n)] or [torch.device("cpu")]
        devices = [d for d in (p.strip() for p in devices.split(",")) if d]
    try:
        out = [resolve_device(d) for d in devices]
    except DeviceUnavailable as e:
        raise ValueError(f"devices must name torch devices that exist here, like 'cuda:0,cuda:1' or 'cpu'; got "
                         f"{devices!r}: {e}") from None
    if not out:
        raise ValueError("devices is empty; list at least one device (e.g. ['cuda:0', 'cuda:1'] or 'all')")
    for d in out:
        if d.type not in ("cuda", "cpu"):
            raise ValueError(f"device {d}: only CUDA and CPU devices are supported for parallel passes")
    return [torch.device("cuda", d.index or 0) if d.type == "cuda" else d for d in out]


def _replica(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """The model on `device`: itself when already there, else a copy made once and kept with the model."""
    here = next(model.parameters()).device
    if here == device or (here.type == device.type == "cpu"):
        return model
    copies = _replicas.setdefault(model, {})
    key = str(device)
    if key not in copies:
        log.info("TurboVAE: copying the VAE to %s for the parallel pass", device)
        copies[key] = copy.deepcopy(model).to(device)
    return copies[key]


def _ranks(vae: TurboVAE, devices: DeviceList, group) -> tuple[Optional[DistCollective], list[torch.device]]:
    """(the process group's collective, no devices) under a process group that passes its self-check, else (None,
    the devices this process drives)."""
    if devices is not None and group is not None:
        raise ValueError("pass devices= (one process, several devices) or group= (one process per rank), not both")
    if group is not None or (devices is None and dist.is_available() and dist.is_initialized()):
        comm = DistCollective(group, vae.device)
        if process_group_trusted(comm):
            return comm, []
        devices = [vae.device]  # the group failed its self-check: this rank runs the whole pass
    devs = parse_devices(devices) if devices is not None else parse_devices("all")
    if devs == [torch.device("cpu")] and devices is None:
        devs = [vae.device]
    return None, devs


def _parallel(vae: TurboVAE, x: torch.Tensor, *, decode: bool, devices: DeviceList, group,
              tile_px: Optional[int], temporal_slice: Optional[int], progress: Progress,
              output_device: Optional[torch.device]) -> torch.Tensor:
    check_tile(tile_px, MIN_TILE_LATENT * vae.spatial_factor, smaller_clamped=True)  # a smaller one runs at the floor
    check_temporal_slice(temporal_slice)
    return _parallel_checked(vae, x, decode=decode, devices=devices, group=group, tile_px=tile_px,
                             temporal_slice=temporal_slice, progress=progress, output_device=output_device)


def _parallel_checked(vae: TurboVAE, x: torch.Tensor, *, decode: bool, devices: DeviceList, group,
                      tile_px: Optional[int], temporal_slice: Optional[int], progress: Progress,
                      output_device: Optional[torch.device]) -> torch.Tensor:
    """`_parallel` of checked input and arguments."""
    what = "decode" if decode else "encode"
    if not supports_exact(vae.model, decode=decode):
        raise ValueError(f"a {vae.kind} VAE has no exact plan, so it cannot {what} in parallel; use decode_tiled")
    f = vae.spatial_factor
    in_scale = 1 if decode else f
    h_lat, w_lat = x.shape[-2] // in_scale, x.shape[-1] // in_scale
    latent_frames = x.shape[2] if decode else vae.latent_format.latent_frames(x.shape[2])
    out_device = torch.device(output_device) if output_device is not None else vae.device
    comm, devs = _ranks(vae, devices, group)
    if comm is None and len(devs) == 1:
        log.info("TurboVAE: one device (%s) for the parallel %s; it runs as the single-device exact pass",
                 devs[0], what)
    if tile_px == 0:  # sized by the sharded pass's own predicted peak on every rank (vae/parallel/plan.py)
        plan = _plan_bands(vae, tuple(x.shape), decode=decode, comm=comm, devices=devs,
                           temporal_slice=temporal_slice, output_device=out_device)
        tile_lat, temporal_slice = plan.tile_latent, plan.temporal_slice
    else:
        tile_lat = max(MIN_TILE_LATENT, (tile_px or DEFAULT_TILE_PX) // f)
        if temporal_slice is None:
            temporal_slice = _slice_for_tile(vae, tile_lat, h_lat, w_lat, latent_frames, decode)
        if comm is not None:  # the slice each rank's budget allows: every rank takes the smallest (None = whole)
            tile_lat, ts = comm.agree_min([tile_lat, temporal_slice or latent_frames])
            temporal_slice = None if ts >= latent_frames else ts
    # an explicit (or default) tile is shared by the bands; tile_px=0 sized each band's own tiles
    kwargs = dict(decode=decode, tile_latent=tile_lat, temporal_slice=temporal_slice, output_device=out_device,
                  share_tile=tile_px != 0)
    if comm is not None:
        with torch.inference_mode():
            out = sharded_pass(vae.model, x, comm, progress=progress, **kwargs)
        return out.to(vae.dtype)
    models = [_replica(vae.model, d) for d in devs]
    out = run_on_devices(devs, lambda comm: sharded_pass(models[comm.rank], x, comm,
                                                         progress=progress if comm.rank == 0 else None, **kwargs))
    return out.to(vae.dtype)


def plan_parallel(vae: TurboVAE, shape: Sequence[int], *, decode: bool, devices: DeviceList = None, group=None,
                  temporal_slice: Optional[int] = None,
                  output_device: Optional[torch.device] = None) -> ShardedPlan:
    """The plan `decode_parallel` / `encode_parallel(..., tile_px=0)` run for input `shape` ([B, C, T, H, W] latents
    or pixels, 4-D images too; an encode's clip padded to 1 + 4n frames as it pads it) over `devices` or the ranks
    of `group` (every rank calls it): the band tile and temporal slice, and the peak predicted for each rank this
    process runs. BudgetTooSmall when none fits `vae.budget`."""
    shape = pass_shape(shape, vae.latent_format, vae.kind, decode=decode, pad=True).dims
    check_temporal_slice(temporal_slice)
    out_device = torch.device(output_device) if output_device is not None else vae.device
    comm, devs = _ranks(vae, devices, group)
    return _plan_bands(vae, shape, decode=decode, comm=comm, devices=devs, temporal_slice=temporal_slice,
                       output_device=out_device)


def _where(device: torch.device) -> str:
    """One name per memory: the CPU, or a CUDA device by index."""
    device = torch.device(device)
    return "cpu" if device.type == "cpu" else f"{device.type}:{device.index or 0}"


def _plan_bands(vae: TurboVAE, shape: tuple[int, ...], *, decode: bool, comm: Optional[DistCollective],
                devices: Sequence[torch.device], temporal_slice: Optional[int],
                output_device: torch.device) -> ShardedPlan:
    """The `tile_px=0` plan: the ranks this process runs (every device's with `devices`, its own under a process
    group) with their budgets (`vae.budget` on their device, shared by the ranks of this process on one device)."""
    fmt, f = vae.latent_format, vae.spatial_factor
    in_scale = 1 if decode else f
    h_lat, w_lat = shape[-2] // in_scale, shape[-1] // in_scale
    latents = shape[2] if decode else fmt.latent_frames(shape[2])
    n = comm.size if comm is not None else len(devices)
    bands = BandPlan.split(h_lat, w_lat, n)
    staged = isinstance(vae.model.exact_plan(decode=decode), ExactPlan)
    out_here = _where(output_device)
    if comm is not None:
        me = vae.device
        setup = RankSetup(comm.rank, n, GROUP, output_here=_where(me) == out_here)
        ranks = [RankBudget(setup, me, vae._paths(me), vae.budget.resolve(me))]  # noqa: SLF001
        all_cpu = comm.agree_min([int(me.type == "cpu")])[0] == 1  # the slice ladder is the same on every rank
    else:
        where = [_where(d) for d in devices]
        out_numel = (shape[0] * fmt.image_channels * fmt.pixel_frames(shape[2]) * h_lat * f * w_lat * f if decode
                     else shape[0] * 2 * fmt.channels * latents * h_lat * w_lat)
        resident = next((r for r, w in enumerate(where) if w == out_here), None)
        ranks = []
        for r, d in enumerate(devices):
            setup = RankSetup(r, n, THREADS, input_here=where[r] == _where(vae.device),
                              output_here=r == 0 and where[0] == out_here,
                              peers_here=tuple(w == where[r] for w in where),
                              # the canvas rank 0 makes on another rank's device counts there
                              resident_bytes=4 * out_numel if r == resident and r != 0 else 0)
            ranks.append(RankBudget(setup, d, vae._paths(d), vae.budget.resolve(d),  # noqa: SLF001
                                    shared_by=where.count(where[r])))
        all_cpu = all(d.type == "cpu" for d in devices)
    return plan_sharded(vae._meta(), shape, decode=decode, dtype=vae.dtype, spatial_factor=f,  # noqa: SLF001
                        bands=bands, staged=staged, latents=latents, ranks=ranks, temporal_slice=temporal_slice,
                        slice_device_type="cpu" if all_cpu else "cuda", agree=comm)


def _slice_for_tile(vae: TurboVAE, tile_lat: int, h_lat: int, w_lat: int, latent_frames: int,
                    decode: bool) -> Optional[int]:
    """The temporal slice the single-device plan of exact tiles of this size takes under the VAE's budget."""
    fmt, f = vae.latent_format, vae.spatial_factor
    shape = (1, fmt.channels, latent_frames, h_lat, w_lat) if decode else \
        (1, fmt.image_channels, fmt.pixel_frames(latent_frames), h_lat * f, w_lat * f)
    plan = vae.plan_checked(PassShape(shape, decode), TilingArgs("exact", tile_lat * f), allow_host=False)
    return plan.temporal_slice


def decode_parallel(vae: TurboVAE, latents: torch.Tensor, *, devices: DeviceList = None, group=None,
                    tile_px: Optional[int] = None, temporal_slice: Optional[int] = None, progress: Progress = None,
                    output_device: Optional[torch.device] = None) -> torch.Tensor:
    """Exact decode with the frame split into row bands over `devices` (this process) or the ranks of `group`.

    `tile_px` (pixels; None = 512) is the single-device tile whose working memory the bands share: each band's
    tiles hold 1/N of its area, so a device needs about 1/N of what `decode_tiled(mode="exact", tile_px=tile_px)`
    needs (plus halos), and the result equals that pass. `tile_px=0`: the largest band tile (then temporal
    slice) whose predicted per-rank peak fits `vae.budget` on every rank's device (`plan_parallel`;
    docs/multi_gpu.md). `temporal_slice` bounds the frames per step, as there. `progress(done, total)` runs on
    rank 0 with `devices=`, on every rank with a process group; raising from it (a cancel) stops every rank. With
    `devices=None` and no process group: every visible CUDA device, else the VAE's device.
    Returns pixels in [-1, 1], model dtype, on `output_device` (default: the VAE's device).
    """
    squeeze = isinstance(latents, torch.Tensor) and latents.ndim == 4
    z = vae.check_latents(latents).to(device=vae.device, dtype=vae.dtype)
    out = _parallel(vae, z, decode=True, devices=devices, group=group, tile_px=tile_px,
                    temporal_slice=temporal_slice, progress=progress, output_device=output_device)
    return out.squeeze(2) if squeeze and out.shape[2] == 1 else out


def decode_parallel_checked(vae: TurboVAE, z: torch.Tensor, *, tiling: TilingArgs, devices: DeviceList = None,
                            progress: Progress = None, output_device: Optional[torch.device] = None) -> torch.Tensor:
    """`decode_parallel` of 5-D latents that `check_latents` has passed, with `tiling` (its tile and temporal slice)
    checked by the input rules: for a caller that checks its input and settings once (the multi-GPU nodes)."""
    return _parallel_checked(vae, z.to(device=vae.device, dtype=vae.dtype), decode=True, devices=devices, group=None,
                             tile_px=tiling.tile_px, temporal_slice=tiling.temporal_slice, progress=progress,
                             output_device=output_device)


def encode_parallel_checked(vae: TurboVAE, x: torch.Tensor, *, tiling: TilingArgs, devices: DeviceList = None,
                            progress: Progress = None, output_device: Optional[torch.device] = None) -> torch.Tensor:
    """`encode_parallel` (the posterior mean) of a 5-D clip that `check_pixels` has passed and `pad_frames` padded,
    with `tiling` checked: as `decode_parallel_checked`."""
    moments = _parallel_checked(vae, x.to(device=vae.device, dtype=vae.dtype), decode=False, devices=devices,
                                group=None, tile_px=tiling.tile_px, temporal_slice=tiling.temporal_slice,
                                progress=progress, output_device=output_device)
    return moments_to_latents(moments)


def encode_parallel(vae: TurboVAE, pixels: torch.Tensor, *, devices: DeviceList = None, group=None,
                    tile_px: Optional[int] = None, temporal_slice: Optional[int] = None, progress: Progress = None,
                    sample: bool = False, generator: Optional[torch.Generator] = None,
                    output_device: Optional[torch.device] = None) -> torch.Tensor:
    """Exact encode split like `decode_parallel`; returns raw latents (posterior mean, or a sample) as
    `encode_tiled(mode="exact")` does. Clips that are not 4n+1 frames are padded as `TurboVAE.encode` does."""
    squeeze = isinstance(pixels, torch.Tensor) and pixels.ndim == 4
    x = vae.pad_frames(vae.check_pixels(pixels)).to(device=vae.device, dtype=vae.dtype)
    moments = _parallel(vae, x, decode=False, devices=devices, group=group, tile_px=tile_px,
                        temporal_slice=temporal_slice, progress=progress, output_device=output_device)
    out = moments_to_latents(moments, sample=sample, generator=generator)
    return out.squeeze(2) if squeeze and out.shape[2] == 1 else out
