"""The files `python -m turbovae decode|encode` reads and writes: latents and pixels as safetensors, pixels also as
image files (one per frame). Written whole (temporary file, then a rename), never over an existing file unless
asked.

Why in the command line: the library and the nodes take and return tensors; only the command line names files.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..trt.fileio import atomic_file, atomic_write_bytes

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")


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
