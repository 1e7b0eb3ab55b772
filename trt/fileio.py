"""Atomic, non-clobbering file writes for engines, sidecars and ONNX files.

Policy (documented in docs/engines.md): a write goes to a temporary file in the same folder and is
moved into place with `os.replace`, so an interrupted build never leaves a partial engine under the
final name. An existing file is never replaced unless the caller passes `overwrite=True`; otherwise
`FileExistsError` names the file and the flag to pass.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Union


def refuse_existing(path: Path, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True (CLI: --overwrite) to replace it, "
                              "or choose another output folder")


@contextmanager
def atomic_path(path: Union[str, os.PathLike], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to `path`; on success it is moved onto `path`, on error deleted.

    The temporary name keeps the final suffix (some writers, e.g. AOTInductor, insist on `.pt2`).
    """
    path = Path(path)
    refuse_existing(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".partial{path.suffix}", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if not tmp_path.exists() or tmp_path.stat().st_size == 0:
            raise OSError(f"writing {path} produced no data")
        refuse_existing(path, overwrite)  # someone may have created it meanwhile
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def atomic_write_bytes(path: Union[str, os.PathLike], data: bytes, *, overwrite: bool = False) -> Path:
    with atomic_path(path, overwrite=overwrite) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def atomic_write_text(path: Union[str, os.PathLike], text: str, *, overwrite: bool = False) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), overwrite=overwrite)


def file_sha256(path: Union[str, os.PathLike], chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()
