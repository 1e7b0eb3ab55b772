"""`turbovae.load_vae`: the one public loader; it chooses between a checkpoint and an engine folder.

It sits above both `vae/` (checkpoints, `vae.loader.load_checkpoint`) and `trt/` (engine folders,
`trt.engine_vae.load_engine_vae`), so neither imports the other's loader: `vae/` never imports `trt/`,
and the engine loader receives an already-loaded PyTorch model from `vae/` for its fallback path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional, Union

import torch

from .trt.formats import is_engine_path
from .vae.api import TurboVAE
from .vae.loader import load_checkpoint, resolve_dtype_and_device

Source = Union[str, os.PathLike, Mapping[str, torch.Tensor]]


def load_vae(source: Source, *, dtype: Union[None, str, torch.dtype] = None,
             device: Union[None, str, torch.device] = None, fallback: Optional[Source] = None,
             config: Optional[dict] = None, pad_to_bucket: bool = False) -> TurboVAE:
    """Load a VAE from a checkpoint file, a diffusers folder, a state dict, or an engine file/folder.

    Checkpoints: the architecture is detected from the keys and checked strictly (every key, every
    shape, finite values). `dtype` None keeps fp32 on CPU and uses bf16 on CUDA; `device` None picks
    CUDA when available. Engines: `fallback` is the checkpoint for the PyTorch path (default: the one
    recorded in the folder's manifest); `pad_to_bucket=True` lets sizes between buckets run padded on
    the engines (approximate; default: such sizes run on PyTorch, exactly).
    """
    target_dtype, target_device = resolve_dtype_and_device(dtype, device)
    if isinstance(source, (str, os.PathLike)) and is_engine_path(Path(source)):
        from .trt.engine_vae import load_engine_vae  # engines stay unimported for checkpoint users

        return load_engine_vae(Path(source), dtype=target_dtype, device=target_device, fallback=fallback,
                               pad_to_bucket=pad_to_bucket)
    if fallback is not None or pad_to_bucket:
        raise ValueError(f"fallback= and pad_to_bucket= apply to engine folders; {source!r} is a checkpoint")
    return load_checkpoint(source, dtype=target_dtype, device=target_device, config=config)
