"""The checkpoint architectures of the registered families (kept for imports of `BUILTIN` and the detection
helpers from here). The families and their facts live in vae/registry.py, which registers their architectures
with the checkpoint loader on import; this module imports it, so the registry is complete whenever a VAE can be
loaded.
"""

from __future__ import annotations

from .checkpoint import SD_KL, Architecture, detect_architecture, register_architecture, registered_architectures
from .registry import BUILTIN_FAMILIES

BUILTIN: tuple[Architecture, ...] = (*(a for f in BUILTIN_FAMILIES for a in f.architectures), SD_KL)

__all__ = ["BUILTIN", "detect_architecture", "register_architecture", "registered_architectures"]
