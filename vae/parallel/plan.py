"""`tile_px=0` for the sharded passes: the largest tile (then temporal slice) whose predicted peak fits every rank's
budget — predicted for the pass that will run (`predict.predict_rank_peak`: `sharded_pass` on meta tensors), not
for a single-device plan of the same tile.

Candidates: band tiles from the largest that changes anything (a band's height or the frame's width, or for a
layer-wise plan the frame's longer side) down the planner's ladder (× 3/4 to `MIN_TILE_LATENT`; tiles that cut the
bands alike are one candidate), each with the planner's temporal slices (`search.temporal_slices`), largest first.
The first that fits is taken. For each tile its smallest slice is predicted first: when that is over, the tile's
larger slices are not predicted (a larger slice needs at least as much); a skip may cost speed, never memory —
what runs is always a candidate whose own prediction fits.

Budgets: a rank may use `MemoryBudget.resolve(device)` of its device (on CUDA within the planner's
`PREDICTED_SHARE`), divided among the ranks of this process that share the device (`devices=["cpu", "cpu"]`: two
bands in one memory). With a process group every rank plans from its own budget and the ranks agree on one
candidate (`agree`): the least preferred of their choices, checked on every rank, else the search goes on after it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

import torch

from ..memory.budget import BudgetTooSmall
from ..planning.meta_pass import MetaPasses, PassPaths
from ..planning.plan import MB
from ..planning.search import PREDICTED_SHARE, temporal_slices
from ..input_rules import MIN_TILE_LATENT
from .bands import BandPlan
from .predict import RankSetup, predict_rank_peak

log = logging.getLogger("turbovae")

Candidate = tuple[int, Optional[int]]  # (band tile side in latent pixels, temporal slice; None = whole clip)


@dataclass(frozen=True)
class RankBudget:
    """A rank this process predicts: its setup, where it runs (`device`, `paths`), what it may use there
    (`budget_bytes`: its device's budget) and how many of this process's ranks share that device."""

    setup: RankSetup
    device: torch.device
    paths: PassPaths
    budget_bytes: int
    shared_by: int = 1

    @property
    def limit(self) -> int:
        """The most its predicted peak may be."""
        return int(self.budget_bytes * PREDICTED_SHARE.get(self.device.type, 1.0)) // self.shared_by


class Agreement(Protocol):
    """What the ranks of a process group use to settle on one candidate (collectives.DistCollective)."""

    def agree_min(self, values: Sequence[int]) -> list[int]: ...

    def any_failed(self, failed: bool) -> bool: ...


@dataclass(frozen=True)
class ShardedPlan:
    """The tile and slice a sharded pass runs with `tile_px=0`, and the peaks predicted for it (bytes), one per
    rank this process predicted (`ranks`)."""

    decode: bool
    shape: tuple[int, ...]
    tile_latent: int
    temporal_slice: Optional[int]
    spatial_factor: int
    ranks: tuple[RankBudget, ...]
    peaks: tuple[int, ...]

    def describe(self) -> str:
        what = "decode" if self.decode else "encode"
        n = self.ranks[0].setup.size
        slice_ = "whole clip" if self.temporal_slice is None else f"temporal slice {self.temporal_slice}"
        per_rank = ", ".join(f"rank {r.setup.rank} ({r.device}) {p / MB:.0f} of {r.limit / MB:.0f} MB"
                             for r, p in zip(self.ranks, self.peaks))
        return (f"parallel {what} {'x'.join(map(str, self.shape))} over {n} band{'s' * (n > 1)}: tiles "
                f"{self.tile_latent * self.spatial_factor} px, {slice_}; predicted peak per rank: {per_rank}")


def tile_ladder(bands: BandPlan, staged: bool) -> list[int]:
    """Band tile sides to try (latent pixels), largest first: from the largest that changes anything down by
    × 3/4 to MIN_TILE_LATENT; for a staged plan, one side per distinct cut of the bands."""
    top = max(max(bands.counts()), bands.w_lat) if staged else max(bands.h_lat, bands.w_lat)
    sides, side = [max(MIN_TILE_LATENT, top)], max(MIN_TILE_LATENT, top)
    while side > MIN_TILE_LATENT:
        side = max(MIN_TILE_LATENT, side * 3 // 4)
        sides.append(side)
    if not staged:
        return sides
    cuts: dict[tuple, int] = {}
    for s in sides:
        cuts.setdefault(tuple(tuple(bands.tiles(r, s)) for r in range(bands.size)), s)
    return list(cuts.values())


def candidates(bands: BandPlan, staged: bool, latents: int, decode: bool, device_type: str,
               temporal_slice: Optional[int]) -> list[Candidate]:
    """Every (tile, slice) in order of preference: larger tiles first, then larger slices. The same list on
    every rank of a group (it depends on the pass alone, and `device_type` is agreed)."""
    slices = temporal_slices(latents, decode, device_type, temporal_slice)
    return [(t, s) for t in tile_ladder(bands, staged) for s in slices]


def first_fit(cands: Sequence[Candidate], fits: Callable[[Candidate], bool], start: int = 0) -> int:
    """Index of the first candidate from `start` on that fits (len(cands) when none does). A tile whose smallest
    slice does not fit is skipped whole."""
    smallest: dict[int, Candidate] = {}
    for c in cands:
        smallest[c[0]] = c  # the list runs from larger slices to smaller: the last of a tile is its smallest
    for i in range(start, len(cands)):
        tile = cands[i][0]
        if not fits(smallest[tile]):
            continue
        if fits(cands[i]):
            return i
    return len(cands)


def plan_sharded(copies: MetaPasses, shape: Sequence[int], *, decode: bool, dtype: torch.dtype,
                 spatial_factor: int, bands: BandPlan, staged: bool, latents: int, ranks: Sequence[RankBudget],
                 temporal_slice: Optional[int] = None, slice_device_type: str = "cuda",
                 agree: Optional[Agreement] = None) -> ShardedPlan:
    """The plan of a sharded pass over input `shape` for the ranks this process runs (`ranks`: every rank with
    `devices=`, its own with a process group, whose ranks then `agree`); `temporal_slice` fixed when given.
    BudgetTooSmall when no candidate fits, naming what the smallest needs."""
    shape = tuple(int(d) for d in shape)
    cands = candidates(bands, staged, latents, decode, slice_device_type, temporal_slice)

    def peak(c: Candidate, r: RankBudget) -> int:
        return predict_rank_peak(copies, r.paths, shape, decode=decode, dtype=dtype, tile_latent=c[0],
                                 temporal_slice=c[1], setup=r.setup)

    def peaks(c: Candidate) -> list[int]:
        return [peak(c, r) for r in ranks]

    def fits(c: Candidate) -> bool:
        return all(peak(c, r) <= r.limit for r in ranks)  # the next rank is predicted only if this one fits

    i = first_fit(cands, fits)
    if agree is not None:
        while True:  # the least preferred of the ranks' choices, if it fits every rank; else on from after it
            i = -agree.agree_min([-i])[0]
            if i >= len(cands) or not agree.any_failed(not fits(cands[i])):
                break
            i = first_fit(cands, fits, i + 1)
    if i >= len(cands):
        raise _too_small(cands[-1], peaks(cands[-1]), ranks, shape, decode, dtype, spatial_factor)
    tile, ts = cands[i]
    plan = ShardedPlan(decode, shape, tile, ts, spatial_factor, tuple(ranks), tuple(peaks(cands[i])))
    log.info("TurboVAE: %s", plan.describe())
    return plan


def _too_small(thriftiest: Candidate, need: Sequence[int], ranks: Sequence[RankBudget], shape: tuple[int, ...],
               decode: bool, dtype: torch.dtype, f: int) -> BudgetTooSmall:
    worst = max(range(len(ranks)), key=lambda k: need[k] / max(1, ranks[k].limit))
    r = ranks[worst]
    need_bytes = math.ceil(need[worst] * r.shared_by / PREDICTED_SHARE.get(r.device.type, 1.0))
    device_need = math.ceil(need_bytes / MB)
    shared = f" (shared by {r.shared_by} bands)" if r.shared_by > 1 else ""
    tile, ts = thriftiest
    what = "decode" if decode else "encode"
    slice_ = "whole clip" if ts is None else f"temporal slice {ts}"
    floor = f"tiles {tile * f} px, {slice_}"
    return BudgetTooSmall(
        f"parallel {what} {'x'.join(map(str, shape))} {str(dtype).removeprefix('torch.')} over {r.setup.size} "
        f"bands: no tile fits the budget of {r.budget_bytes / MB:.0f} MB on {r.device}{shared}; the smallest needs "
        f"{device_need} MB there ({floor}: rank {r.setup.rank} predicted at {math.ceil(need[worst] / MB)} MB). Free "
        "memory on the device, give the pass a budget of at least that (vae.budget = turbovae.MemoryBudget(bytes)), "
        "split the frame over more devices, or pass fewer frames or a smaller frame per call", need_bytes, 0, floor)
