"""The explicit list of built-in architectures, registered with the checkpoint loader on import.

Why a module of its own: `checkpoint.py` (reading and strict checking) is imported by every architecture
package, so it cannot import them back; this module sits above all of them and is what `vae/api.py`
imports, so the registry is complete whenever a VAE can be loaded — no lazy import fills it.
"""

from __future__ import annotations

from . import seedvr2, wan
from .checkpoint import SD_KL, Architecture, detect_architecture, register_architecture, registered_architectures

BUILTIN: tuple[Architecture, ...] = (*seedvr2.ARCHITECTURES, *wan.ARCHITECTURES, SD_KL)

for _arch in BUILTIN:
    register_architecture(_arch)

__all__ = ["BUILTIN", "detect_architecture", "register_architecture", "registered_architectures"]
