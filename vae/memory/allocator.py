"""A pass's peak memory as the allocator saw it: the measurement every prediction is checked against.

Why a second count: the prediction (vae/planning/meta_pass.py) counts the storages a pass creates, on meta tensors; a
count of our own cannot prove itself. The allocator can: on CUDA its `max_memory_allocated`; on the CPU the
profiler's allocation events (every allocation and free of PyTorch's CPU allocator, with its address, size and
time, including the buffers a kernel allocates inside one op, which no count of op outputs sees).

Host-held tensors: a plan that keeps tensors in host memory (vae/memory/placement.py) allocates them outside PyTorch's
allocator (pinned memory on CUDA; on the CPU, memory of numpy's own), so on both devices the allocator's count is
the device side alone, as a GPU's would be, and the placement reports the host side.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Callable, Iterable, TypeVar, Union

import torch

T = TypeVar("T")


@dataclass(frozen=True)
class AllocatorPeak:
    """`device_bytes`: the most the measured call held at once beyond what was allocated before it, as the
    allocator counted; `source`: which count."""

    device_bytes: int
    source: str


def measure_peak(fn: Callable[[], T], device: Union[str, torch.device]) -> tuple[AllocatorPeak, T]:
    """(the allocator's peak while `fn()` runs, fn's result) on `device`."""
    device = torch.device(device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        out = fn()
        torch.cuda.synchronize(device)
        return AllocatorPeak(torch.cuda.max_memory_allocated(device) - base, "cuda max_memory_allocated"), out
    events, out = cpu_allocation_events(fn)
    return AllocatorPeak(timeline_peak(events), "cpu profiler allocation events"), out


def cpu_allocation_events(fn: Callable[[], T]) -> tuple[list[tuple[int, int]], T]:
    """(time ns, bytes: + allocated, - freed) of every CPU allocator event while fn runs, in time order."""
    from torch._C._profiler import _ExtraFields_Allocation
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        extra = node.extra_fields
        if isinstance(extra, _ExtraFields_Allocation):
            if extra.device.type == "cpu":
                events.append((node.start_time_ns, int(extra.alloc_size)))
            continue
        stack.extend(node.children)
    events.sort()
    return events, out


def timeline_peak(events: Iterable[tuple[int, int]]) -> int:
    """The most bytes alive at once along a time-ordered allocation timeline (frees of memory allocated before
    it lower the count; the peak is counted from the start)."""
    live = peak = 0
    for _t, size in events:
        live += size
        peak = max(peak, live)
    return peak
