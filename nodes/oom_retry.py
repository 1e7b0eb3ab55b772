"""Core VAE Decode/Encode retry with tiles when a whole pass runs out of memory; ours do too."""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch

import comfy.model_management as mm

from ..vae.memory.oom import OutOfMemory, attempt, release_cached

OOM_RETRY_OVERLAP_PX = 64  # blend width if an out-of-memory retry ends up with fast tiles
log = logging.getLogger(__name__)


def unless_out_of_memory(run: Callable[[], torch.Tensor]) -> Optional[torch.Tensor]:
    """`run()`, or None when it ran out of memory (any allocation failure `vae.memory.oom.is_out_of_memory` knows:
    CUDA's OOM, cuBLAS/cuDNN allocation statuses, the CPU allocator's RuntimeError). None is returned outside
    the except block, so the failed pass's tensors are already freed when the caller retries.

    Why not `mm.OOM_EXCEPTION`: on a ComfyUI without CUDA it is `Exception` itself, which would turn every
    error (a bad input, a cancel) into a tiled retry."""
    result = attempt(run)
    return None if isinstance(result, OutOfMemory) else result


def warn_oom(what: str) -> None:
    """Core VAE Decode/Encode retry tiled on out-of-memory; so do we, with our memory-sized tiles (which
    shrink further, then stop with a clear MemoryError, if memory is still short)."""
    log.warning("TurboVAE: out of memory %s without tiles; retrying with tiles sized from free memory", what)
    release_cached()
    mm.soft_empty_cache()
