"""Core VAE Decode/Encode retry with tiles when a whole pass runs out of memory; ours do too."""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch

import comfy.model_management as mm

from ..vae.tiling.api import is_out_of_memory

OOM_RETRY_OVERLAP_PX = 64  # blend width if an out-of-memory retry ends up with fast tiles
log = logging.getLogger(__name__)


def unless_out_of_memory(run: Callable[[], torch.Tensor]) -> Optional[torch.Tensor]:
    """`run()`, or None when it ran out of memory: CUDA's OOM type, or the CPU allocator's plain
    RuntimeError. None is returned outside the except block, so the failed pass's tensors can be freed."""
    try:
        return run()
    except (mm.OOM_EXCEPTION, MemoryError, RuntimeError) as e:
        if not (isinstance(e, mm.OOM_EXCEPTION) or is_out_of_memory(e)):
            raise
    return None


def warn_oom(what: str) -> None:
    """Core VAE Decode/Encode retry tiled on out-of-memory; so do we, with our memory-sized tiles (which
    shrink further, then stop with a clear MemoryError, if memory is still short)."""
    log.warning("TurboVAE: out of memory %s without tiles; retrying with tiles sized from free memory", what)
    mm.soft_empty_cache()
