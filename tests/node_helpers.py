"""Shared setup for the node tests: ComfyUI test doubles on sys.path and tiny random-weight VAE files.

The tiny configs come from the architecture packages (vae/seedvr2/config.py, vae/wan/config.py); to
test another architecture add it to `TINY_MODELS`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

STUBS = Path(__file__).parent / "comfy_stubs"


def use_comfy_stubs() -> None:
    """Put the test doubles first on sys.path (the unit tests never run against a real `comfy`)."""
    loaded = sys.modules.get("comfy")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(str(STUBS)):  # real ComfyUI
        raise RuntimeError("a real ComfyUI `comfy` is already imported; run the node unit tests on their own")
    if str(STUBS) not in sys.path:
        sys.path.insert(0, str(STUBS))


def comfy_python(checkout: Path) -> str:
    """The interpreter that runs a real ComfyUI `checkout` (the real-server tests, the dynamic VRAM dry run):
    TURBOVAE_COMFYUI_PYTHON if set, else the first of <checkout>/venv, <checkout>/.venv and <checkout>/../cvenv
    that exists, else this interpreter."""
    explicit = os.environ.get("TURBOVAE_COMFYUI_PYTHON")
    if explicit:
        return explicit
    for venv in (checkout / "venv", checkout / ".venv", checkout.parent / "cvenv"):
        if (venv / "bin" / "python").is_file():
            return str(venv / "bin" / "python")
    return sys.executable


def _tiny_seedvr2():
    from turbovae.vae.seedvr2 import SeedVR2Config, SeedVR2VAE

    cfg = SeedVR2Config.tiny()
    return SeedVR2VAE(cfg), cfg


def _tiny_qwen():
    from turbovae.vae.wan import TINY_WAN21, WanVAE

    return WanVAE(TINY_WAN21), TINY_WAN21


# file name -> builder returning (random-weight model, the config to load it with)
TINY_MODELS = {
    "seedvr2_tiny.safetensors": _tiny_seedvr2,
    "qwen_image_tiny.safetensors": _tiny_qwen,
}


def write_tiny_vae(folder: Path, name: str) -> tuple[Path, object]:
    torch.manual_seed(0)
    model, cfg = TINY_MODELS[name]()
    path = folder / name
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path))
    return path, cfg


def hide_comfy_stubs() -> None:
    """Drop the doubles from sys.modules once the node modules hold their references, so other tests
    (e.g. the check that `import turbovae` never pulls `comfy`) see a clean interpreter."""
    for name in list(sys.modules):
        if name.split(".")[0] in ("comfy", "comfy_api", "folder_paths"):
            del sys.modules[name]
    if str(STUBS) in sys.path:
        sys.path.remove(str(STUBS))
