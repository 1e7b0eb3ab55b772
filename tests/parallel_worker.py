"""Rank bodies for tests/test_parallel.py, spawned as separate processes on a gloo group (a module of its
own so `spawn` can import it in the children)."""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist

LATENT_HW = (7, 5)  # odd height: uneven bands
TILE = 64
TALL = (27, 6)  # Wan bands tall enough to exchange halo rows per stage (with TALL_TILE) instead of recomputing
TALL_TILE = 128
CASES = [  # (kind, decode, frames, latent h×w, tile px): both architectures, both directions, images and clips
    ("seedvr2", True, 2, LATENT_HW, TILE), ("seedvr2", False, 1, LATENT_HW, TILE), ("wan2.1", True, 1, LATENT_HW, TILE),
    ("wan2.1", False, 3, LATENT_HW, TILE), ("wan2.1", False, 2, TALL, TALL_TILE), ("wan2.1", True, 2, TALL, TALL_TILE),
]


def build(kind: str):
    from turbovae import TurboVAE
    from turbovae.vae.seedvr2.config import SeedVR2Config
    from turbovae.vae.seedvr2.model import SeedVR2VAE
    from dataclasses import replace

    from turbovae.vae.wan.config import TINY_WAN21, TINY_WAN22
    from turbovae.vae.wan.model import WanVAE

    torch.manual_seed(0)
    if kind == "seedvr2":
        return TurboVAE(SeedVR2VAE(SeedVR2Config.tiny()))
    if kind == "qwen_image_layered":  # RGBA pixels
        return TurboVAE(WanVAE(replace(TINY_WAN21, image_channels=4)))
    return TurboVAE(WanVAE(TINY_WAN22 if kind == "wan2.2" else TINY_WAN21))


def case_input(vae, decode: bool, frames: int, hw: tuple[int, int] = LATENT_HW) -> torch.Tensor:
    g = torch.Generator().manual_seed(frames)
    h, w = hw
    if decode:
        return torch.randn(1, vae.latent_channels, frames, h, w, generator=g)
    f = vae.spatial_factor
    return torch.rand(1, vae.image_channels, 4 * frames - 3, h * f, w * f, generator=g) * 2 - 1


def rank_main(rank: int, world: int, folder: str) -> None:
    """Equality cases on the default group, then on a new_group; then a cancel on rank 1 at step 2; then a
    rank that fails before its first collective (the others must stop at the group's small timeout)."""
    from turbovae import ParallelPassError, decode_parallel, encode_parallel

    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(folder, "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    report = {}
    sub = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=60))
    for i, (kind, decode, frames, hw, tile) in enumerate(CASES):
        vae = build(kind)
        x = case_input(vae, decode, frames, hw)
        run = decode_parallel if decode else encode_parallel
        group = sub if i % 2 else None  # odd cases through an explicit group, even ones the default group
        report[f"{kind}-{decode}-{frames}-{hw}"] = run(vae, x, group=group, tile_px=tile, temporal_slice=1)

    report["auto"] = tile_px_0_under_a_group(rank)

    def cancel_on_rank_1(done: int, total: int) -> None:
        if rank == 1 and done == 2:
            raise KeyboardInterrupt("cancelled on rank 1")

    vae = build("seedvr2")
    x = case_input(vae, True, 1)
    try:
        decode_parallel(vae, x, tile_px=TILE, progress=cancel_on_rank_1)
        report["cancel"] = "no error"
    except (KeyboardInterrupt, ParallelPassError) as e:
        report["cancel"] = type(e).__name__
    short = dist.new_group(list(range(world)), timeout=datetime.timedelta(seconds=4))
    bad = torch.full_like(x, float("nan")) if rank == 1 else x  # rank 1 fails its input check
    t0 = time.monotonic()
    try:
        decode_parallel(vae, bad, group=short, tile_px=TILE)
        report["failure"] = "no error"
    except (ValueError, ParallelPassError) as e:
        report["failure"] = type(e).__name__
    report["failure_seconds"] = time.monotonic() - t0
    torch.save(report, os.path.join(folder, f"rank{rank}.pt"))
    # Tear the groups down before the process exits: gloo threads of a group whose collective timed out (the
    # failure case above) can otherwise abort the interpreter's exit ("terminate called without an active
    # exception") after every report is written.
    dist.destroy_process_group()


AUTO_FRAMES = 4  # latent frames: temporal slices 2 and 1 to choose from (a CPU decode)


def tile_px_0_under_a_group(rank: int) -> dict:
    """`tile_px=0` on the default group: rank 1's budget is just below the peak of what the others choose, so it
    chooses a smaller plan and every rank must run that one (agreed). Each rank's peak, measured by the CPU
    allocator (one process per rank: the profiler sees its whole pass), against its own prediction."""
    from turbovae import MemoryBudget, decode_parallel
    from turbovae.vae.memory.allocator import measure_peak
    from turbovae.vae.parallel import plan_parallel

    vae = build("wan2.1")
    x = case_input(vae, True, AUTO_FRAMES, TALL)
    roomy = plan_parallel(vae, x.shape, decode=True)
    if rank == 1:
        vae.budget = MemoryBudget(pass_bytes=roomy.peaks[0] - 1)
    with torch.inference_mode():
        measured, out = measure_peak(lambda: decode_parallel(vae, x, tile_px=0), "cpu")
    plan = plan_parallel(vae, x.shape, decode=True)  # the plan that ran (its predictions are remembered)
    return {"roomy": (roomy.tile_latent, roomy.temporal_slice), "ran": (plan.tile_latent, plan.temporal_slice),
            "measured": measured.device_bytes, "predicted": plan.peaks[0], "limit": plan.ranks[0].limit,
            "out": out}

