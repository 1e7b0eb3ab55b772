"""File formats the engine loader recognises (kept tiny: `load_vae` imports it for every path)."""

from __future__ import annotations

from pathlib import Path

ENGINE_SUFFIXES = (".engine", ".plan", ".pt2")
IDENTITY_SUFFIX = ".json"


def is_engine_path(path: Path) -> bool:
    """An engine file, or a folder holding at least one engine file."""
    if path.is_file():
        return path.suffix.lower() in ENGINE_SUFFIXES
    if path.is_dir():
        return any(p.suffix.lower() in ENGINE_SUFFIXES for p in path.iterdir())
    return False
