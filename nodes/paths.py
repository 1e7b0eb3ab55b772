"""Model-folder helpers shared by every TurboVAE node (loader, tiled nodes, engine nodes).

File names arrive from the browser and are untrusted: they are resolved only through ComfyUI's
`folder_paths`, and the result must still lie inside one of the registered folders for that key.
Symlinked files inside a models folder are allowed (users link large checkpoints from other disks);
names that climb out (`..`, absolute paths, drive letters) are refused before any lookup.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath, PureWindowsPath
from typing import Iterable

import folder_paths  # ComfyUI module; this package's nodes are only imported inside ComfyUI (or its test doubles)

from ..trt.formats import ENGINE_SUFFIXES, MANIFEST_NAME

TENSORRT_KEY = "tensorrt"
VAE_KEY = "vae"


class UnsafePathError(ValueError):
    """A file name that would leave the models folder."""


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name.strip():
        raise ValueError("no file selected: pick a file from the list (click 'Refresh' after adding files)")
    if "\x00" in name:
        raise UnsafePathError(f"file name {name!r} contains a NUL byte")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise UnsafePathError(f"file name {name!r} contains a control character (newline, tab, ...); pick a file "
                              "from the list")
    for flavour in (PurePosixPath(name), PureWindowsPath(name)):
        if flavour.is_absolute() or flavour.drive or flavour.root or ".." in flavour.parts:
            raise UnsafePathError(
                f"file name {name!r} points outside the models folder; pick a file from the list "
                "(names must be relative and must not contain '..')")


def _inside(path: str, roots: Iterable[str]) -> bool:
    target = os.path.normcase(os.path.abspath(path))
    for root in roots:
        root = os.path.normcase(os.path.abspath(root))
        try:
            if os.path.commonpath([target, root]) == root and target != root:
                return True
        except ValueError:  # different drives on Windows
            continue
    return False


def check_model_name(name: str) -> None:
    """Refuse a name that can never be a model file (empty, only spaces, NUL/control characters, or one
    that climbs out of the folder) without touching the disk: callers check before costly work."""
    _check_name(name)


def model_roots(key: str) -> list[str]:
    """The registered folders for `key` (empty when none is registered)."""
    return list(folder_paths.get_folder_paths(key)) if key in folder_paths.folder_names_and_paths else []


def resolve_model_file(key: str, name: str) -> str:
    """Full path of `name` in the `key` models folders; FileNotFoundError names the folders searched."""
    _check_name(name)
    roots = folder_paths.get_folder_paths(key) if key in folder_paths.folder_names_and_paths else []
    full = folder_paths.get_full_path(key, name)
    if full is None:
        where = ", ".join(roots) or f"(no '{key}' folder is registered)"
        raise FileNotFoundError(f"{name!r} was not found in the {key} models folder(s): {where}. "
                                "Put the file there and press 'Refresh' (R) in the UI.")
    if not _inside(full, roots):
        raise UnsafePathError(f"{name!r} resolves to {full}, outside the {key} models folder(s)")
    return full


def list_model_files(key: str, suffixes: Iterable[str] = ()) -> list[str]:
    """Names the UI should offer for `key` (optionally only these suffixes), sorted."""
    if key not in folder_paths.folder_names_and_paths:
        return []
    wanted = tuple(s.lower() for s in suffixes)
    names = folder_paths.get_filename_list(key)
    return sorted(n for n in names if not wanted or n.lower().endswith(wanted))


def register_tensorrt_folder(extensions: Iterable[str] = ENGINE_SUFFIXES + (os.path.splitext(MANIFEST_NAME)[1],)) -> list[str]:
    """Make sure the `tensorrt` key lists models/tensorrt and our engine suffixes, keeping user entries.

    `extra_model_paths.yaml` is read before custom nodes import, so a `tensorrt` entry may already exist
    (possibly created with an empty extension set, which means "every file"): merge, never replace.
    Returns the folder list after merging.
    """
    default_dir = os.path.join(folder_paths.models_dir, TENSORRT_KEY)
    exts = {e.lower() for e in extensions}
    entry = folder_paths.folder_names_and_paths.get(TENSORRT_KEY)
    if entry is None:
        folder_paths.folder_names_and_paths[TENSORRT_KEY] = ([default_dir], set(exts))
        return [default_dir]
    paths, existing = entry[0], entry[1]
    if default_dir not in paths:
        paths.append(default_dir)
    if existing:  # an empty set already accepts everything; a non-empty one gets ours added
        if isinstance(existing, set) and existing is not folder_paths.supported_pt_extensions:
            existing.update(exts)
        else:  # shared or immutable set: give this key its own copy rather than widening other keys
            folder_paths.folder_names_and_paths[TENSORRT_KEY] = (paths, set(existing) | exts)
    return list(paths)


def engine_output_dir() -> str:
    """Where engine builds are written: the folder the loader lists first (models/tensorrt by default)."""
    register_tensorrt_folder()
    paths = folder_paths.get_folder_paths(TENSORRT_KEY)
    default_dir = os.path.join(folder_paths.models_dir, TENSORRT_KEY)
    out = paths[0] if paths else default_dir
    os.makedirs(out, exist_ok=True)
    return out
