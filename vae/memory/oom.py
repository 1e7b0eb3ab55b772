"""Out-of-memory: one test for "this failure was an allocation failure", and running a step so that a
retry happens after the failed attempt's memory is really released.

Why one module: the tiler, the nodes, the engines, the CUDA-graph runner and the compile fallback all
decide "retry smaller / wait for the next call" versus "this is a real error" on the same question. Near
the VRAM limit the answer does not always come as `torch.OutOfMemoryError`: cuBLAS and cuDNN report a
failed workspace or handle allocation with their own status names inside a plain RuntimeError, a CUDA
runtime call reports `cudaErrorMemoryAllocation` as "CUDA error: out of memory", and the CPU allocator
raises a RuntimeError of its own. Types decide first; the status names are in one table below.

Why the retry runs after the `except` block: while the exception is being handled, its traceback holds
every frame of the failed attempt, and with them the activations it allocated; emptying the allocator's
cache there releases nothing. `attempt` returns an `OutOfMemory` value outside the block, the exception
(and its traceback) is gone, and `release_cached` then has something to give back.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Callable, Hashable, TypeVar, Union

import torch

T = TypeVar("T")

OOM_TYPES: tuple[type[BaseException], ...] = (torch.OutOfMemoryError, MemoryError)

# The documented names under which allocation failures arrive inside a RuntimeError (matched as substrings
# of the message; one table, one place). Sources: cuBLAS `cublasStatus_t`, cuDNN `cudnnStatus_t` (8.x and
# the 9.x sub-codes), cuFFT `cufftResult`, cuSOLVER `cusolverStatus_t`, the CUDA runtime's
# cudaErrorMemoryAllocation as torch's C10_CUDA_CHECK prints it, and c10's CPU allocator (alloc_cpu.cpp).
ALLOCATION_FAILURE_NAMES: tuple[str, ...] = (
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    "CUFFT_ALLOC_FAILED",
    "CUSOLVER_STATUS_ALLOC_FAILED",
    "CUDA error: out of memory",
    "DefaultCPUAllocator: can't allocate memory",
)


def is_out_of_memory(err: BaseException) -> bool:
    """True when `err`, or an exception it was raised from (`raise ... from`), is an allocation failure:
    by type (`torch.OutOfMemoryError`, `MemoryError`), else a RuntimeError carrying one of the
    documented allocation-failure names (`ALLOCATION_FAILURE_NAMES`)."""
    seen: set[int] = set()
    e = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OOM_TYPES):
            return True
        if isinstance(e, RuntimeError) and any(name in str(e) for name in ALLOCATION_FAILURE_NAMES):
            return True
        e = e.__cause__
    return False


class RetriesExhausted(MemoryError):
    """Out of memory after every retry a pass allows (smallest tile and slice): not retried again."""


@dataclass(frozen=True)
class OutOfMemory:
    """What `attempt` returns instead of raising: the failure described, not kept (see the module doc)."""

    reason: str


def describe(err: BaseException) -> str:
    """'Type: first line of the message' (CUDA OOM messages run to several lines of allocator statistics)."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:300] if lines else ''}"


def attempt(run: Callable[[], T]) -> Union[T, OutOfMemory]:
    """`run()`, or `OutOfMemory` when it failed to allocate; any other exception (and `RetriesExhausted`)
    propagates unchanged.
    The caller retries after this returns, so the failed attempt's tensors can be freed first."""
    try:
        return run()
    except BaseException as e:  # noqa: BLE001 - re-raised unless it is an allocation failure
        if isinstance(e, RetriesExhausted) or not is_out_of_memory(e):
            raise
        reason = describe(e)
    return OutOfMemory(reason)


def release_cached(device: Union[str, torch.device, None] = None) -> None:
    """Collect the failed attempt's garbage (frames kept alive by reference cycles) and hand the CUDA
    caching allocator's free blocks back to the driver, so a retry — or the next node — can use them."""
    gc.collect()
    if (device is None or torch.device(device).type == "cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()


OOM_FAILURES_TO_DISABLE = 3  # out-of-memory failures in a row before an optional path is switched off


class OomStreak:
    """The one rule for an optional path (fast path, CUDA graphs, engines) that ran out of memory: an
    out-of-memory is transient (other models were resident), not a sign the path is wrong, so the path is
    kept and tried again; only `limit` out-of-memory failures in a row, per key, with no success between
    them, switch it off — and only a path that costs memory (vae/accel/self_checks `oom_may_switch_off`, from the
    one table of paths): switching off a path that saves memory would make the next attempt need more. Callers
    free what the failed attempt held (`release_cached`, or the tiler's retry)."""

    def __init__(self, limit: int = OOM_FAILURES_TO_DISABLE):
        if limit < 1:
            raise ValueError(f"an out-of-memory streak limit must be >= 1 (got {limit})")
        self.limit = limit
        self._counts: dict[Hashable, int] = {}

    def failed(self, key: Hashable = None) -> int:
        """Count one more out-of-memory for `key`; the streak so far."""
        count = self._counts[key] = self._counts.get(key, 0) + 1
        return count

    def exhausted(self, key: Hashable = None) -> bool:
        """Whether `key` ran out of memory `limit` times in a row: switch its path off."""
        return self._counts.get(key, 0) >= self.limit

    def succeeded(self, key: Hashable = None) -> None:
        """A success ends the streak."""
        self._counts.pop(key, None)

    def count(self, key: Hashable = None) -> int:
        return self._counts.get(key, 0)

    def clear(self) -> None:
        self._counts.clear()
