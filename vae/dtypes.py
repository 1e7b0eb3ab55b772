"""The one table of floating-point dtypes TurboVAE accepts by name (API, CLI, nodes, engine manifests)."""

from __future__ import annotations

from typing import Optional, Union

import torch

# Short name -> dtype; the short names are what files and command lines carry.
DTYPE_BY_NAME = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Long spellings users also type (torch's own names).
ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float": "fp32"}
DTYPE_NAMES = tuple(DTYPE_BY_NAME)
AUTO_DTYPE = "auto"  # the caller picks per device (parse_dtype returns None)
DTYPE_CHOICES = (AUTO_DTYPE, *sorted(DTYPE_NAMES))  # what a loader offers: auto, bf16, fp16, fp32


def dtype_name(dtype: torch.dtype) -> str:
    """torch dtype -> its short name; ValueError for a dtype TurboVAE does not run in."""
    for name, value in DTYPE_BY_NAME.items():
        if value == dtype:
            return name
    raise ValueError(f"dtype {dtype} is not supported; use one of {', '.join(DTYPE_NAMES)}")


def parse_dtype(dtype: Union[None, str, torch.dtype]) -> Optional[torch.dtype]:
    """A dtype, its name, or None/"auto" (None: the caller picks per device)."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if not isinstance(dtype, str):
        raise ValueError(f"dtype must be a name or a torch.dtype, got {type(dtype).__name__}")
    key = dtype.strip().lower()
    if key == AUTO_DTYPE:
        return None
    key = ALIASES.get(key, key)
    if key not in DTYPE_BY_NAME:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_CHOICES)}")
    return DTYPE_BY_NAME[key]


def working_dtype(dtype: Union[None, str, torch.dtype], device: Union[str, torch.device]) -> torch.dtype:
    """`dtype` by name or value; None or "auto": bf16 on CUDA, fp32 elsewhere (the default of the loaders,
    the CLI and the bench)."""
    return parse_dtype(dtype) or (torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32)
