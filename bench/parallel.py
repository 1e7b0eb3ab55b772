"""Sharded exact passes: a gloo group of 2 processes on CPU vs the single-device exact pass, same run.

Shows correctness (max abs error against `decode_tiled(mode="exact")`) and what splitting costs: both ranks
and the single-device pass get 1 torch thread each, so with 2 free cores the ratio is the 2-rank scaling
(ideal 2×) less the halo/statistics/gather overhead and the work the split repeats; on a machine whose cores
are busy with other work the ratio is noise (read the per-run times in the note). On a CUDA machine with 2+ GPUs a `devices=` row per case
runs the same pass on cuda:0 and cuda:1 in one process against cuda:0 alone.

Peak memory: the RSS high-water increase of a pass (Linux), per rank (the larger of the two) and for the
single-device pass in a fresh subprocess, both with glibc's fixed mmap threshold (bench/peak_rss.py). The
column is a later pass (what every pass after the first needs); the note adds the first pass, which also
builds the weights each device derives once and keeps with the model (folded taps for the T=1 path).

Cases (bench/cases.py): SeedVR2 and Qwen-Image/Wan 2.1 decode and encode at 256×256 px with seeded real-size
weights; `--quick`: tiny configs.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from typing import Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..vae.api import TurboVAE
from ..vae.parallel import decode_parallel, encode_parallel
from ..vae.tiled import decode_tiled, encode_tiled
from .common import BenchOptions, BenchRow
from ..vae.measuring import max_abs, sync
from .cases import Pixels, for_section
from .models import family_model, seeded_init
from .peak_rss import CHILD_ENV, peak_increase_of, run_child, supported

SECTION = "parallel"
WORLD = 2


def _vae(key: str, quick: bool) -> TurboVAE:
    return TurboVAE(seeded_init(family_model(key, real=not quick)))


def _input(vae: TurboVAE, case: Pixels) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    fmt = vae.latent_format
    f = fmt.spatial_factor
    if case.decode:
        return torch.randn(1, fmt.channels, fmt.latent_frames(case.frames), case.height // f, case.width // f,
                           generator=g)
    return torch.rand(1, fmt.image_channels, case.frames, case.height, case.width, generator=g) * 2 - 1


def cases() -> tuple[Pixels, ...]:
    """The passes split (bench/cases.py); an odd band split is covered by the tests."""
    return for_section("parallel")


def _peaks(run_once) -> tuple[float, float]:
    """Peak RSS increase (MB) of a first and a second call of `run_once` (-1 where unsupported)."""
    if not supported():
        run_once(), run_once()
        return -1.0, -1.0
    (first, _), (later, _) = peak_increase_of(run_once), peak_increase_of(run_once)
    return first, later


def _rank(rank: int, folder: str, quick: bool, repeat: int) -> None:
    """One gloo rank: every case, two measured warm-ups (first pass, later pass), then `repeat` timed runs
    (each after a barrier)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(folder, "store"), WORLD), rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=600))
    results = {}
    for case in cases():
        vae = _vae(case.family, quick)
        x = _input(vae, case)
        run = decode_parallel if case.decode else encode_parallel
        dist.barrier()
        peak = _peaks(lambda: run(vae, x))
        times = []
        for _ in range(repeat):
            dist.barrier()
            t0 = time.perf_counter()
            out = run(vae, x)
            times.append((time.perf_counter() - t0) * 1e3)
        results[_name(case, quick)] = (times, out, peak)
    torch.save(results if rank == 0 else {k: ([], None, v[2]) for k, v in results.items()},
               os.path.join(folder, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _time(fn, repeat: int, device: torch.device) -> tuple[list[float], torch.Tensor]:
    out = fn()
    times = []
    for _ in range(repeat):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return times, out


def run(opts: BenchOptions) -> list[BenchRow]:
    repeat = max(1, opts.repeat)
    rows: list[BenchRow] = []
    threads = torch.get_num_threads()
    saved = {k: os.environ.get(k) for k in CHILD_ENV}
    os.environ.update(CHILD_ENV)  # the spawned ranks measure memory like the single-device child
    try:
        with tempfile.TemporaryDirectory() as folder:
            mp.start_processes(_rank, args=(folder, opts.quick, repeat), nprocs=WORLD, start_method="spawn")
            gloo = [torch.load(os.path.join(folder, f"rank{r}.pt"), weights_only=True) for r in range(WORLD)]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    torch.set_num_threads(1)
    try:
        for pixels in cases():
            vae = _vae(pixels.family, opts.quick)
            x = _input(vae, pixels)
            single = ((lambda: decode_tiled(vae, x, mode="exact")) if pixels.decode
                      else (lambda: encode_tiled(vae, x, mode="exact")))
            base_times, ref = _time(single, repeat, vae.device)
            case = _name(pixels, opts.quick)
            times, out, _ = gloo[0][case]
            rank_first, rank_peak = (max(g[case][2][i] for g in gloo) for i in (0, 1))
            single = (run_child(f"{__package__}.parallel", {"case": asdict(pixels), "quick": opts.quick})
                      if supported() else {"first_mb": None, "peak_mb": None})
            base = min(base_times)
            rows.append(BenchRow(SECTION, case, "single-device exact (1 thread)", base, base,
                                 peak_mb=single["peak_mb"],
                                 note="decode_tiled/encode_tiled mode=exact, fp32"
                                      + _first_note(single["first_mb"], single["peak_mb"])))
            rows.append(BenchRow(SECTION, case, f"gloo {WORLD} ranks × 1 thread", min(times), base,
                                 peak_mb=rank_peak if rank_peak >= 0 else None, max_abs_err=max_abs(out, ref),
                                 note=f"min of {len(times)} (ms: {'/'.join(f'{t:.0f}' for t in times)}); "
                                      f"single: {'/'.join(f'{t:.0f}' for t in base_times)}"
                                      + (_first_note(rank_first, rank_peak) if rank_peak >= 0 else "")
                                      + (f"; peak per rank {rank_peak / single['peak_mb']:.2f}x single"
                                         if rank_peak >= 0 and single["peak_mb"] else "")))
            if torch.cuda.is_available() and torch.cuda.device_count() >= 2 and opts.device.startswith("cuda"):
                rows.extend(_cuda_rows(pixels, case, opts, repeat))
    finally:
        torch.set_num_threads(threads)
    return rows


def _cuda_rows(pixels: Pixels, case: str, opts: BenchOptions, repeat: int) -> list[BenchRow]:
    dev = torch.device("cuda:0")
    vae = _vae(pixels.family, opts.quick).to(device=dev)
    x = _input(vae, pixels).to(dev)
    run = decode_parallel if pixels.decode else encode_parallel
    tiled = decode_tiled if pixels.decode else encode_tiled
    base_times, ref = _time(lambda: tiled(vae, x, mode="exact"), repeat, dev)
    times, out = _time(lambda: run(vae, x, devices=["cuda:0", "cuda:1"]), repeat, dev)
    return [BenchRow(SECTION, case, "cuda:0 exact", min(base_times), min(base_times)),
            BenchRow(SECTION, case, "devices=cuda:0,cuda:1", min(times), min(base_times),
                     max_abs_err=max_abs(out, ref), note="fp32")]


def _name(case: Pixels, quick: bool) -> str:
    return f"{case.shown} {case.kind} {case.frames}×{case.height}×{case.width}{' (tiny)' if quick else ''}"


def _first_note(first: Optional[float], later: Optional[float]) -> str:
    return f"; first pass {first:.0f} MB (later passes {later:.0f} MB)" if first is not None and later else ""


def _single_peak_child(args: dict) -> dict:
    """Fresh-process peak RSS increases of a first and a later single-device exact pass (what the ranks are
    compared with)."""
    torch.set_num_threads(1)
    case = Pixels(**args["case"])
    vae = _vae(case.family, args["quick"])
    x = _input(vae, case)
    first, later = _peaks(lambda: decode_tiled(vae, x, mode="exact") if case.decode
                          else encode_tiled(vae, x, mode="exact"))
    return {"first_mb": first, "peak_mb": later}


if __name__ == "__main__":  # the child of run_child
    print(json.dumps(_single_peak_child(json.loads(sys.argv[1]))))
