"""An engine folder is `manifest.json` plus the files it lists, nothing else.

A finished build writes the manifest last, atomically: it names every engine file of the set with
that engine's identity (trt/identity.py) and the set's run options. The loader reads it once and
ignores every other file in the folder (a stray `*.pt2`, a temporary file of a killed build, an old
engine of another set), so a folder is either a complete set or, without a manifest, not a set.

Folders from before the manifest (one `<engine>.json` identity file next to each engine) are refused
with a ManifestError telling to rebuild: their files cannot be told apart from strays.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .fileio import atomic_write_text
from .formats import ENGINE_SUFFIXES, MANIFEST_NAME
from .identity import EngineIdentity, IdentityError

MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 16 << 20  # a real manifest is a few kB; refuse to parse a huge (hostile) file


class ManifestError(IdentityError):
    """No manifest, or one that cannot be used; the message says to rebuild the set."""


@dataclass(frozen=True)
class ManifestEntry:
    file: str  # a plain file name inside the folder
    identity: EngineIdentity


@dataclass(frozen=True)
class Manifest:
    """The engines of one folder and the set's run options."""

    folder: Path
    entries: tuple[ManifestEntry, ...]
    # pad_to_bucket: run sizes between buckets padded (approximate), recorded from `build-engines --pad-to-bucket`
    options: dict = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.folder / MANIFEST_NAME

    def files(self) -> list[tuple[Path, EngineIdentity]]:
        return [(self.folder / e.file, e.identity) for e in self.entries]

    def only(self, file_name: str) -> "Manifest":
        """The manifest restricted to one engine file (Load TRT VAE's scope "file")."""
        kept = tuple(e for e in self.entries if e.file == file_name)
        if not kept:
            raise ManifestError(f"{self.folder / file_name}: not listed in {self.path} (a stray or unfinished file; "
                                "only engines a finished build listed are loaded) — pick a listed engine or rebuild")
        return Manifest(self.folder, kept, self.options)

    @property
    def pad_to_bucket(self) -> bool:
        return bool(self.options.get("pad_to_bucket", False))

    def to_json(self) -> str:
        return json.dumps({"manifest_version": MANIFEST_VERSION, "options": self.options,
                           "engines": [{"file": e.file, "identity": e.identity.to_dict()} for e in self.entries]},
                          indent=1, sort_keys=True)

    def write(self, *, overwrite: bool = False) -> Path:
        return atomic_write_text(self.path, self.to_json(), overwrite=overwrite)


def is_plain_engine_name(name: object) -> bool:
    """A file name in the folder itself (no separators, no '..', not hidden) with an engine suffix."""
    return (isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name and "\x00" not in name
            and not name.startswith(".") and Path(name).suffix.lower() in ENGINE_SUFFIXES)


def read_manifest(path: Path) -> tuple[Manifest, Optional[str]]:
    """The manifest of an engine folder, or of the folder of one engine file (then also that file's name)."""
    path = Path(path)
    selected = None
    if not path.is_dir():
        selected = path.name
        path = path.parent
    mpath = path / MANIFEST_NAME
    rebuild = "rebuild it with `python -m turbovae build-engines --vae <checkpoint> --out <folder> ... --overwrite`"
    if not mpath.is_file():
        old = " (its engines have the per-file identities of an older TurboVAE)" if any(
            p.name.endswith(tuple(s + ".json" for s in ENGINE_SUFFIXES)) for p in path.iterdir()) else ""
        raise ManifestError(f"{path}: no {MANIFEST_NAME}{old}; an engine folder is loaded only when a finished "
                            f"build wrote its manifest — {rebuild}")
    try:
        if mpath.stat().st_size > MAX_MANIFEST_BYTES:
            raise ManifestError(f"{mpath}: {mpath.stat().st_size} bytes, not an engine manifest; {rebuild}")
        data = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ManifestError(f"{mpath}: unreadable ({type(e).__name__}: {e}); {rebuild}") from e
    manifest = Manifest(path, _entries(data, mpath, rebuild), _options(data, mpath, rebuild))
    return manifest, selected


def recorded_source(folder: Path) -> Optional[str]:
    """The checkpoint path a manifest records, read leniently (first engine's `source`, if a string), so the
    PyTorch fallback still works when the rest of the manifest is edited or damaged; None otherwise."""
    try:
        data = json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8"))
        source = data["engines"][0]["identity"]["source"]
    except (OSError, UnicodeDecodeError, ValueError, RecursionError, KeyError, IndexError, TypeError):
        return None
    return source if isinstance(source, str) and source else None


def _entries(data: object, mpath: Path, rebuild: str) -> tuple[ManifestEntry, ...]:
    if not isinstance(data, dict) or data.get("manifest_version") != MANIFEST_VERSION:
        version = data.get("manifest_version") if isinstance(data, dict) else None
        raise ManifestError(f"{mpath}: manifest version {version!r}, this TurboVAE reads {MANIFEST_VERSION}; {rebuild}")
    engines = data.get("engines")
    if not isinstance(engines, list) or not engines:
        raise ManifestError(f"{mpath}: lists no engines; {rebuild}")
    out, seen = [], set()
    for i, item in enumerate(engines):
        if not isinstance(item, dict) or set(item) != {"file", "identity"}:
            raise ManifestError(f"{mpath}: engine #{i} must have exactly 'file' and 'identity'; {rebuild}")
        name = item["file"]
        if not is_plain_engine_name(name):
            raise ManifestError(f"{mpath}: engine #{i} file {name!r} is not a plain engine file name in this folder "
                                f"(paths and '..' are refused); {rebuild}")
        if name in seen:
            raise ManifestError(f"{mpath}: {name} is listed twice; {rebuild}")
        seen.add(name)
        out.append(ManifestEntry(name, EngineIdentity.from_dict(item["identity"], f"{mpath} ({name})")))
    return tuple(out)


def _options(data: dict, mpath: Path, rebuild: str) -> dict:
    options = data.get("options", {})
    if not isinstance(options, dict) or not all(isinstance(v, bool) for v in options.values()) \
            or not set(options) <= {"pad_to_bucket"}:
        raise ManifestError(f"{mpath}: 'options' must be an object of known switches (pad_to_bucket); {rebuild}")
    return dict(options)
