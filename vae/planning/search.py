"""The planner: every way this package can run a pass, the fastest whose predicted peak fits the budget.

Given the pass (shape, direction, dtype, the paths it will run on its device) and a budget (device memory the
pass may use besides the weights and its input, and host memory where that is apart from the device's), it lists
the plans the library can run — untiled with temporal slices; exact tiles; fast tiles when asked for; the model's
frame stages; caches, output and (SeedVR2's layer-wise tiles) activations in host memory — each with its expected
time (the cost model, vae/planning/cost.py), and predicts their peaks by running their own executor on meta
tensors (vae/planning/predict.py). The fastest plan is taken when it fits (the common case). Otherwise, host memory
level by level (none; the output; the output and the caches; every activation: copies cost time and RAM, so only
where the device alone cannot hold a plan), the level's candidates are taken in the order of their estimated
time and the first that fits by its own prediction runs: the plan the estimate ranks first among those that fit
(where a kind stops fitting at some tile, its tiles are bisected first, so the plans above that tile are ruled out
by one prediction over instead of each predicted). Nothing that does not fit is run: a budget below every plan is
`BudgetTooSmall`, naming the smallest budget that works and the plan that needs it.

Why the taken plan's own prediction, never a neighbour's: a pass's peak is not monotone in its slice or tile (a
slice that splits the clip into one more step can need less than a smaller one). A candidate is skipped only where
a plan of its kind with no larger tile and slice was over the budget (the bisection's probes included), so a
non-monotone step may cost speed (a smaller tile than possible), never memory; and before refusing, each kind's
next smallest plans are predicted as well (`NEAR_THRIFTIEST`), so a budget is not refused where a plan one rung
above a kind's smallest fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable, Optional

import torch

from ..base import VAEModel
from ..input_rules import DEFAULT_TILE_PX, MIN_TILE_LATENT, default_overlap
from ..tiling.exact import partition
from ..memory.device import FASTEST_SLICE
from ..memory.budget import BudgetTooSmall, needs_text
from ..memory.meta_ops import MetaAnswers
from .. import norms
from .meta_pass import MetaFusedNorms, MetaPasses, PassPaths
from ..tiling.grid import TileGrid
from .cost import estimate_s
from .plan import MB, PassPlan
from .predict import PassWork, pass_work, predict_plan, step_work

SLICE_LADDER = (16, 8, 4, 2, 1)  # temporal slices tried below the whole clip, in latent frames


@dataclass(frozen=True)
class PlanRequest:
    """What the caller fixed. `mode` "auto" (any exact plan; untiled when it fits), "exact" (exact tiles), "fast"
    (blended tiles). `tile_px`: None — chosen in auto mode, DEFAULT_TILE_PX in exact/fast mode; 0 — chosen in any
    mode; else that tile. `temporal_slice` None: chosen. `output_on_host` None: chosen; True/False: where the
    caller wants the output. `host_is_separate`: whether host memory is apart from the budgeted memory (default:
    everywhere but on the CPU, whose host memory is the same memory; the CPU proofs of GPU plans set it)."""

    mode: str = "auto"
    tile_px: Optional[int] = None
    overlap_px: Optional[int] = None
    temporal_slice: Optional[int] = None
    max_temporal_slice: Optional[int] = None  # at most this many latents per step (e.g. for progress between steps)
    output_on_host: Optional[bool] = None
    allow_host: bool = True
    allow_tiles: bool = True  # False: untiled plans only (benchmarks that measure the untiled pass)
    host_is_separate: Optional[bool] = None


def fastest_fitting_plan(model: VAEModel, shape: Iterable[int], *, decode: bool, budget_bytes: int, paths: PassPaths,
                         dtype: Optional[torch.dtype] = None, request: PlanRequest = PlanRequest(),
                         copies: Optional[MetaPasses] = None, host_budget_bytes: Optional[int] = None) -> PassPlan:
    """The fastest plan for a pass over validated input `shape` (latents for decode, 1 + 4n-frame pixels for
    encode; 5-D) whose predicted device peak fits `budget_bytes` and, where host memory is apart from the device's,
    whose host memory fits `host_budget_bytes` (None: not bounded); BudgetTooSmall when none does."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes <= 0:
        raise ValueError(f"budget_bytes={budget_bytes!r} must be a positive integer number of bytes")
    if host_budget_bytes is not None and (isinstance(host_budget_bytes, bool) or not isinstance(host_budget_bytes, int)
                                          or host_budget_bytes <= 0):
        raise ValueError(f"host_budget_bytes={host_budget_bytes!r} must be a positive integer number of bytes")
    shape = tuple(int(d) for d in shape)
    dtype = dtype or model.dtype
    copies = copies or MetaPasses(model)
    separate = request.host_is_separate if request.host_is_separate is not None else paths.device_type != "cpu"
    budget = Budget(budget_bytes, host_budget_bytes if separate else None, separate)
    cands = candidates(model, shape, decode=decode, dtype=dtype, device_type=paths.device_type, request=request,
                       host_is_separate=separate)
    tiling = model.exact_plan(decode=decode)
    layerwise = tiling is not None and tiling.holds_whole_frames  # read once per search
    if not cands:
        raise ValueError(f"no {request.mode} plan exists for a {model.kind} "
                         f"{'decode' if decode else 'encode'} of {shape}")
    work = whole_pass_work(model, shape, decode=decode, dtype=dtype, copies=copies)
    held = copies.memo(("caches", shape, decode, dtype), lambda: cache_bytes(model, shape, decode=decode, dtype=dtype))

    costs: dict[int, float] = {}  # per candidate (the search sorts and groups by it many times)

    def cost(c: PassPlan) -> float:
        found = costs.get(id(c))
        if found is None:
            found = costs[id(c)] = estimate_s(model, c, work, cache_bytes=held)
        return found

    def predicted(c: PassPlan) -> PassPlan:
        return _predicted(model, c, copies, paths, budget_bytes, work, held)

    fastest = predicted(min(cands, key=cost))
    if budget.fits(fastest):
        return fastest  # the common case: the fastest plan fits
    out_bytes = output_bytes(model, shape, decode=decode, dtype=dtype)
    tried = [fastest]
    for level in _host_levels(cands):  # host memory only where the device alone cannot hold a plan
        found = _cheapest_fitting(level, cost, predicted, budget, held, out_bytes, tried, layerwise)
        if found is not None:
            return found
    # nothing fits by the search, which skips a kind whose thriftiest plan is over: a peak is not monotone in a tile
    # or slice, so before refusing each kind's next smallest plans are predicted too (the refusal path alone pays)
    found = _near_thriftiest_fitting(cands, cost, predicted, budget, held, out_bytes, tried, layerwise)
    if found is not None:
        return found
    raise budget.too_small(tried)


# Before refusing, the plans of each kind tried beside its thriftiest: the next smallest by step volume (a tile or
# slice one rung up the ladder can need less than the smallest one, e.g. where a smaller crop takes another conv
# kernel with a larger workspace).
NEAR_THRIFTIEST = 3


def _near_thriftiest_fitting(cands: list[PassPlan], cost, predicted, budget: "Budget", held: int, out_bytes: int,
                             tried: list[PassPlan], layerwise: bool) -> Optional[PassPlan]:
    """The cheapest fitting plan among each kind's `NEAR_THRIFTIEST` smallest plans (its thriftiest first, which
    also gives `tried` every kind's floor for the refusal's message), host level by host level; None if none fits."""
    for level in _host_levels(cands):
        fitting = []
        for group in _groups(level, cost):
            smallest = sorted(group, key=lambda c: (step_volume(c), _size(c.tile_latent), _size(c.temporal_slice)))
            least = _thriftiest(group)
            for cand in [least] + [c for c in smallest if c is not least][:NEAR_THRIFTIEST - 1]:
                if cand is not least and _held_on_device(cand, held, out_bytes, layerwise) > budget.device_bytes:
                    continue
                plan = predicted(cand)
                tried.append(plan)
                if budget.fits(plan):
                    fitting.append(plan)
        if fitting:
            return min(fitting, key=lambda p: p.cost_s)
    return None


@dataclass(frozen=True)
class Budget:
    """What a plan must fit: `device_bytes` (on CUDA within PREDICTED_SHARE of it) and, where host memory is apart
    from the device's (`separate`), `host_bytes` (None: not bounded). Where it is not (the CPU), host-held bytes
    count against the device budget."""

    device_bytes: int
    host_bytes: Optional[int]
    separate: bool

    def device_need(self, plan: PassPlan) -> int:
        p = plan.predicted
        return p.pass_bytes + (0 if self.separate else p.host_bytes)

    def host_fits(self, plan: PassPlan) -> bool:
        return self.host_bytes is None or plan.predicted.host_bytes <= self.host_bytes

    def device_fits(self, plan: PassPlan) -> bool:
        return self.device_need(plan) <= self.device_bytes * _share(plan)

    def fits(self, plan: PassPlan) -> bool:
        return self.device_fits(plan) and self.host_fits(plan)

    def too_small(self, tried: list[PassPlan]) -> BudgetTooSmall:
        """The refusal: the plan needing the least device memory among those within the host budget (else the one
        needing the least host memory), the budget it needs, and what to do."""
        within = [p for p in tried if self.host_fits(p)]
        floor = min(within, key=self.device_need) if within else min(tried, key=lambda p: p.predicted.host_bytes)
        what = "decode" if floor.decode else "encode"
        budget = f"the budget of {self.device_bytes / MB:.0f} MB"
        if self.host_bytes is not None:
            budget += f" on the device and {self.host_bytes / MB:.0f} MB of host memory"
        # the budget that works: the plan's need over the share of a budget a prediction may use
        need = math.ceil(self.device_need(floor) / _share(floor))
        host = floor.predicted.host_bytes if self.separate else 0
        return BudgetTooSmall(
            f"{what} {'x'.join(map(str, floor.shape))} {str(floor.dtype).removeprefix('torch.')}: no plan fits "
            f"{budget}; {needs_text(need, host, floor.layout())}. Free memory on the device (unload other models) or "
            "in RAM, give the pass a budget of at least that (vae.budget = turbovae.MemoryBudget(bytes, host_bytes), "
            "budget_bytes=, plan --budget-mb / --host-budget-mb), or pass fewer frames or a smaller frame per call",
            need, host, floor.layout())


def _cheapest_fitting(level: list[PassPlan], cost, predicted, budget: Budget, held: int, out_bytes: int,
                      tried: list[PassPlan], layerwise: bool) -> Optional[PassPlan]:
    """The cheapest plan of `level` (by the cost estimate) whose prediction fits `budget`, or None: candidates are
    taken in order of their estimate and the first whose own prediction fits is taken, so the plan chosen is the
    one the estimate ranks first among those that fit. A candidate is ruled out unpredicted where what it must hold
    on the device alone is over the budget, where a plan of its kind with no larger tile and slice was over, where
    the same plan with its output on the device, less that output, was over (`_with_output_on_device`), or where a
    plan of its kind with no larger slice was over the host budget (what a kind keeps in host memory is whole-frame:
    caches, the output, a step's activations; it grows with the slice, not the tile).

    Once a kind has a plan over the device budget, before another of its candidates is predicted the tiles of its
    kind below it are probed by bisection at the kind's smallest slice (`_Frontier.bisect_below`). A probe that is over
    rules out every plan of its kind with no smaller tile and slice, so the search finds the largest tile of a kind
    that fits in a few predictions instead of predicting, from the cheapest down, every tile and slice above it
    (Wan 2.2's 4K clip decode in 6 GB: 68 predictions before, 11 after). A kind's floor (its smallest tile and
    slice) is predicted when the search first reaches the kind. No candidate is ruled out on an estimate
    of its peak: an estimate from a kind's other predictions (a curve through them, used until issue 49's review)
    skipped plans that fit, so the plan taken was slower than the one the predictions of every candidate choose
    (tests/test_plans_table.py)."""
    frontier = _Frontier(level, budget, predicted, tried,
                         lambda c: _held_on_device(c, held, out_bytes, layerwise) > budget.device_bytes or
                         _with_output_on_device(c, tried, budget, out_bytes) > budget.device_bytes * _share(c),
                         layerwise=layerwise)
    # a kind whose smallest tile and slice is over is over at every size: that plan (its floor) is settled before
    # any other of its kind, when the search first reaches the kind (a kind dearer than the plan taken is never)
    floors = {_kind(group[0]): _thriftiest(group) for group in _groups(level, cost)}
    for cand in sorted(level, key=cost):
        floor = floors.pop(_kind(cand), None)
        if floor is not None:
            frontier.settle(floor, thriftiest=True)
        if _kind(cand) in frontier.device_over:  # the kind stops fitting somewhere: find where before predicting more
            frontier.bisect_below(cand)
        if frontier.settle(cand):
            return frontier.plans[id(cand)]
    return None


class _Frontier:
    """What the search knows of one host level: each settled candidate's verdict (fits or over: predicted, or over
    by a lower bound of its peak), and the rules that rule a candidate out from its kind's verdicts."""

    def __init__(self, level: list[PassPlan], budget: Budget, predicted, tried: list[PassPlan], over_by_bound,
                 layerwise: bool = False):
        self.budget, self.predicted, self.tried, self.over_by_bound = budget, predicted, tried, over_by_bound
        self.layerwise = layerwise
        self.kinds: dict[tuple, list[PassPlan]] = {}
        for c in level:
            self.kinds.setdefault(_kind(c), []).append(c)
        self.fits: dict[int, bool] = {}  # id(candidate) -> verdict
        self.plans: dict[int, PassPlan] = {}  # id(candidate) -> its prediction
        self.over: dict[tuple, list[PassPlan]] = {}  # per kind, the candidates over the budget
        self.host_over: dict[tuple, list[Optional[int]]] = {}  # per kind, the temporal slices over the host budget
        # the kinds with a plan over the device budget (predicted, or by a bound): where a kind's tiles stop fitting
        # is worth a bisection; a plan over the host budget alone says nothing of its tile (host memory follows the
        # slice), so it starts none
        self.device_over: set[tuple] = set()

    def ruled_out(self, cand: PassPlan) -> bool:
        """Over without its own prediction: by a plan of its kind with no larger tile and slice that was over, or a
        plan of its kind with no larger slice over the host budget (or already settled as over)."""
        if self.fits.get(id(cand)) is False:
            return True
        kind = _kind(cand)
        if any(_size(o.tile_latent) <= _size(cand.tile_latent) and _size(o.temporal_slice) <= _size(cand.temporal_slice)
               for o in self.over.get(kind, ())):
            return True
        return any(_size(s) <= _size(cand.temporal_slice) for s in self.host_over.get(kind, ()))

    def settle(self, cand: PassPlan, thriftiest: bool = False) -> bool:
        """Whether `cand` fits, by its own prediction (made here unless made before) unless a rule or a lower
        bound of its peak says it is over; its verdict is kept for the rules. A plan over by a bound rules out its
        kind's larger plans only where it is the kind's `thriftiest` (its smallest tile and slice): the bounds
        differ between slices (a whole-clip pass keeps no causal caches), so elsewhere it rules out itself alone."""
        if id(cand) in self.fits:
            return self.fits[id(cand)]
        if self.ruled_out(cand):
            self._mark_over(cand)
            return False
        if self.over_by_bound(cand):
            self.device_over.add(_kind(cand))
            if thriftiest:
                self._mark_over(cand)
            else:
                self.fits[id(cand)] = False
            return False
        plan = self.plans[id(cand)] = self.predicted(cand)
        self.tried.append(plan)
        if not self.budget.host_fits(plan):
            self.host_over.setdefault(_kind(cand), []).append(cand.temporal_slice)
        fits = self.fits[id(cand)] = self.budget.fits(plan)
        if not fits:
            self.over.setdefault(_kind(cand), []).append(cand)
        if not self.budget.device_fits(plan):
            self.device_over.add(_kind(cand))
        return fits

    def _mark_over(self, cand: PassPlan) -> None:
        if self.fits.get(id(cand)) is None:
            self.fits[id(cand)] = False
            self.over.setdefault(_kind(cand), []).append(cand)

    def bisect_below(self, cand: PassPlan) -> None:
        """Settle the tiles of `cand`'s kind at the kind's smallest slice, between its largest fitting tile there and
        `cand`'s tile, by bisection, until `cand` is ruled out (a tile over at the smallest slice rules out every
        plan of its kind with no smaller tile) or every tile of that line up to `cand`'s is settled. Tiles only:
        slices are predicted one by one in order of their estimate, as a slice can need more than a larger one
        (one more step of another shape) and a bisection over slices would stop below the larger one that fits.
        (Bisecting the tiles at the candidate's own slice too was tried: more predictions over the plans table's
        rows, 593 against 552, as most probes there fit.) A layer-wise kind (`layerwise`: SeedVR2, whose peak
        follows its slice's whole-frame tensors more than its tile) first settles its smallest tile at `cand`'s slice:
        where that slice is over at every tile, one prediction rules the slice out (552 -> 504 predictions).

        Where the kind has a prediction over the device budget, the probe is not the middle open tile but the first
        one that a line through the kind's predictions (`_estimated_need`) puts over the budget, and where the line
        puts every open tile within it, `cand`'s own prediction (or, at a larger slice, its tile's at the smallest)
        settles it; a probe that fits where the line said over is followed by one at the middle. A layer-wise kind's
        line reads only its predictions at the smallest slice (its need follows the slice, so a plan over at a
        larger slice says little of a tile), and where none there is over, `cand`'s own prediction settles it.
        The verdicts are the predictions' as before, so the plan taken is the same (504 -> 431 predictions over the
        plans table's rows with these probes and the floors taken lazily, counted on the CPU VM on 2026-11-29)."""
        group = self.kinds[_kind(cand)]
        layerwise = self.layerwise and cand.mode == "exact"
        if layerwise:
            at_slice = [c for c in group if c.temporal_slice == cand.temporal_slice]
            smallest = min(at_slice, key=lambda c: _size(c.tile_latent))
            if smallest is not cand:
                self.settle(smallest)
        smallest_slice = min(_size(c.temporal_slice) for c in group)
        line = sorted((c for c in group if _size(c.temporal_slice) == smallest_slice
                       and _size(c.tile_latent) <= _size(cand.tile_latent)), key=lambda c: _size(c.tile_latent))
        missed = False  # the last interpolated probe fitted where its estimate said over: bisect once instead
        while not self.ruled_out(cand):
            fitting = [i for i, c in enumerate(line) if self.fits.get(id(c))]
            if not fitting:
                return  # no tile of the line fits: nothing to bisect from
            open_ = [c for c in line[fitting[-1] + 1:] if id(c) not in self.fits and c is not cand]
            if not open_:
                return  # every tile between a fitting one and `cand`'s is settled
            estimate = None if missed else self._estimated_need(line[fitting[-1]], group)
            if estimate is None and layerwise and not missed:
                return  # nothing over at the smallest slice: `cand`'s own prediction settles it
            if estimate is None:
                probe = open_[(len(open_) - 1) // 2]
            else:
                probe = next((c for c in open_ if estimate(c) > self.budget.device_bytes * _share(c)), None)
                if probe is None and _size(cand.temporal_slice) == smallest_slice:
                    return  # every tile up to `cand`'s is estimated to fit: `cand`'s own prediction settles it
                if probe is None:  # the line's largest open tile: where it is over, `cand` is, at every slice
                    probe = open_[-1]
            fits = self.settle(probe)
            missed = estimate is not None and fits

    def _estimated_need(self, fitting: PassPlan, group: list[PassPlan]):
        """A guess of a plan's device need, linear in its step volume (`step_volume`) between `fitting`'s prediction
        and the smallest-volume prediction of its kind that was over the device budget (at any slice; a layer-wise
        kind's at `fitting`'s); None where the kind has no such prediction. It only picks where a bisection probes
        next (near where the kind stops fitting, rather than at the middle of the open tiles): every verdict still
        comes from a prediction."""
        low = self.plans[id(fitting)]
        v_low = step_volume(fitting)
        over = [c for c in group if id(c) in self.plans and not self.budget.device_fits(self.plans[id(c)])
                and step_volume(c) > v_low and (not self.layerwise or c.temporal_slice == fitting.temporal_slice)]
        if not over:
            return None
        high = self.plans[id(min(over, key=step_volume))]
        n_low, n_high, v_high = self.budget.device_need(low), self.budget.device_need(high), step_volume(high)
        return lambda c: n_low + (step_volume(c) - v_low) * (n_high - n_low) / (v_high - v_low)


def _with_output_on_device(cand: PassPlan, tried: list[PassPlan], budget: Budget, out_bytes: int) -> int:
    """A lower bound of what a plan with its output in host memory needs on the device, from the prediction of the
    same plan with its output on the device (made at an earlier host level): that need less the output canvas, the
    one tensor the two plans place apart (0: no such prediction, or the output is on the device anyway)."""
    if not cand.output_on_host:
        return 0
    twin = replace(cand, output_on_host=False)
    for plan in tried:
        if replace(plan, predicted=None, budget_bytes=None, cost_s=None) == twin:
            return budget.device_need(plan) - out_bytes
    return 0


def step_volume(plan: PassPlan) -> float:
    """What one step of a plan works on, in latent pixels × latent frames: its tile (or the frame) times the frames
    of a step (a slice, the whole clip, or one frame with frame stages) — what its peak grows with."""
    h, w = plan.latent_hw
    area = min(plan.tile_latent, h) * min(plan.tile_latent, w) if plan.tile_latent else h * w
    latents = plan.shape[2] if plan.decode else (plan.shape[2] - 1) // 4 + 1
    frames = 1 if plan.frame_stages else (latents if plan.temporal_slice is None else plan.temporal_slice + 1)
    return float(max(1, area) * frames)


def _share(plan: PassPlan) -> float:
    return PREDICTED_SHARE.get(plan.device_type, 1.0)


def _kind(plan: PassPlan) -> tuple:
    return plan.mode, plan.frame_stages, plan.frames_on_host, plan.cache_on_host, plan.output_on_host


def _thriftiest(group: list[PassPlan]) -> PassPlan:
    """A kind's plan of the smallest tile and slice."""
    return min(group, key=lambda c: (_size(c.tile_latent), _size(c.temporal_slice)))


def _held_on_device(plan: PassPlan, caches: int, output: int, layerwise: bool) -> int:
    """Bytes a plan holds on the device whatever its tile and slice (a lower bound of its peak): the output canvas
    unless in host memory, and the whole-frame causal caches of an untiled or layer-wise pass (`layerwise`: the
    model's exact plan `holds_whole_frames`) unless in host memory (exact staged tiles hold their tile's caches
    only)."""
    held = 0 if plan.output_on_host else output
    whole_frame_caches = plan.mode == "untiled" or plan.mode == "exact" and layerwise
    if whole_frame_caches and not plan.cache_on_host and plan.temporal_slice is not None or \
            whole_frame_caches and plan.frame_stages and not plan.cache_on_host:
        held += caches
    return held


def _host_levels(cands: list[PassPlan]) -> list[list[PassPlan]]:
    """The candidates by how much they keep in host memory: nothing, the output, the output and the caches, and
    (layer-wise exact plans) every activation between layers."""
    levels: dict[tuple, list[PassPlan]] = {}
    for c in cands:
        levels.setdefault((c.frames_on_host, c.cache_on_host, c.output_on_host), []).append(c)
    return [levels[k] for k in sorted(levels)]


def _groups(level: list[PassPlan], cost) -> list[list[PassPlan]]:
    """A level's candidates by kind (`_kind`: untiled / exact / fast tiles, with or without frame stages, what they
    keep in host memory), the group with the cheapest member first."""
    groups: dict[tuple, list[PassPlan]] = {}
    for c in level:
        groups.setdefault(_kind(c), []).append(c)
    return sorted(groups.values(), key=lambda g: min(cost(c) for c in g))


def _size(v: Optional[int]) -> float:
    return math.inf if v is None else v


def _predicted(model: VAEModel, cand: PassPlan, copies: MetaPasses, paths: PassPaths, budget_bytes: int,
               work: PassWork, held: int) -> PassPlan:
    pred = predict_plan(copies, cand, paths)
    return replace(cand, predicted=pred, budget_bytes=budget_bytes, cost_s=estimate_s(model, cand, work,
                                                                                      cache_bytes=held))


# The share of the budget a plan's prediction may use, per device type: on CUDA the rest is headroom for what the
# allocator counts that the meta count misses (cuDNN workspaces of large contiguous crops); the first GPU proof
# measured at most 5.3 % above the prediction (docs/results/2026-11-27-h200-budget-gpu-call2.json, SeedVR2
# 1080p x 81 decode with caches in host memory), every other case within 1 %. On the CPU the budget is the process's
# memory, and a pass also takes memory outside PyTorch's allocator that no prediction counts (oneDNN's scratch pads,
# the Python objects of the pass): 20-35 MB on passes budgeted at 160-380 MB in the review of issue 49.
PREDICTED_SHARE = {"cuda": 0.94, "cpu": 0.9}


def candidates(model: VAEModel, shape: tuple[int, ...], *, decode: bool, dtype: torch.dtype, device_type: str,
               request: PlanRequest, host_is_separate: bool) -> list[PassPlan]:
    """Every plan the library can run for this pass under `request` (unpredicted)."""
    fmt = model.latent_format
    f = fmt.spatial_factor
    h_lat, w_lat = (shape[-2], shape[-1]) if decode else (shape[-2] // f, shape[-1] // f)
    latents = shape[2] if decode else fmt.latent_frames(shape[2])
    exact = model.exact_plan(decode=decode)
    staged = exact is not None and not exact.holds_whole_frames
    has_stages = model.frame_stages(decode=decode) is not None
    overlap = _overlap(request)
    base = dict(decode=decode, shape=shape, dtype=dtype, device_type=device_type, requested=request.mode,
                latent_hw=(h_lat, w_lat), spatial_factor=f, overlap_px=overlap)
    slices = temporal_slices(latents, decode, device_type, request.temporal_slice, request.max_temporal_slice)
    outputs = [request.output_on_host] if request.output_on_host is not None else \
        ([False, True] if request.allow_host and host_is_separate else [False])
    cache_opts = [False, True] if request.allow_host and host_is_separate else [False]
    out: list[PassPlan] = []
    tiles_asked = _tiles(request, h_lat, w_lat, f)
    if request.mode == "auto":  # one tile covering the frame is the untiled pass
        tiles_asked = list(dict.fromkeys(None if t is not None and t >= max(h_lat, w_lat) else t
                                         for t in tiles_asked))
    for tile in tiles_asked:
        if tile is None:
            mode = "untiled"
        elif request.mode == "fast" or exact is None:
            mode = "fast"
        else:
            mode = "exact"
        if tile is None:
            tiles = 1
        elif mode == "exact":
            tiles = len(partition(h_lat, tile)) * len(partition(w_lat, tile))  # cores, no overlap
        else:
            tiles = len(TileGrid.build(h_lat, w_lat, tile, overlap // f))
        if mode == "exact" and request.mode == "auto" and tiles == 1:
            continue  # one exact tile is the untiled pass, listed already
        stage_opts = [False, True] if has_stages and mode != "fast" and request.temporal_slice is None else [False]
        # a layer-wise exact plan may keep its activations in host memory too (streamed: the device holds bands)
        streamed = [False, True] if mode == "exact" and not staged and cache_opts != [False] else [False]
        for stages in stage_opts:
            # staged exact tiles hold per-tile caches (small): host memory for them is not worth a copy
            caches = [False] if mode == "exact" and staged or mode == "fast" else cache_opts
            for ts in ([None] if stages else slices):
                for on_host in outputs:
                    for frames_host in streamed:
                        for cache_host in ([True] if frames_host else caches):
                            out.append(PassPlan(mode=mode, temporal_slice=ts, tile_latent=tile, tiles=tiles,
                                                frame_stages=stages, cache_on_host=cache_host, output_on_host=on_host,
                                                frames_on_host=frames_host, **base))
    return out


def _overlap(request: PlanRequest) -> int:
    return request.overlap_px if request.overlap_px is not None else default_overlap(request.tile_px)


def temporal_slices(latents: int, decode: bool, device_type: str, fixed: Optional[int],
                    cap: Optional[int] = None) -> list[Optional[int]]:
    """Temporal slices to try, largest first: the caller's; else the whole clip and the ladder below it, at most
    `cap` (a decode on a device type with a measured fastest slice never above it: slicing is exact, so that is
    speed alone)."""
    if fixed is not None:
        return [None if fixed >= latents - 1 else fixed]
    if latents <= 1:
        return [None]
    top = FASTEST_SLICE.get(device_type) if decode else None
    if cap is not None:
        top = cap if top is None else min(top, cap)
    ks = sorted({k for k in (*SLICE_LADDER, top or 1) if k < latents - 1 and (top is None or k <= top)},
                reverse=True)
    whole = [None] if top is None or latents - 1 <= top else []
    return [*whole, *ks]


def _tiles(request: PlanRequest, h_lat: int, w_lat: int, f: int) -> list[Optional[int]]:
    """Tile sides (latent px) to try; None is the whole frame."""
    if request.tile_px:
        return [max(MIN_TILE_LATENT, request.tile_px // f)]
    if request.tile_px is None and request.mode != "auto":
        return [max(MIN_TILE_LATENT, DEFAULT_TILE_PX // f)]
    # the whole frame first: untiled in auto mode, else one tile of its size (what exact/fast tiles of 0 px allow)
    if not request.allow_tiles:
        return [None]
    ladder: list[Optional[int]] = [None] if request.mode == "auto" else [max(MIN_TILE_LATENT, h_lat, w_lat)]
    side = max(h_lat, w_lat)
    while side > MIN_TILE_LATENT:
        side = max(MIN_TILE_LATENT, (side * 3) // 4)
        if side < max(h_lat, w_lat):
            ladder.append(side)
    return ladder or [MIN_TILE_LATENT]


def whole_pass_work(model: VAEModel, shape: tuple[int, ...], *, decode: bool, dtype: torch.dtype,
                    copies: MetaPasses) -> PassWork:
    """The untiled pass's work (`predict.pass_work`) over a clip of any length: a first step of two latents and a
    second of one are counted once per frame size and direction (one meta pass, kept in `copies`), and every latent
    after the first two costs what the second step did."""
    fmt = model.latent_format
    latents = shape[2] if decode else fmt.latent_frames(shape[2])
    if latents <= 1:
        return copies.memo(("work1", shape, decode, dtype),
                           lambda: pass_work(model, shape, decode=decode, dtype=dtype, copies=copies))
    three = (*shape[:2], 3 if decode else fmt.pixel_frames(3), *shape[3:])
    first, both = copies.memo(("work3", three, decode, dtype),
                              lambda: step_work(model, three, decode=decode, dtype=dtype, copies=copies))
    return first + (both - first) * (latents - 2)


def output_bytes(model: VAEModel, shape: tuple[int, ...], *, decode: bool, dtype: torch.dtype) -> int:
    """Bytes of the pass's output (pixels of a decode, moments of an encode) in `dtype`."""
    fmt = model.latent_format
    b, _c, t, h, w = shape
    f = fmt.spatial_factor
    if decode:
        n = b * fmt.image_channels * fmt.pixel_frames(t) * h * f * w * f
    else:
        n = b * 2 * fmt.channels * fmt.latent_frames(t) * (h // f) * (w // f)
    return n * torch.empty((), dtype=dtype).element_size()


def cache_bytes(model: VAEModel, shape: tuple[int, ...], *, decode: bool, dtype: torch.dtype) -> int:
    """Bytes of the causal caches an untiled step over the whole frame holds (`VAEModel.cache_layout`): what a
    plan with caches in host memory keeps there."""
    fmt = model.latent_format
    h, w = shape[-2], shape[-1]
    first = 2 if decode else 1 + fmt.temporal_factor
    # the caches hold conv inputs, whatever computes the norms before them: the norms run as the fused kernels'
    # stand-in (one output each), not as their reference arithmetic on meta tensors (half this pass's time); ops
    # take the answers predictions take (`MetaAnswers`), not PyTorch's Python meta kernels
    with norms.meta_fused_norms(MetaFusedNorms()), torch.inference_mode(), MetaAnswers():
        layout = model.cache_layout(decode=decode, batch=shape[0], height=h, width=w, first_frames=first)
    esize = torch.empty((), dtype=dtype).element_size()
    return sum(math.prod(s) for _name, s in layout) * esize
