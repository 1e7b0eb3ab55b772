"""Loading a checkpoint into a `TurboVAE`: where and in what dtype it loads (`resolve_device`,
`resolve_dtype_and_device`, the loaders' defaults) and `load_checkpoint` (a checkpoint file, a diffusers folder
or a state dict -> the architecture its keys name, built and wrapped). Reading and strictly checking the file is
vae/checkpoint.py; the object loaded is vae/api.py's `TurboVAE`; the public loader, which also takes engine
folders, is `turbovae.load_vae` (loading.py), which calls this for checkpoints.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping, Optional, Union

import torch

from .api import TurboVAE
from .checkpoint import CheckpointError, check_finite, detect_architecture, read_state_dict, resolve_checkpoint_path, \
    unwrap_vae_keys
from .dtypes import working_dtype
from .registry import supported_text

log = logging.getLogger("turbovae")


class DeviceUnavailable(ValueError):
    """A device that does not exist on this machine (e.g. `cuda` without a usable GPU)."""


def resolve_device(device: Union[None, str, torch.device]) -> torch.device:
    """`device` as a torch.device that exists here; None picks CUDA when available, else the CPU.

    Why: torch accepts `torch.device("cuda")` on a CPU-only machine and fails later with an
    AssertionError deep inside; this says what is wrong before anything is loaded.
    """
    if device is None:
        return _default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise DeviceUnavailable(f"unknown device {device!r} ({e}); use cpu or cuda (cuda:N for a GPU index)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailable(f"device {device!r} was asked for, but this PyTorch sees no CUDA GPU "
                                    f"(torch {torch.__version__}, cuda {torch.version.cuda}); use device cpu, or "
                                    "install a CUDA build of PyTorch")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceUnavailable(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s)")
    elif dev.type not in ("cpu", "mps", "xpu"):
        raise DeviceUnavailable(f"device {device!r} is not supported; use cpu or cuda")
    return dev


def _default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def resolve_dtype_and_device(dtype: Union[None, str, torch.dtype],
                             device: Union[None, str, torch.device]) -> tuple[torch.dtype, torch.device]:
    """The loaders' defaults: `device` None picks CUDA when available; `dtype` None (or "auto") keeps fp32 on
    the CPU and uses bf16 on CUDA."""
    target_device = resolve_device(device)
    return working_dtype(dtype, target_device), target_device


def load_checkpoint(source: Union[str, os.PathLike, Mapping[str, torch.Tensor]], *,
                    dtype: Union[None, str, torch.dtype] = None, device: Union[None, str, torch.device] = None,
                    config: Optional[dict] = None) -> TurboVAE:
    """Load a VAE from a checkpoint file, a diffusers folder or a state dict — checkpoints only. The public
    loader is `turbovae.load_vae` (loading.py), which also takes engine folders and calls this for
    checkpoints; `vae/` code and the engine loader's fallback call this directly (`vae/` never imports `trt/`).

    The architecture is detected from the keys and checked strictly (every key, every shape, every value
    finite). `dtype` None keeps fp32 on CPU and uses bf16 on CUDA; `device` None picks CUDA when available.
    """
    if not isinstance(source, (str, os.PathLike, Mapping)):
        raise TypeError(f"source must be a checkpoint path, a diffusers folder or a state dict, got "
                        f"{type(source).__name__}")
    target_dtype, target_device = resolve_dtype_and_device(dtype, device)

    if isinstance(source, Mapping):
        sd, name = dict(source), "state dict"
        if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in sd.items()):
            raise CheckpointError("state dict: every key must be a string and every value a tensor")
    else:
        path, diffusers_config = resolve_checkpoint_path(source)
        config = config if config is not None else diffusers_config
        sd, name = read_state_dict(path), str(path)
    found = unwrap_vae_keys(sd)
    if found.prefix:
        sd = found.state_dict
        log.info("%s: using the VAE keys under '%s'%s", name, found.prefix,
                 f" ({found.ignored} other keys ignored)" if found.ignored else "")
    arch = detect_architecture(sd)
    if arch is None or arch.build is None:
        looks = arch.name if arch else "no known VAE architecture"
        raise CheckpointError(
            f"{name}: not a supported VAE checkpoint (it looks like {looks}). Supported: {supported_text()}, "
            "in ComfyUI/original or diffusers key format.")
    check_finite(sd, name)
    model = arch.build(sd, config=config, source=name)
    model.to(device=target_device, dtype=target_dtype)
    return TurboVAE(model, source=name)
