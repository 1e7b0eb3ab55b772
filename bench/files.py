"""Writing result files so they are complete or absent (no torch import: the GPU-run driver uses it too)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Union


def write_atomic(path: Path, data: Union[str, bytes]) -> None:
    """A temporary file in the same folder, then a rename over the old state: a reader (or an interrupted
    run) sees the previous complete file or the new one. The file gets the user's umask like a plain
    `open` would (mkstemp alone makes it 0600)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
