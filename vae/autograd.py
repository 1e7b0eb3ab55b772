"""Whether autograd records an op: the one test the fast paths ask before writing into memory they own.

Why: the memory-saving paths write results into existing storage (`out=` ops, a causal conv's padded input, the
input itself). Autograd cannot differentiate an `out=` op, and an in-place write may destroy a value a backward
needs, so while autograd records those paths take the plain, allocating ops (same values). Decided by grad mode
and `requires_grad` flags, never by catching PyTorch's error.
"""

from __future__ import annotations

from typing import Optional

import torch


def records_grad(*tensors: Optional[torch.Tensor]) -> bool:
    """True when grad mode is on and any of `tensors` (None skipped) requires grad: an op on them is recorded.
    False under `torch.no_grad()` and `torch.inference_mode()`, and for tensors that need no gradient."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
