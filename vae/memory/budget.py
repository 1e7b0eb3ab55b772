"""The memory budget of a pass: what it may use on its device besides the weights and its input.

Why a budget, not free memory: an empty 80 GB card would otherwise take plans that need tens of GB, and a 12–24 GB
card next to a resident diffusion model would guess. Every plan's peak is predicted (vae/planning) and the fastest
plan whose prediction fits the budget runs. The budget is the caller's (the ComfyUI nodes take it from ComfyUI's
model management); otherwise `default_budget_bytes`: DEFAULT_PASS_BUDGET_BYTES, or less where the device has less
free. docs/memory.md describes the rule and the prediction's measured error.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional, Union

import torch

from .device import USABLE_FRACTION, free_memory_bytes

log = logging.getLogger("turbovae")

# The pass budget outside ComfyUI (weights and input not included): what a 24 GB card can spare for the VAE's
# working memory beside a resident diffusion model. Override per call (`budget_bytes=`) or with MemoryBudget.
DEFAULT_PASS_BUDGET_BYTES = 10 * 2**30


class BudgetTooSmall(ValueError):
    """No plan of a pass fits the memory budget (vae/planning); the message names the smallest budget that works
    and what to do."""


@dataclass(frozen=True)
class MemoryBudget:
    """The memory a pass may use for its own tensors, in bytes (the weights and the input are held anyway and are
    not part of it). `pass_bytes` None: `default_budget_bytes(device)`."""

    pass_bytes: Optional[int] = None

    def __post_init__(self) -> None:
        if self.pass_bytes is not None and (isinstance(self.pass_bytes, bool) or not isinstance(self.pass_bytes, int)
                                            or self.pass_bytes <= 0):
            raise ValueError(f"pass_bytes={self.pass_bytes!r} must be a positive number of bytes (or None for the "
                             "default budget)")

    def resolve(self, device: Union[str, torch.device]) -> int:
        return default_budget_bytes(device) if self.pass_bytes is None else self.pass_bytes


def default_budget_bytes(device: Union[str, torch.device]) -> int:
    """The budget outside ComfyUI: DEFAULT_PASS_BUDGET_BYTES, or USABLE_FRACTION of the device's free memory where
    that is less."""
    return min(DEFAULT_PASS_BUDGET_BYTES, int(free_memory_bytes(torch.device(device)) * USABLE_FRACTION))
