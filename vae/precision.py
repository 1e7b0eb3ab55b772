"""Full fp32 (no TF32) for exactness comparisons on CUDA: `exact_fp32()`.

Why: on Ampere and later GPUs torch runs fp32 cuDNN convolutions in TF32 by default (10 mantissa bits in the
products; `torch.backends.cudnn.allow_tf32` is True out of the box, matmuls are not). The CPU, and a GPU with
TF32 off, convolve in IEEE fp32. So an fp32 result computed partly on a GPU with TF32 on and partly on the CPU
(a mixed-device parallel pass), or compared against a CPU reference, differs by TF32 rounding, far above the
fp32 exactness bars (≤ 1e-4 / ≤ 1e-5). Those bars are bars of IEEE fp32: the comparisons that state them run
inside `exact_fp32()`, and a self-check that asks "does this kernel set compute the same conv" runs its probe
there too. TurboVAE does not change the process's TF32 setting otherwise: an fp32 pass on a GPU runs as the
user's torch is configured (docs/gpu.md, "fp32 and TF32").

The flags are process-wide (every thread, every device), so the block should not overlap passes that want
TF32; entering saves the current settings and leaving restores exactly them (nesting restores level by level).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

IEEE = "ieee"


@dataclass(frozen=True)
class Fp32Settings:
    """torch's fp32 precision switches, as read before a change: `legacy` = (cudnn.allow_tf32,
    cuda.matmul.allow_tf32), the switches most code (ComfyUI included) sets; where those cannot be read
    because the new-style switches were set to differing values (torch >= 2.9 refuses to read the legacy ones
    then), `new` = the `fp32_precision` values of cuDNN conv, cuDNN RNN and CUDA matmul."""

    legacy: Optional[tuple[bool, bool]] = None
    new: Optional[tuple[str, str, str]] = None


def current_settings() -> Fp32Settings:
    """The switches now (what `exact_fp32` restores on exit)."""
    try:
        return Fp32Settings(legacy=(bool(torch.backends.cudnn.allow_tf32),
                                    bool(torch.backends.cuda.matmul.allow_tf32)))
    except RuntimeError:  # torch's own refusal: only the new-style switches describe this state
        b = torch.backends
        return Fp32Settings(new=(b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision,
                                 b.cuda.matmul.fp32_precision))


def apply_settings(settings: Fp32Settings) -> None:
    """Set the switches to `settings` (as `current_settings` read them), through the same API."""
    if settings.legacy is not None:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = settings.legacy
    else:
        b = torch.backends
        b.cudnn.conv.fp32_precision, b.cudnn.rnn.fp32_precision, b.cuda.matmul.fp32_precision = settings.new


def tf32_possible() -> bool:
    """Whether fp32 cuDNN convolutions or CUDA matmuls may run in TF32 with the current switches (that the
    GPU supports TF32 is not checked)."""
    s = current_settings()
    if s.legacy is not None:
        return any(s.legacy) or torch.get_float32_matmul_precision() != "highest"
    return "tf32" in s.new


@contextmanager
def exact_fp32() -> Iterator[None]:
    """Inside the block fp32 cuDNN convolutions and CUDA matmuls run in IEEE fp32 (TF32 off); on exit the
    switches are exactly as they were. A no-op in effect on the CPU (whose convs never use TF32)."""
    saved = current_settings()
    if saved.legacy is not None:
        apply_settings(Fp32Settings(legacy=(False, False)))
    else:
        apply_settings(Fp32Settings(new=(IEEE, IEEE, IEEE)))
    try:
        yield
    finally:
        apply_settings(saved)
