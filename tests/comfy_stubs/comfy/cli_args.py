"""TEST DOUBLE of ComfyUI's comfy/cli_args.py (only what TurboVAE reads). Not ComfyUI code.

`args.vram_headroom` is core's --vram-headroom (GB of VRAM comfy-aimdo keeps free under dynamic VRAM)."""

from types import SimpleNamespace

args = SimpleNamespace(vram_headroom=0.0)
