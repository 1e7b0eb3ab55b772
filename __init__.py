"""TurboVAE: fast, exact, memory-safe VAE encode/decode for SeedVR2 and Qwen-Image/Wan.

Imported two ways: as the installed package `turbovae` (tests, benchmarks, `python -m turbovae`), and by
ComfyUI as a custom-node folder of any name. Importing it never imports `comfy`: the nodes are only
loaded when ComfyUI calls `comfy_entrypoint()`.
"""

from .loading import load_vae
from .vae.api import TurboVAE, moments_to_latents, pad_to_multiple
from .vae.base import LatentFormat
from .vae.checkpoint import CheckpointError
from .vae.memory.budget import BudgetTooSmall, MemoryBudget
from .vae.plan_pass import plan_pass
from .vae.parallel import ParallelPassError, decode_parallel, encode_parallel
from .vae.tiled import decode_tiled, encode_tiled

__all__ = [
    "TurboVAE", "load_vae", "decode_tiled", "encode_tiled", "moments_to_latents", "pad_to_multiple",
    "LatentFormat", "CheckpointError", "decode_parallel", "encode_parallel", "ParallelPassError",
    "plan_pass", "MemoryBudget", "BudgetTooSmall", "comfy_entrypoint",
]
__version__ = "0.3.0"


async def comfy_entrypoint():
    """ComfyUI V3 entry point (ComfyUI calls this; nothing else should)."""
    from .nodes import TurboVAEExtension

    return TurboVAEExtension()
