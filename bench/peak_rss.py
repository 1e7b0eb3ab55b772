"""Peak resident memory of one operation, measured in a fresh subprocess (CPU benchmarks).

The child builds its inputs and model, resets the kernel's peak-RSS counter (/proc/self/clear_refs),
records the resident size, runs the operation once and reports the peak increase. A fresh process per
measurement keeps allocator caches of earlier runs out of the number.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable, Optional, TypeVar

T = TypeVar("T")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> int:
    """Reset VmHWM to the current RSS; returns the current RSS in KiB."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return _status_kib("VmRSS")


def peak_increase_mb(base_kib: int) -> float:
    return (_status_kib("VmHWM") - base_kib) / 1024


def supported() -> bool:
    return sys.platform.startswith("linux") and os.path.exists("/proc/self/clear_refs")


# glibc keeps freed blocks below its (dynamic, up to 32 MiB) mmap threshold on the heap, so the RSS
# high-water mark of tile-by-tile code also counts memory the allocator retained, not only live tensors.
# A fixed 64 KiB threshold returns every large block to the OS when it is freed, for every variant alike.
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def run_child(module: str, args: dict, timeout: Optional[float] = None) -> dict:
    """Run `python -m <module> <json>` and parse the JSON line it prints last."""
    env = dict(os.environ, **CHILD_ENV)
    proc = subprocess.run([sys.executable, "-m", module, json.dumps(args)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
MEASURING_THRESHOLD = 64 * 1024  # every freed block above this goes back to the OS: RSS = live memory
TIMING_THRESHOLD = 32 * 1024 * 1024  # glibc's ceiling for its dynamic threshold (64-bit): where it settles


def _set_mmap_threshold(nbytes: Optional[int], *, trim: bool = False) -> None:
    """A no-op where glibc's `mallopt` is not available. A fixed value also disables glibc's dynamic raise
    (None: leave the threshold as it is). `trim`: also hand the free blocks the heap holds back to the OS
    (`malloc_trim`)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        libc = ctypes.CDLL(name)
        if nbytes is not None:
            libc.mallopt(M_MMAP_THRESHOLD, nbytes)
        if trim:
            libc.malloc_trim(0)
    except (OSError, AttributeError):
        return


def resident_mb() -> float:
    """This process's resident size in MB after `malloc_trim`, so memory that was freed (but that the heap
    kept for reuse) does not count: what the process holds, such as a model and anything it cached."""
    _set_mmap_threshold(None, trim=True)
    return _status_kib("VmRSS") / 1024


def return_freed_memory() -> None:
    """Make glibc return every freed block above 64 KiB to the OS in this process (as CHILD_ENV does for
    children), and what the heap already retains, so peak-RSS increases measured in-process count live
    memory: a measured call cannot reuse retained blocks without their pages counting again."""
    _set_mmap_threshold(MEASURING_THRESHOLD, trim=True)


def peak_increase_of(fn: Callable[[], T]) -> tuple[float, T]:
    """(peak RSS increase in MB, result) of one call of `fn` in this process, counting live memory only
    (`return_freed_memory` first). The caller restores the allocator for timed runs (`retain_freed_memory`)."""
    return_freed_memory()
    base = reset_peak()
    out = fn()
    return peak_increase_mb(base), out


def retain_freed_memory() -> None:
    """Let glibc keep freed blocks up to 32 MiB for reuse again, as its default dynamic threshold does once a
    process has freed large blocks. Timed runs need this: under the 64 KiB setting every large tensor is a
    fresh mmap whose pages fault in on first touch, which made paths that allocate more buffers look slower
    (docs/BENCHMARKS.md gives the case measured both ways)."""
    _set_mmap_threshold(TIMING_THRESHOLD)
