"""One log line per encode/decode the nodes run: the plan that ran (untiled, exact or fast tiles, tile size,
temporal slice, frame stages, host memory), on engines or PyTorch, which GPU fast paths ran and which are switched
off (vae/accel/self_checks), how long, and the device memory it was predicted to need beside what the allocator
measured (CUDA).

Why: `auto` decides at run time from the memory budget, and an engine VAE silently uses PyTorch for what its
engines cannot serve; without this line a user cannot tell what happened, why a run was slow, or whether the
prediction held.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch

from ..vae.accel import self_checks as fast_paths
from ..vae.planning import PassPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassReport:
    what: str  # "decode" | "encode"
    how: str  # the plan that ran (`PassPlan.layout()`), e.g. "exact tiles 512 px ×4, temporal slice 1"
    temporal_slice: Optional[int]  # latent frames per step; None = the whole clip
    backend: str  # "engines" | "PyTorch"
    seconds: float
    peak_mb: Optional[float]  # CUDA allocator peak above the start; None on CPU
    fast_paths: str = "fast paths: none"  # fast_paths.summary_since: which ran, which are switched off
    predicted_mb: Optional[float] = None  # the plan's predicted device peak
    requested: str = "auto"  # the mode asked for

    def line(self) -> str:
        if self.peak_mb is not None:
            peak = f"peak {self.peak_mb:.0f} MB measured"
        else:
            peak = "peak not measured on the CPU"
        if self.predicted_mb is not None:
            peak += f", {self.predicted_mb:.0f} MB predicted"
        return (f"TurboVAE {self.what} ({self.requested}): {self.how}, {self.backend}, {self.fast_paths}, "
                f"{self.seconds:.2f} s, {peak}")


@contextmanager
def reported(turbo, what: str, plan: PassPlan, sink: Callable[[PassReport], None]) -> Iterator[None]:
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
    predicted = plan.predicted.pass_bytes / 2**20 if plan.predicted is not None else None
    report = PassReport(what, plan.layout(), plan.temporal_slice, "engines" if on_engines else "PyTorch", seconds,
                        peak, fast_paths.summary_since(used_before), predicted, plan.requested)
    log.info(report.line())
    sink(report)
