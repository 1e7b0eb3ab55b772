"""`python -m turbovae decode|encode …`: exact decode/encode of files with the frame split across devices.

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

from .trt.fileio import atomic_file, atomic_write_bytes
from .vae.dtypes import DTYPE_NAMES

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")


def add_arguments(p: argparse.ArgumentParser, *, decode: bool) -> None:
    p.add_argument("--vae", required=True, help="VAE checkpoint file or diffusers folder")
    p.add_argument("--input", required=True, nargs="+",
                   help="latents .safetensors" if decode else "pixels .safetensors, or image files (one per frame)")
    p.add_argument("--output", required=True,
                   help="pixels .safetensors or .png/.jpg (one image per frame)" if decode else "latents .safetensors")
    p.add_argument("--devices", default="all", help='without torchrun: "all" (every visible GPU, else the CPU) or e.g. "cuda:0,cuda:1" / '
                                                  '"cpu,cpu" (default: all)')
    p.add_argument("--dtype", choices=DTYPE_NAMES, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--tile", type=int, default=None,
                   help="tile side in pixels of the single-device pass the bands share (each band's tiles hold 1/N "
                        "of its area); 0 = each device sizes its tiles from free memory (default: 512)")
    p.add_argument("--temporal-slice", type=int, default=None, help="latent frames per step (default: automatic)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds a rank waits for the others before the pass fails (torchrun only; default: 600)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.set_defaults(func=run, decode=decode)


def _read_tensor(path: Path, key: str) -> torch.Tensor:
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    if key in tensors:
        return tensors[key]
    if len(tensors) == 1:
        return next(iter(tensors.values()))
    raise ValueError(f"{path} holds {sorted(tensors)}; name the tensor '{key}' or keep only one")


def _read_images(paths: list[Path]) -> torch.Tensor:
    try:
        from PIL import Image
    except ImportError as e:
        raise RuntimeError("reading image files needs Pillow: pip install pillow (or pass a .safetensors)") from e
    import numpy as np

    frames = [torch.from_numpy(np.asarray(Image.open(p).convert("RGB"), dtype=np.float32)) for p in paths]
    if len({f.shape for f in frames}) > 1:
        raise ValueError("all input images must have the same size")
    clip = torch.stack(frames).permute(3, 0, 1, 2).unsqueeze(0)  # [1, 3, T, H, W]
    return clip / 127.5 - 1.0


def read_input(paths: list[str], *, decode: bool) -> torch.Tensor:
    files = [Path(p) for p in paths]
    for p in files:
        if not p.is_file():
            raise FileNotFoundError(f"input not found: {p}")
    if files[0].suffix.lower() in IMAGE_SUFFIXES and not decode:
        return _read_images(files)
    if len(files) != 1 or files[0].suffix.lower() != ".safetensors":
        raise ValueError("give one .safetensors input" + ("" if decode else ", or image files"))
    return _read_tensor(files[0], "latents" if decode else "pixels")


def write_output(out: torch.Tensor, path: Path, *, decode: bool, overwrite: bool) -> list[Path]:
    from safetensors.torch import save

    if path.suffix.lower() == ".safetensors":
        key = "pixels" if decode else "latents"
        atomic_write_bytes(path, save({key: out.float().contiguous().cpu()}), overwrite=overwrite)
        return [path]
    if not decode or path.suffix.lower() not in IMAGE_SUFFIXES:
        raise ValueError(f"output {path}: use .safetensors" + (" or an image suffix" if decode else ""))
    from PIL import Image

    clip = out if out.ndim == 5 else out.unsqueeze(2)
    frames = ((clip[0].float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0).cpu().numpy()
    names = [path] if len(frames) == 1 else [path.with_name(f"{path.stem}_{i:05d}{path.suffix}")
                                              for i in range(len(frames))]
    for frame, name in zip(frames, names):
        with atomic_file(name, overwrite=overwrite) as f:
            Image.fromarray(frame).save(f, format=Image.registered_extensions()[name.suffix.lower()])
    return names


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


def run(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    from .vae.api import load_checkpoint
    from .vae.parallel import decode_parallel, encode_parallel, parse_devices

    under_torchrun = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    started = False
    if under_torchrun and not dist.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=args.timeout))
        started = True
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
