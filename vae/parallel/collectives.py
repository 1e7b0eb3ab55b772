"""The few collectives a sharded pass needs, behind one interface with two implementations.

- `DistCollective`: a torch.distributed process group (NCCL for CUDA tensors, gloo for CPU): halos by
  `batch_isend_irecv` with the two neighbours, statistics by `all_reduce`, frames by `all_gather`.
- `DeviceGroup`: one process driving several devices (ComfyUI runs one process). Each device's band runs
  in its own thread; the "collective" is a barrier plus tensors moved between devices with `.to()`. It is
  not a transport: there is nothing to send, every thread sees every tensor.

Every rank calls the same collectives in the same order (the passes are SPMD). A rank that fails makes the
others fail too: `DeviceGroup` aborts its barrier; `DistCollective` relies on the progress ticks (an
all-reduced error flag, see `Lockstep`) and, for an error between ticks, on the process group's timeout or
the failed process's exit.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional, Protocol, Sequence, TypeVar

import torch
import torch.distributed as dist

from .. import device_guard
from ..accel import self_checks
from ..base import Progress

T = TypeVar("T")
R = TypeVar("R")


class ParallelPassError(RuntimeError):
    """The sharded pass stopped on this rank because another rank failed, was cancelled or timed out."""


class Collective(Protocol):
    rank: int
    size: int
    device: torch.device

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks (same order on every rank, so every rank gets the same bits)."""

    def halo(self, x: torch.Tensor, top: int, bottom: int) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """(upper neighbour's last `top` rows, lower neighbour's first `bottom` rows) of the band tensor `x`
        [..., rows, W]; None at the frame's first / last band or for 0 rows."""

    def all_gather_rows(self, x: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
        """Every rank's band (band r has `counts[r]` rows) concatenated along rows, on every rank."""

    returns_result: bool  # whether this rank returns the whole result (then it passes `out` to collect_rows)

    def collect_rows(self, x: torch.Tensor, counts: Sequence[int], out: Optional[torch.Tensor]) -> None:
        """Write every band into `out` (the whole frame, any device) on the ranks that return a result."""

    def any_failed(self, failed: bool) -> bool:
        """True on every rank when any rank passes True."""


def _neighbour_rows(x: torch.Tensor, top: int, bottom: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows the upper neighbour needs from x, rows the lower neighbour needs from x)."""
    return x[..., :bottom, :], x[..., x.shape[-2] - top:, :]


def halo_transfers(x: torch.Tensor, top: int, bottom: int, rank: int,
                   size: int) -> tuple[list[tuple[bool, torch.Tensor, int]], Optional[torch.Tensor],
                                       Optional[torch.Tensor]]:
    """What a process group's halo exchange allocates on `rank`: ([(send?, tensor, neighbour rank)] in the order
    the transfers are posted — the contiguous rows sent to each neighbour, the buffers received into —, rows
    received from above, rows received from below). The meta stand-in (vae/parallel/predict.py) allocates the same."""
    send_up, send_down = _neighbour_rows(x, top, bottom)
    shape = list(x.shape)
    transfers: list[tuple[bool, torch.Tensor, int]] = []
    above = below = None
    if rank > 0:
        if bottom:
            transfers.append((True, send_up.contiguous(), rank - 1))
        if top:
            above = x.new_empty(shape[:-2] + [top, shape[-1]])
            transfers.append((False, above, rank - 1))
    if rank < size - 1:
        if top:
            transfers.append((True, send_down.contiguous(), rank + 1))
        if bottom:
            below = x.new_empty(shape[:-2] + [bottom, shape[-1]])
            transfers.append((False, below, rank + 1))
    return transfers, above, below


def gather_padded(x: torch.Tensor, counts: Sequence[int], size: int,
                  all_gather: Callable[[list[torch.Tensor], torch.Tensor], None]) -> list[torch.Tensor]:
    """Every rank's band through `all_gather(parts, x)`, which needs equal shapes: bands are padded to the tallest
    and trimmed after (a process group's gathers; the meta stand-in passes a gather that sends nothing)."""
    most = max(counts)
    if x.shape[-2] < most:
        x = torch.nn.functional.pad(x, (0, 0, 0, most - x.shape[-2]))
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(size)]
    all_gather(parts, x)
    return [p[..., :n, :] for p, n in zip(parts, counts)]


def collect_frame(parts: Sequence[torch.Tensor], out: torch.Tensor, t: int) -> None:
    """Frame `t` of every band (gathered, in rank order) written into the whole output `out`."""
    r0 = 0
    for p in parts:
        out[:, :, t, r0:r0 + p.shape[-2]] = p
        r0 += p.shape[-2]


class DeviceGroup:
    """Shared state of the threads driving `devices` from one process."""

    def __init__(self, devices: Sequence[torch.device]):
        self.devices = list(devices)
        self._barrier = threading.Barrier(len(self.devices))
        self._slots: list = [None] * len(self.devices)

    def member(self, rank: int) -> "DeviceCollective":
        return DeviceCollective(self, rank)

    def abort(self) -> None:
        self._barrier.abort()

    def exchange(self, rank: int, value, read: Callable[[list], R] = list) -> R:
        """Everybody posts a value; `read(values in rank order)` runs while every thread is still held, so
        nobody overwrites a tensor (e.g. an in-place residual) before the others have copied from it."""
        try:
            self._slots[rank] = value
            self._barrier.wait()
            result = read(self._slots)
            self._barrier.wait()
            # everybody has read it: the slot lets go of the value (else a posted band, e.g. the views of a whole
            # stage output a halo is cut from, stayed alive until the next exchange)
            self._slots[rank] = None
        except threading.BrokenBarrierError:
            raise ParallelPassError(f"rank {rank} ({self.devices[rank]}): another device's band failed or "
                                    "was cancelled; the pass stopped") from None
        return result


class DeviceCollective:
    returns_result = property(lambda self: self.rank == 0)

    def __init__(self, group: DeviceGroup, rank: int):
        self.group, self.rank, self.size = group, rank, len(group.devices)
        self.device = group.devices[rank]

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        def total(values):
            acc = values[0].to(self.device, copy=True)
            for v in values[1:]:
                acc += v.to(self.device)
            return acc

        return self.group.exchange(self.rank, t, total)

    def halo(self, x, top, bottom):
        def neighbours(values):
            above = values[self.rank - 1][1].to(self.device, copy=True) if self.rank > 0 and top else None
            below = (values[self.rank + 1][0].to(self.device, copy=True)
                     if self.rank < self.size - 1 and bottom else None)
            return above, below

        return self.group.exchange(self.rank, _neighbour_rows(x, top, bottom), neighbours)

    def all_gather_rows(self, x, counts):
        return self.group.exchange(self.rank, x, lambda values: torch.cat([v.to(self.device) for v in values], -2))

    def collect_rows(self, x, counts, out):
        def write(values):
            if out is not None:
                r0 = 0
                for v in values:
                    out[..., r0:r0 + v.shape[-2], :] = v.to(out.device)
                    r0 += v.shape[-2]

        self.group.exchange(self.rank, x, write)

    def any_failed(self, failed: bool) -> bool:
        return self.group.exchange(self.rank, failed, any)


def run_on_devices(devices: Sequence[torch.device], fn: Callable[[DeviceCollective], T]) -> T:
    """`fn(collective)` on one thread per device (rank 0 on the calling thread, so progress callbacks and
    UI interrupts run where the caller expects them); returns rank 0's result. When any rank raises, the
    barrier is aborted, every thread stops at its next collective, and the first real error is re-raised
    (ComfyUI's interrupt, an out-of-memory, a bad input) with the rank that raised it noted."""
    group = DeviceGroup(devices)
    errors: list[Optional[BaseException]] = [None] * len(devices)

    def worker(rank: int) -> Optional[T]:
        try:
            # the band's device is current for its thread and restored after: rank 0 runs on the caller's
            # thread, whose device ComfyUI's later nodes still use
            with device_guard.on_device(group.devices[rank]), torch.inference_mode():
                return fn(group.member(rank))
        except ParallelPassError as e:  # a consequence: every rank saw the failure flag (or the abort)
            errors[rank] = e
            return None
        except BaseException as e:  # noqa: BLE001 - any other failure must stop the other threads
            errors[rank] = e
            group.abort()
            return None

    threads = [threading.Thread(target=worker, args=(r,), name=f"turbovae-band-{r}", daemon=True)
               for r in range(1, len(devices))]
    for t in threads:
        t.start()
    result = worker(0)
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None and not isinstance(e, ParallelPassError)), None)
    first = first or next((e for e in errors if e is not None), None)
    if first is not None:
        rank = errors.index(first)
        first.add_note(f"raised by the band on rank {rank} ({group.devices[rank]}) of a {len(devices)}-device pass")
        raise first
    return result  # type: ignore[return-value]


class DistCollective:
    """A torch.distributed process group; tensors live on `device` (CUDA for NCCL, CPU for gloo)."""

    returns_result = True  # every rank returns the whole result

    def __init__(self, group: Optional[dist.ProcessGroup], device: torch.device):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.device = device

    def _peer(self, rank: int) -> int:
        return dist.get_global_rank(self.group, rank) if self.group is not None else rank

    def _call(self, what: str, op: Callable[[], T]) -> T:
        try:
            return op()
        except RuntimeError as e:  # DistBackendError, gloo/NCCL errors and timeouts are RuntimeErrors
            raise ParallelPassError(f"rank {self.rank}: {what} with the other ranks failed — another rank failed, "
                                    "was cancelled or exited, or the process group timed out") from e

    def all_reduce_sum(self, t):
        t = t.to(self.device, copy=True).contiguous()
        self._call("all_reduce", lambda: dist.all_reduce(t, group=self.group))
        return t

    def halo(self, x, top, bottom):
        transfers, above, below = halo_transfers(x, top, bottom, self.rank, self.size)
        ops = [dist.P2POp(dist.isend if send else dist.irecv, t, self._peer(peer), self.group)
               for send, t, peer in transfers]

        def exchange():
            for req in dist.batch_isend_irecv(ops) if ops else []:
                req.wait()

        self._call("halo exchange", exchange)
        return above, below

    def _gather_padded(self, x: torch.Tensor, counts: Sequence[int]) -> list[torch.Tensor]:
        def all_gather(parts: list[torch.Tensor], t: torch.Tensor) -> None:
            self._call("all_gather", lambda: dist.all_gather(parts, t, group=self.group))

        return gather_padded(x, counts, self.size, all_gather)

    def all_gather_rows(self, x, counts):
        return torch.cat(self._gather_padded(x, counts), dim=-2)

    def collect_rows(self, x, counts, out):
        """Frame by frame (dim 2), so the transient gather buffer is one frame of every band, not a second
        copy of the whole output."""
        for t in range(x.shape[2]):
            collect_frame(self._gather_padded(x[:, :, t], counts), out, t)

    def agree_min(self, values: Sequence[int]) -> list[int]:
        """The element-wise minimum over ranks: sizes each rank chose from its own budget (tile, temporal
        slice) must be the same on every rank, or the ranks would run different collectives."""
        t = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        self._call("size agreement", lambda: dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group))
        return [int(v) for v in t.tolist()]

    def any_failed(self, failed: bool) -> bool:
        flag = torch.tensor([1 if failed else 0], dtype=torch.int32, device=self.device)
        self._call("failure check", lambda: dist.all_reduce(flag, group=self.group))
        return bool(flag.item())


def process_group_trusted(comm: DistCollective) -> bool:
    """The process group's self-check (vae/accel/self_checks), on GPU devices: an all_reduce of known values (rank + 1
    on every rank) must give their exact sum, once per (device, backend, world size). Every rank sees the same
    reduced values, so the ranks decide alike; a rank whose probe raises decides alone (its peers then fail at
    their next collective, as for any failed rank)."""
    if not self_checks.applies_to(comm.device):
        return True
    n = comm.size
    key = f"{dist.get_backend(comm.group)} group of {n}"
    probe = lambda: comm.all_reduce_sum(torch.full((4,), float(comm.rank + 1), device=comm.device))  # noqa: E731
    want = lambda: torch.full((4,), float(n * (n + 1) // 2), device=comm.device)  # noqa: E731
    if not self_checks.check("process_group", comm.device, key, probe, want):
        return False
    self_checks.used("process_group")
    return True


class Lockstep:
    """Progress ticks that are also synchronisation points: every rank ticks the same number of times, and
    at each tick an error flag is all-reduced, so a cancel (the progress callback raising) or a failure
    seen at a tick stops every rank there instead of leaving the others waiting in a collective."""

    def __init__(self, comm: Collective, progress: Progress):
        self.comm, self.progress = comm, progress

    def __call__(self, done: int, total: int) -> None:
        error: Optional[BaseException] = None
        if self.progress is not None:
            try:
                self.progress(done, total)
            except BaseException as e:  # noqa: BLE001 - re-raised below, after telling the other ranks
                error = e
        if self.comm.any_failed(error is not None):
            if error is not None:
                raise error
            raise ParallelPassError(f"rank {self.comm.rank}: another rank was cancelled or failed at step "
                                    f"{done}/{total}; the pass stopped")
