"""Complete-or-absent, non-clobbering file writes for engines, manifests and ONNX files.

Policy (documented in docs/engines.md):
- a write goes to a temporary file in the same folder, named `.<name>.tmp-<random>`: hidden, and never
  ending in an engine suffix, so no loader or file list mistakes it for an engine;
- files are created with mode 0666 minus the user's umask (as `open` would), never `mkstemp`'s 0600, so
  a shared server's other users can read what a build wrote;
- publishing is one atomic step: without `overwrite`, `os.link` (fails if the target exists, no
  check-then-replace race); with `overwrite`, `os.replace`;
- an existing file is never replaced unless the caller passes `overwrite=True`; otherwise
  `FileExistsError` names the file and the flag to pass.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator, Union

log = logging.getLogger(__name__)

PathLike = Union[str, os.PathLike]


def refuse_existing(path: Path, overwrite: bool) -> None:
    if os.path.lexists(path) and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True (CLI: --overwrite) to replace it, "
                              "or choose another output folder")


def temporary_name(path: Path) -> Path:
    """`<dir>/.<name>.tmp-<hex>`: hidden and without the final suffix (an engine suffix included)."""
    return path.with_name(f".{path.name}.tmp-{secrets.token_hex(6)}")


def create_new(path: Path) -> BinaryIO:
    """Open `path` for writing, failing if it exists; mode 0666 minus the umask (unlike mkstemp's 0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    return os.fdopen(fd, "wb")


def publish(tmp: Path, path: Path, *, overwrite: bool) -> None:
    """Move the finished `tmp` onto `path` in one step; without `overwrite` it fails if `path` exists."""
    if overwrite:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)  # atomic and exclusive: FileExistsError when someone got there first
    except FileExistsError:
        refuse_existing(path, False)
        raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        # No hard links on this file system: the exclusive create of the target is the lock instead.
        log.debug("no hard links in %s (%s); publishing %s by exclusive create + replace", path.parent, e, path.name)
        create_new(path).close()
        os.replace(tmp, path)
        return
    tmp.unlink()


@contextmanager
def atomic_file(path: PathLike, *, overwrite: bool = False) -> Iterator[BinaryIO]:
    """A binary file object whose content appears at `path` only when the block finishes without error."""
    path = Path(path)
    refuse_existing(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        with create_new(tmp) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if tmp.stat().st_size == 0:
            raise OSError(f"writing {path} produced no data")
        publish(tmp, path, overwrite=overwrite)
    finally:
        if os.path.lexists(tmp):
            tmp.unlink()


def atomic_write_bytes(path: PathLike, data: bytes, *, overwrite: bool = False) -> Path:
    with atomic_file(path, overwrite=overwrite) as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path: PathLike, text: str, *, overwrite: bool = False) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), overwrite=overwrite)


def file_sha256(path: PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()
