"""One log line per encode/decode the nodes run: what ran (untiled, exact or fast tiles, tile size,
temporal slice), on engines or PyTorch, which GPU fast paths ran and which are switched off (vae/accel/self_checks),
how long and the peak device memory.

Why: `auto` decides at run time from free memory, and an engine VAE silently uses PyTorch for what its
engines cannot serve; without this line a user cannot tell what happened or why a run was slow.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch

from ..vae.accel import self_checks as fast_paths

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassReport:
    what: str  # "decode" | "encode"
    how: str  # e.g. "untiled", "auto: exact tiles 512 px ×4"
    temporal_slice: Optional[int]  # latent frames per step; None = sized from free memory
    backend: str  # "engines" | "PyTorch"
    seconds: float
    peak_mb: Optional[float]  # CUDA allocator peak above the start; None on CPU
    fast_paths: str = "fast paths: none"  # fast_paths.summary_since: which ran, which are switched off

    def line(self) -> str:
        slice_ = f"temporal slice {self.temporal_slice}" if self.temporal_slice else "temporal slice auto"
        peak = f"peak {self.peak_mb:.0f} MB" if self.peak_mb is not None else "peak memory not measured on CPU"
        return (f"TurboVAE {self.what}: {self.how}, {slice_}, {self.backend}, {self.fast_paths}, "
                f"{self.seconds:.2f} s, {peak}")


@contextmanager
def reported(turbo, what: str, how: str, temporal_slice: Optional[int],
             sink: Callable[[PassReport], None]) -> Iterator[None]:
    """Time the block, read the peak memory and whether engines ran, log the line and hand it to `sink`
    (only when the block succeeds: a pass that failed and was retried reports the retry)."""
    device = torch.device(turbo.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    engine_calls = getattr(turbo, "engine_calls", None)
    used_before = fast_paths.usage()
    start = time.perf_counter()
    yield
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if cuda else None
    on_engines = engine_calls is not None and getattr(turbo, "engine_calls", 0) > engine_calls
    if on_engines:
        fast_paths.used("engines")
    report = PassReport(what, how, temporal_slice, "engines" if on_engines else "PyTorch", seconds, peak,
                        fast_paths.summary_since(used_before))
    log.info(report.line())
    sink(report)
