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
from typing import Optional


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


def return_freed_memory() -> None:
    """Make glibc return every freed block above 64 KiB to the OS in this process (as CHILD_ENV does for
    children), so peak-RSS increases measured in-process count live memory, not allocator retention.
    A no-op where glibc's `mallopt` is not available."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(-3, 65536)  # M_MMAP_THRESHOLD; a fixed value also disables glibc's dynamic raise
    except (OSError, AttributeError):
        return
