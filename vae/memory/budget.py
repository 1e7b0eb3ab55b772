"""The memory budget of a pass: what it may use on its device besides the weights and its input, and what it may keep
in host memory.

Why a budget, not free memory: an empty 80 GB card would otherwise take plans that need tens of GB, and a 12–24 GB
card next to a resident diffusion model would guess. Every plan's peak is predicted (vae/planning) and the fastest
plan whose prediction fits the budget runs. The budget is the caller's (the ComfyUI nodes take it from ComfyUI's
model management); otherwise `default_budget_bytes`: DEFAULT_PASS_BUDGET_BYTES, or less where the device has less
free. docs/memory.md describes the rule and the prediction's measured error.

Host memory is budgeted too, where it is apart from the device's (a GPU beside the machine's RAM): a plan may keep
caches, the output or (SeedVR2's streamed passes) every activation there, and RAM that runs out does not fail one
allocation, it gets the whole process killed by the operating system. The default is the RAM available now less a
margin (`host_margin_bytes`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Optional, Union

import torch

from .device import USABLE_FRACTION, free_memory_bytes, total_memory_bytes

log = logging.getLogger("turbovae")

# The pass budget outside ComfyUI (weights and input not included): what a 24 GB card can spare for the VAE's
# working memory beside a resident diffusion model. Override per call (`budget_bytes=`) or with MemoryBudget.
DEFAULT_PASS_BUDGET_BYTES = 10 * 2**30

# RAM a host budget leaves to everything else: the larger of 2 GiB and a tenth of the machine's RAM. Why: "available"
# already excludes what other programs and ComfyUI's offloaded models hold now, but they grow while a long pass runs
# (the Python heap, the allocator's caches, a browser, the kernel's own reserve and page cache it will not give up),
# and running out kills the server rather than failing an allocation; a tenth of 32 GB (3.2 GB) is about what a
# ComfyUI process and a desktop grow by during a long decode, 2 GiB the floor on small machines.
HOST_MARGIN_MIN_BYTES = 2 * 2**30

HOST_MARGIN_FRACTION = 0.1


class BudgetTooSmall(ValueError):
    """No plan of a pass fits the memory budget (vae/planning); the message names the smallest budget that works
    and what to do, and the exception carries it for code (benches, nodes) to read rather than parse:
    `need_bytes`, the device budget that works; `need_host_bytes`, the host memory that plan keeps (0: none, or
    not apart from the device's); `floor`, that plan as `PassPlan.layout()` says it. None where not known."""

    def __init__(self, message: str, need_bytes: Optional[int] = None, need_host_bytes: Optional[int] = None,
                 floor: Optional[str] = None):
        super().__init__(message)
        self.need_bytes, self.need_host_bytes, self.floor = need_bytes, need_host_bytes, floor

    def needs(self) -> str:
        """The message's own words for it: `needs_text`."""
        return needs_text(self.need_bytes, self.need_host_bytes, self.floor)


def needs_text(need_bytes: Optional[int], need_host_bytes: Optional[int], floor: Optional[str]) -> str:
    """'the smallest needs N MB[ on the device and H MB of host memory] (plan)': how a refusal names the budget
    that works (MB rounded up)."""
    need = f"{math.ceil(need_bytes / 2**20)} MB" if need_bytes is not None else "more"
    if need_host_bytes:
        need += f" on the device and {math.ceil(need_host_bytes / 2**20)} MB of host memory"
    return f"the smallest needs {need}" + (f" ({floor})" if floor else "")


@dataclass(frozen=True)
class MemoryBudget:
    """The memory a pass may use for its own tensors, in bytes (the weights and the input are held anyway and are
    not part of it): `pass_bytes` on its device (None: `default_budget_bytes(device)`), `host_bytes` in host memory
    where that is apart from the device's (None: `default_host_budget_bytes()`)."""

    pass_bytes: Optional[int] = None
    host_bytes: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("pass_bytes", "host_bytes"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise ValueError(f"{name}={v!r} must be a positive number of bytes (or None for the default budget)")

    def resolve(self, device: Union[str, torch.device]) -> int:
        return default_budget_bytes(device) if self.pass_bytes is None else self.pass_bytes

    def resolve_host(self) -> int:
        return default_host_budget_bytes() if self.host_bytes is None else self.host_bytes


def default_budget_bytes(device: Union[str, torch.device]) -> int:
    """The budget outside ComfyUI: DEFAULT_PASS_BUDGET_BYTES, or USABLE_FRACTION of the device's free memory where
    that is less."""
    return min(DEFAULT_PASS_BUDGET_BYTES, int(free_memory_bytes(torch.device(device)) * USABLE_FRACTION))


def host_margin_bytes(total: Optional[int] = None) -> int:
    """RAM a host budget leaves free (HOST_MARGIN_MIN_BYTES, or HOST_MARGIN_FRACTION of `total`, the machine's RAM
    by default, where that is more)."""
    total = total_memory_bytes(torch.device("cpu")) if total is None else total
    return max(HOST_MARGIN_MIN_BYTES, int(total * HOST_MARGIN_FRACTION))


def default_host_budget_bytes(available: Optional[int] = None) -> int:
    """What a pass may keep in host memory outside ComfyUI: the RAM available now (`available`, default the
    operating system's figure) less `host_margin_bytes` (at least 1 byte: a plan then keeps nothing there)."""
    available = free_memory_bytes(torch.device("cpu")) if available is None else available
    return max(1, int(available) - host_margin_bytes())
