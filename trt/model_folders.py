"""Whether a checkpoint path an engine manifest records belongs to the user's model folders.

Why a module of its own: users share one model store between installs through symbolic links (a file or a
whole sub-folder linked into models/vae) or extra_model_paths.yaml roots, and ComfyUI lists such files as
ordinary model files. A file listed in a model folder is the user's to use, and so is an engine set built
from it. Resolving the recorded path first and comparing it with the folders (what the loader did before
issue 41) turns every linked file into "outside the folder". A manifest can come from anywhere, though,
so a recorded path that climbs out ('..') or names a file nothing in the folders leads to is still refused.

Rules, in order (`source` as recorded, `real` its resolved file):
1. a recorded path with a '..' component is refused (our builders never write one);
2. the recorded path, made absolute without resolving links, lies under a root as the root is written
   (linked files and linked sub-folders are the user's: the link is);
3. `real` lies under a resolved root (a root that is itself a link, named by its target);
4. a symbolic link found under a root resolves to `real` (engines built outside ComfyUI record the
   resolved checkpoint; the user linked that file in under any name).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Iterator, Sequence, Union

PathLike = Union[str, os.PathLike]


def climbs_out(source: PathLike) -> bool:
    """True when the path has a '..' component (refused however it resolves)."""
    return ".." in Path(source).parts


def _under(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root and path != root
    except ValueError:  # different drives on Windows
        return False


def _linked_files(root: str) -> Iterator[str]:
    """Resolved targets of the symbolic links under `root`, following linked folders once each (a link
    loop cannot make the walk endless: a folder already walked, by its resolved path, is skipped)."""
    seen: set[str] = set()
    pending = [root]
    while pending:
        folder = pending.pop()
        real_folder = os.path.realpath(folder)
        if real_folder in seen:
            continue
        seen.add(real_folder)
        try:
            entries = list(os.scandir(folder))
        except OSError:  # unreadable or vanished: nothing of it is listed either
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=True):
                    pending.append(entry.path)
                elif entry.is_symlink():
                    yield os.path.realpath(entry.path)
            except OSError:
                continue


def in_model_folders(source: PathLike, real: PathLike, roots: Sequence[PathLike]) -> bool:
    """Whether the recorded `source` (resolving to the existing file `real`) is a file the user keeps in one
    of the model folders `roots` (rules in the module docstring)."""
    if climbs_out(source):
        return False
    lexical = os.path.normcase(os.path.abspath(source))
    real_path = os.path.normcase(os.path.realpath(real))
    written = [os.path.normcase(os.path.abspath(r)) for r in roots]
    if any(_under(lexical, r) for r in written):
        return True
    if any(_under(real_path, os.path.normcase(os.path.realpath(r))) for r in roots):
        return True
    return any(os.path.normcase(target) == real_path for r in written for target in _linked_files(r))


def describe_roots(roots: Iterable[PathLike]) -> str:
    """The folders as the user wrote them, for error messages."""
    return ", ".join(os.path.abspath(r) for r in roots) or "(none)"
