"""`python -m turbovae decode|encode …`: exact decode/encode of files with the frame split across devices
(vae/parallel/), the files read and written by cli/clip_files.py.

Under torchrun (`torchrun --nproc-per-node N -m turbovae decode …`) every rank joins the process group
(NCCL on CUDA, each rank on cuda:LOCAL_RANK; gloo on CPU) and rank 0 writes the result and prints progress.
Without torchrun this process drives `--devices` itself ("all" = every visible GPU).

Files: latents are safetensors (tensor "latents", or the file's only tensor), [B, C, T, h, w] or [B, C, h, w];
pixels are safetensors ("pixels", [B, 3, T, H, W] in [-1, 1]) or image files (PNG/JPEG/…, via Pillow, one
frame each, in the order given). Decode writes safetensors ("pixels") or, for a `.png`/`.jpg` output, one
image per frame (numbered when there are several). Outputs are written whole (temporary file, then a
rename) and never overwrite an existing file unless `--overwrite`.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from ..vae.dtypes import DTYPE_NAMES
from .clip_files import read_input, write_output


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """`decode` and `encode`: the same options, each direction's files."""
    for name, decode in (("decode", True), ("encode", False)):
        add_arguments(sub.add_parser(name, help=f"exact {name} of files, frame split across devices "
                                                "(torchrun: one rank per GPU)"), decode=decode)


def add_arguments(p: argparse.ArgumentParser, *, decode: bool) -> None:
    p.add_argument("--vae", required=True, help="VAE checkpoint file or diffusers folder")
    p.add_argument("--input", required=True, nargs="+",
                   help="latents .safetensors" if decode else "pixels .safetensors, or image files (one per frame)")
    p.add_argument("--output", required=True,
                   help="pixels .safetensors or .png/.jpg (one image per frame)" if decode else "latents .safetensors")
    p.add_argument("--devices", default="all", help='without torchrun: "all" (every visible GPU, else the CPU) or '
                                                  'e.g. "cuda:0,cuda:1" / "cpu,cpu" (default: all)')
    p.add_argument("--dtype", choices=DTYPE_NAMES, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--tile", type=int, default=None,
                   help="tile side in pixels of the single-device pass the bands share (each band's tiles hold 1/N "
                        "of its area); 0 = sized from each device's budget by the band's predicted peak (default: 512)")
    p.add_argument("--temporal-slice", type=int, default=None, help="latent frames per step (default: automatic)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds a rank waits for the others before the pass fails (torchrun only; default: 600)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.set_defaults(func=run, decode=decode)


def _progress(enabled: bool) -> Optional[Callable[[int, int], None]]:
    if not enabled:
        return None
    last = [0.0]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] > 0.5:
            print(f"\r{done}/{total} steps", end="\n" if done == total else "", file=sys.stderr, flush=True)
            last[0] = now

    return show


def _join_process_group(timeout_s: float) -> bool:
    """Under torchrun: join the ranks' process group (NCCL on CUDA, each rank on cuda:LOCAL_RANK; gloo on CPU)
    unless one is running; True when this call started it (and so must end it)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout_s))
    return True


def run(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    from ..vae.loader import load_checkpoint
    from ..vae.parallel import decode_parallel, encode_parallel, parse_devices

    under_torchrun = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    started = under_torchrun and _join_process_group(args.timeout)
    try:
        rank = dist.get_rank() if under_torchrun else 0
        device = (torch.device("cuda", torch.cuda.current_device()) if under_torchrun and torch.cuda.is_available()
                  else None)
        if under_torchrun and device is None:
            device = torch.device("cpu")
        vae = load_checkpoint(args.vae, dtype=args.dtype, device=device)
        x = read_input(args.input, decode=args.decode)
        out_path = Path(args.output)
        if rank == 0 and out_path.suffix.lower() == ".safetensors" and out_path.exists() and not args.overwrite:
            raise FileExistsError(f"{out_path} exists; pass --overwrite to replace it")
        run_pass = decode_parallel if args.decode else encode_parallel
        where = {} if under_torchrun else {"devices": args.devices}
        t0 = time.perf_counter()
        out = run_pass(vae, x, tile_px=args.tile, temporal_slice=args.temporal_slice, progress=_progress(rank == 0),
                       **where)
        if rank == 0:
            written = write_output(out, out_path, decode=args.decode, overwrite=args.overwrite)
            what = "decoded" if args.decode else "encoded"
            ranks = dist.get_world_size() if under_torchrun else len(parse_devices(args.devices))
            print(f"{what} {tuple(x.shape)} -> {tuple(out.shape)} in {time.perf_counter() - t0:.2f} s on "
                  f"{ranks} {'rank(s)' if under_torchrun else 'device(s)'}; wrote {', '.join(map(str, written[:3]))}"
                  f"{' …' if len(written) > 3 else ''}", flush=True)
    finally:
        if started:
            dist.destroy_process_group()
    return 0
