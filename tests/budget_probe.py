"""One budgeted pass in a fresh process, measured (tests/budget_ways.py runs it): the peak resident
memory the first call added to the process — planning included, since on the CPU the planner shares the budgeted
memory — and, calling it again (the plan from the VAE's cache), the allocator's peak
(`vae.memory.allocator.measure_peak`: the CPU profiler's allocation events; not on the first call, whose planning
the profiler's own records would distort), beside the budget it was given.

    python tests/budget_probe.py WAY FAMILY DIRECTION FRACTION

WAY: how the budget is given (`WAYS`); FAMILY: a registry key; DIRECTION: decode | encode; FRACTION: the budget as a
share of the untiled pass's predicted peak (at least `FLOOR_MARGIN` times the smallest budget that works).
Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(2)

# small non-square real-config clips (the review's): latents for a decode, their pixels for an encode
LATENTS = {"seedvr2": (1, 16, 2, 12, 20), "qwen_image": (1, 16, 2, 12, 20), "wan2.2": (1, 48, 2, 8, 12)}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _reset_peak() -> None:
    """The kernel's peak resident size back to the current size (Linux: `clear_refs` 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


# a budget at least this much above the smallest that works, so a plan runs (the refusal is tested elsewhere)
FLOOR_MARGIN = 1.1


def _floor(model, x: torch.Tensor, decode: bool) -> int:
    """The smallest budget a plan of this pass needs, as BudgetTooSmall names it (a throw-away VAE's plan)."""
    import re

    from turbovae.vae.api import TurboVAE
    from turbovae.vae.memory.budget import BudgetTooSmall

    try:
        TurboVAE(model).plan(tuple(x.shape), decode=decode, budget_bytes=1)
    except BudgetTooSmall as e:
        return int(re.search(r"the smallest needs (\d+) MB", str(e)).group(1)) * 2**20
    return 1


def main(way: str, key: str, direction: str, fraction: float) -> dict:
    from turbovae.bench.models import seeded_init
    from turbovae.vae.api import TurboVAE
    from turbovae.vae.memory.budget import BudgetTooSmall
    from turbovae.vae.planning.meta_pass import MetaPasses, PassPaths, predict_pass
    from turbovae.vae.registry import family

    decode = direction == "decode"
    fam = family(key)
    torch.manual_seed(0)
    model = seeded_init(fam.build_model(fam.config(real=True))).eval()
    fmt = model.latent_format
    b, c, t, h, w = LATENTS[key]
    g = torch.Generator().manual_seed(1)
    if decode:
        x = torch.randn(b, c, t, h, w, generator=g)
    else:
        f = fmt.spatial_factor
        x = torch.randn(b, fmt.image_channels, fmt.pixel_frames(t), h * f, w * f, generator=g).clamp_(-1, 1)
    # the budget, from a prediction made in a throw-away copy so this process's planner starts cold
    untiled = predict_pass(model, tuple(x.shape), decode=decode, paths=PassPaths.of(model, "cpu", torch.float32),
                           copies=MetaPasses(model)).pass_bytes
    budget = max(1, int(untiled * fraction), int(FLOOR_MARGIN * _floor(model, x, decode)))
    vae = TurboVAE(model)
    vae._meta_passes = None  # noqa: SLF001 - planned cold, as a first call in a process is
    call = _call(way, vae, x, decode, budget)
    import gc

    gc.collect()
    before = _rss()
    _reset_peak()
    refused = None

    def attempt():
        nonlocal refused
        try:
            return call()
        except BudgetTooSmall as e:  # nothing runs: the error names the smallest budget that works
            refused = str(e)
            return torch.zeros(1)

    from turbovae.vae.memory.allocator import measure_peak

    with torch.inference_mode():
        out = attempt()  # cold: the planner's first plan in the process, then the pass
    grown = _peak_rss() - before
    if refused is None:  # again under the allocator's count (the plan now from the VAE's cache)
        with torch.inference_mode():
            peak, out = measure_peak(attempt, "cpu")
    else:
        peak = None
    return {"way": way, "family": key, "direction": direction, "budget": budget, "untiled_predicted": untiled,
            "allocator_peak": peak.device_bytes if peak else None, "rss_peak_added": grown, "out_shape": list(out.shape),
            "finite": bool(torch.isfinite(out.float()).all()), "refused": refused}


def _call(way: str, vae, x: torch.Tensor, decode: bool, budget: int):
    """The pass, with the budget given the way `way` says."""
    from turbovae import decode_tiled, encode_tiled
    from turbovae.vae.memory.budget import MemoryBudget

    if way == "budget_bytes":
        return lambda: vae.decode(x, budget_bytes=budget) if decode else vae.encode(x, budget_bytes=budget)
    if way == "vae.budget":
        vae.budget = MemoryBudget(budget)
        return lambda: vae.decode(x) if decode else vae.encode(x)
    if way in ("tiled_tile0", "tiled_exact"):
        vae.budget = MemoryBudget(budget)
        mode, tile = ("auto", 0) if way == "tiled_tile0" else ("exact", 0)
        if decode:
            return lambda: decode_tiled(vae, x, tile_px=tile, mode=mode)
        return lambda: encode_tiled(vae, x, tile_px=tile, mode=mode)
    if way == "core_vae_node":  # core's VAE Decode / Encode through our ComfyUI VAE, under ComfyUI's budget
        import node_helpers

        node_helpers.use_comfy_stubs()
        from turbovae.nodes import pass_budget
        from turbovae.nodes.comfy_vae import ComfyTurboVAE

        mm = pass_budget.mm
        # on the CPU core's free device memory is its free RAM: what is free beside the other models is the
        # budget and core's reserve
        mm.free_memory_bytes = budget + pass_budget.core_reserve_bytes()
        mm.cpu_free_memory_bytes = None
        mm.total_memory_bytes = mm.free_memory_bytes  # no other model to unload: the budget is all there is
        cpu = torch.device("cpu")
        node_vae = ComfyTurboVAE(vae, load_device=cpu, offload_device=cpu)
        if decode:
            return lambda: node_vae.decode(x)
        images = x[0].permute(1, 2, 3, 0).add(1).div(2)  # [T, H, W, C] in [0, 1], as core hands frames over
        return lambda: node_vae.encode(images)
    raise ValueError(f"unknown way {way!r}")


if __name__ == "__main__":
    way, key, direction, fraction = sys.argv[1:5]
    print(json.dumps(main(way, key, direction, float(fraction))))
