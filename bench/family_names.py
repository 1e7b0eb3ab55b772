"""The family names the benchmark's case tables use: the one bench module that spells a family's name.

Why a module of names: the case tables (bench/gpu.py, engines.py, budget_gpu.py, …) each measure given sizes of
given families, in an order that matters, so they stay beside the code that runs them; but the family a case
runs is the registry's (vae/registry.py), and each name here is checked against it when the bench is imported,
so a renamed or removed family fails here, at once, not in one table's run. A case shows the name it was given
in its rows ("wan2.1 clip decode …", "qwen image decode …"), which is why the Qwen-Image family has three names
here: its key, and the two aliases that say which model a case stands for (the Qwen-Image image VAE, the Wan 2.1
video VAE: the same weights).
"""

from __future__ import annotations

from ..vae.registry import family


def _registered(name: str) -> str:
    """`name`, once the registry knows it as a family's key or alias (UnknownFamily otherwise)."""
    if name not in family(name).names:  # the registry forgives spellings; a case's rows show this one
        raise ValueError(f"{name!r} is not how the registry spells the family: use one of {family(name).names}")
    return name


SEEDVR2 = _registered("seedvr2")
QWEN_IMAGE = _registered("qwen_image")  # the Qwen-Image / Wan 2.1 family, by its key
QWEN = _registered("qwen")  # the same family, where a case stands for the Qwen-Image image VAE
WAN21 = _registered("wan2.1")  # the same family, where a case stands for the Wan 2.1 video VAE
WAN22 = _registered("wan2.2")

__all__ = ["QWEN", "QWEN_IMAGE", "SEEDVR2", "WAN21", "WAN22"]
