"""One rank's peak in a sharded pass, known before it runs: `sharded_pass` itself run for that rank on meta
tensors, its storages counted (vae/memory/peak.py `LiveBytes`), with a stand-in for the collectives.

Why the sharded pass itself, not the single-device plan of the same tile: a band holds what a single-device pass
does not — whole-band activations, halo rows received from its neighbours, the latent-resolution frame
all-gathered for the global part or for attention, its fp32 output, and on the rank that returns the result the
whole output canvas with the copies written into it. A single-device prediction counts none of these (issue 49:
`tile_px=0` ran over its budget); running the code that will run counts them.

`MetaCollective` has the interface of vae/parallel/collectives.py's `Collective` and allocates on its rank what the
real transport allocates there — received halo rows, all-reduced sums, the gathered frame, a process group's
padded gather buffers (the same code, `halo_transfers` / `gather_padded`), copies of bands that live on another
device — without communicating. What another rank holds is made outside the count (`LiveBytes.elsewhere`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..memory.op_rules import op_memory_for
from ..memory.peak import LiveBytes
from ..memory.placement import OnDevice, OnMetaHost
from ..planning.meta_pass import MetaPasses, PassPaths, meta_pass_for
from ..tiling.exact import sampled
from .collectives import collect_frame, gather_padded, halo_transfers
from .sharded import sharded_pass

THREADS = "devices"  # one process drives every device (collectives.DeviceGroup)
GROUP = "process group"  # one process per rank (collectives.DistCollective)


@dataclass(frozen=True)
class RankSetup:
    """What one rank's memory depends on besides the pass, the tile and the slice: its band among `size`, the
    transport, and which of the tensors it touches are on its own device.

    `input_here`: the input lies on this rank's device (else the rank copies from it: it is charged the whole
    input, the most its copies hold at once). `output_here`: the output canvas this rank allocates is on its device.
    `peers_here` (THREADS): per rank, whether that rank's device is this one's (its bands are read without a copy).
    `resident_bytes`: memory on this device that another rank allocates (the output canvas, when the caller puts
    it on this rank's device but rank 0 makes it)."""

    rank: int
    size: int
    transport: str
    input_here: bool = True
    output_here: bool = True
    peers_here: tuple[bool, ...] = ()
    resident_bytes: int = 0

    @property
    def returns_result(self) -> bool:
        return self.transport == GROUP or self.rank == 0


def _like_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """A new tensor shaped like `x` with `rows` rows, in `x`'s memory layout (what another rank's band is)."""
    shape = (*x.shape[:-2], rows, x.shape[-1])
    fmt = torch.contiguous_format
    if x.ndim == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d):
        fmt = torch.channels_last_3d
    elif x.ndim == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        fmt = torch.channels_last
    return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=fmt)


class MetaCollective:
    """A `Collective` for one rank of a meta run: what the real transport allocates on this rank, no
    communication (received tensors hold no values: a meta run computes none)."""

    device = torch.device("meta")

    def __init__(self, setup: RankSetup, tracker: LiveBytes):
        self.rank, self.size = setup.rank, setup.size
        self.returns_result = setup.returns_result
        self._setup, self._tracker = setup, tracker

    def _peer(self, rank: int) -> bool:
        return not self._setup.peers_here or self._setup.peers_here[rank]

    def _elsewhere(self, like: torch.Tensor, rows: int) -> torch.Tensor:
        """Another rank's band of `rows` rows, held on its device: not this rank's memory."""
        with _disable_current_modes():
            t = _like_rows(like, rows)
        self._tracker.elsewhere(t)
        return t

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self._setup.transport == GROUP:
            return t.to(self.device, copy=True).contiguous()
        acc = t.to(self.device, copy=True)  # DeviceCollective: rank 0's sums copied here, then the others added
        for r in range(1, self.size):
            if not self._peer(r):
                copied = t.to(self.device, copy=True)  # another device's sums, copied in to be added
                del copied
        return acc

    def halo(self, x: torch.Tensor, top: int, bottom: int) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        if self._setup.transport == GROUP:
            transfers, above, below = halo_transfers(x, top, bottom, self.rank, self.size)
            del transfers  # the rows sent are held until the exchange is done, then freed
            return above, below
        # DeviceCollective: the neighbour's edge rows copied here (`.to(device, copy=True)` of its band's rows)
        above = self._elsewhere(x, top).to(self.device, copy=True) if self.rank > 0 and top else None
        below = (self._elsewhere(x, bottom).to(self.device, copy=True)
                 if self.rank < self.size - 1 and bottom else None)
        return above, below

    def all_gather_rows(self, x: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
        if self._setup.transport == GROUP:
            return torch.cat(gather_padded(x, counts, self.size, lambda parts, t: None), dim=-2)
        parts = [x if r == self.rank else self._copied(x, counts[r], r) for r in range(self.size)]
        return torch.cat(parts, -2)

    def _copied(self, like: torch.Tensor, rows: int, rank: int) -> torch.Tensor:
        """Rank `rank`'s band as `.to(this device)` gives it here: itself on this device, else a copy."""
        band = self._elsewhere(like, rows)
        return band if self._peer(rank) else band.to(self.device, copy=True)

    def collect_rows(self, x: torch.Tensor, counts: Sequence[int], out: Optional[torch.Tensor]) -> None:
        if self._setup.transport == GROUP:
            for t in sampled(range(x.shape[2]), True):  # every frame allocates alike, one after another
                collect_frame(gather_padded(x[:, :, t], counts, self.size, lambda parts, f: None), out, t)
            return
        if out is None:
            return
        r0 = 0
        for r, n in enumerate(counts):  # rank 0 writes every band into the canvas; another device's is copied
            if r != self.rank and self._setup.output_here and not self._peer(r):
                out[..., r0:r0 + n, :] = self._copied(x, n, r)
            r0 += n

    def any_failed(self, failed: bool) -> bool:
        return failed


def predict_rank_peak(copies: MetaPasses, paths: PassPaths, shape: Sequence[int], *, decode: bool,
                      dtype: torch.dtype, tile_latent: int, temporal_slice: Optional[int],
                      setup: RankSetup) -> int:
    """The most this rank's pass holds at once on its device (bytes; weights and an input on its device not
    included, as for a single-device plan) running `sharded_pass` over input `shape` with bands tiled at
    `tile_latent` (each band's own tile: `share_tile=False`) and `temporal_slice`; remembered in `copies`."""
    key = ("sharded", tuple(int(d) for d in shape), decode, dtype, tile_latent, temporal_slice, setup, paths)
    return copies.memo(key, lambda: _predict(copies, paths, tuple(int(d) for d in shape), decode, dtype,
                                             tile_latent, temporal_slice, setup))


def _predict(copies: MetaPasses, paths: PassPaths, shape: tuple[int, ...], decode: bool, dtype: torch.dtype,
             tile_latent: int, temporal_slice: Optional[int], setup: RankSetup) -> int:
    clone = copies.copy(dtype, paths.fast)
    x = torch.empty(shape, device="meta", dtype=dtype)
    tracker = LiveBytes(exclude=[x, *clone.parameters(), *clone.buffers()], op_memory=op_memory_for(paths.device_type))
    comm = MetaCollective(setup, tracker)
    canvas = OnDevice(torch.device("meta")) if setup.output_here else OnMetaHost(tracker, paths.device_type)
    with torch.inference_mode(), meta_pass_for(paths.device_type, paths.fused_norms), tracker:
        src = x if setup.input_here else x.clone()  # another device's input: charged whole
        out = sharded_pass(clone, src, comm, decode=decode, tile_latent=tile_latent, temporal_slice=temporal_slice,
                           progress=None, output_device=torch.device("meta"), share_tile=False, sample=True,
                           canvas=canvas)
        del out, src
    return int(tracker.peak) + setup.resident_bytes
