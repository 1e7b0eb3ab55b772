"""File formats the engine loader recognises (kept tiny: `turbovae.load_vae` imports it for every path)."""

from __future__ import annotations

from pathlib import Path

ENGINE_SUFFIXES = (".engine", ".plan", ".pt2")
MANIFEST_NAME = "manifest.json"
# What a user can pick to load engines: an engine file, or a folder's manifest (the whole set Build Engine wrote,
# whichever backend built it), so a load names the same file on machines with and without TensorRT.
LOADABLE_ENGINE_NAMES = ENGINE_SUFFIXES + (MANIFEST_NAME,)


def is_engine_path(path: Path) -> bool:
    """An engine file, or a folder with an engine manifest or engine files (a folder of an older build
    or of an unfinished one counts too, so the engine loader can say why it cannot load it)."""
    try:
        if path.is_file():
            return path.suffix.lower() in ENGINE_SUFFIXES
        if path.is_dir():
            return (path / MANIFEST_NAME).is_file() or any(p.suffix.lower() in ENGINE_SUFFIXES for p in path.iterdir())
    except OSError:  # unreadable folder: let the checkpoint loader report it
        return False
    return False
