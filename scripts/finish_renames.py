"""Issue 42, items 1-2, run once on the merged main: no aliases, and the design card's layout (`trt/`, not
`engines/`). Idempotent: a second run changes nothing. Prints every file it removes, moves or rewrites.

    python scripts/finish_renames.py [--dry-run]

What it does, in order:
1. removes every deprecation shim (files marked `turbovae-deprecated-alias`, except this list's keepers), the
   finder that served them (vae/deprecation.py), their test (tests/test_deprecated_aliases.py), the
   `MemoryModel` alias in vae/base.py and vae/architectures.py (its `detect_architecture` comes from
   vae/checkpoint.py, where it is defined);
2. moves the engine package `engines/` to `trt/` (after removing the `trt/` alias) and rewrites what names it:
   `turbovae.engines` and relative `from ..engines` imports, module paths `engines.<module>` and folder paths
   `engines/` in code, tests and docs (results files and CHANGELOG history are left as they were written);
3. sets the version to 0.3.0 (pyproject.toml, __init__.py).
The CHANGELOG entry listing each removed path and its replacement is written by hand beside this script's run.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = "turbovae-deprecated-alias"
KEEP_MARKED = {"vae/base.py"}  # holds an alias among real code: edited, not removed
ALSO_REMOVE = ["vae/deprecation.py", "tests/test_deprecated_aliases.py", "vae/architectures.py"]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".txt", ".json", ".yaml", ".yml", ".cfg", ""}
LEAVE_TEXT = ("docs/results/", "CHANGELOG.md", "scripts/finish_renames.py")
VERSION = "0.3.0"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def tracked() -> list[str]:
    return [p for p in git("ls-files").splitlines() if (ROOT / p).is_file()]


def remove(path: str, dry: bool) -> None:
    if (ROOT / path).exists():
        print(f"remove {path}")
        if not dry:
            git("rm", "-q", "-r", path)


def shims() -> list[str]:
    found = []
    for p in tracked():
        if not p.endswith(".py") or p in KEEP_MARKED or p.startswith("tests/") or p == "scripts/finish_renames.py":
            continue
        head = (ROOT / p).read_text(errors="replace")[:400]
        if MARK in head:
            found.append(p)
    return found


def drop_base_alias(dry: bool) -> None:
    path = ROOT / "vae" / "base.py"
    text = path.read_text()
    start = text.find('_OLD_WORKING_SET_NAME = "MemoryModel"')
    if start < 0:
        return
    end = text.find('raise AttributeError(f"module {__name__!r} has no attribute {name!r}")', start)
    end = text.index("\n", end) + 1
    print("edit vae/base.py: the MemoryModel alias (module __getattr__) removed")
    rest = text[end:].strip("\n")
    if not dry:
        path.write_text(text[:start].rstrip("\n") + "\n" + ("\n\n" + rest + "\n" if rest else ""))


def engine_modules() -> list[str]:
    folder = ROOT / ("engines" if (ROOT / "engines").is_dir() else "trt")
    return sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")


def rewrite_text(text: str, modules: list[str], depth: int = 0) -> str:
    """`depth`: how many packages below the top the file sits (bench/x.py: 1), so a relative import reaches the
    top-level `engines` only with depth + 1 dots (bench's own `from .engines` is bench/engines.py, left alone)."""
    dots = r"\." * (depth + 1)
    text = re.sub(r"(?<![\w.])turbovae\.engines\b", "turbovae.trt", text)
    text = re.sub(r"(from " + dots + r")engines\b", r"\1trt", text)
    text = re.sub(r"(?<![\w./-])engines\.(" + "|".join(map(re.escape, modules)) + r")\b", r"trt.\1", text)
    text = re.sub(r"(?<![\w./-])engines/", "trt/", text)
    text = text.replace('root / "engines" / "cli.py"', 'root / "trt" / "cli.py"')
    text = text.replace('from .architectures import detect_architecture', 'from .checkpoint import detect_architecture')
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true")
    dry = ap.parse_args(argv).dry_run
    # 1. aliases
    for p in shims():
        if p == "trt/__init__.py" and not (ROOT / "engines").is_dir():
            continue  # already moved: trt/__init__.py is the real package now
        remove(p, dry)
    for p in ALSO_REMOVE:
        remove(p, dry)
    drop_base_alias(dry)
    for folder in (ROOT / "vae" / "kernels", ROOT / "trt"):  # emptied packages: only caches left in them
        if folder.name == "trt" and not (ROOT / "engines").is_dir():
            continue  # already moved: trt/ is the engine package
        if folder.is_dir() and not any(folder.rglob("*.py")):
            print(f"remove {folder.relative_to(ROOT)}/ (no module left)")
            if not dry:
                shutil.rmtree(folder)
    # 2. engines/ -> trt/
    modules = engine_modules()
    if (ROOT / "engines").is_dir():
        print("move engines/ -> trt/")
        if not dry:
            git("mv", "engines", "trt")
    changed = 0
    for p in tracked():
        if p.startswith(LEAVE_TEXT) or Path(p).suffix not in TEXT_SUFFIXES:
            continue
        path = ROOT / p
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        depth = len(Path(p).parts) - 1 if not p.startswith("tests/") else 0
        new = rewrite_text(text, modules, depth) if p.endswith(".py") else rewrite_text(text, modules)
        if new != text:
            changed += 1
            print(f"rewrite {p}")
            if not dry:
                path.write_text(new)
    # 3. version
    for p, pattern in (("pyproject.toml", r'(?m)^version = "[^"]+"'), ("__init__.py", r'(?m)^__version__ = "[^"]+"')):
        path = ROOT / p
        text = path.read_text()
        repl = f'version = "{VERSION}"' if p == "pyproject.toml" else f'__version__ = "{VERSION}"'
        new = re.sub(pattern, repl, text, count=1)
        if new != text:
            print(f"version {VERSION} in {p}")
            if not dry:
                path.write_text(new)
    print(f"{changed} files rewritten" + (" (dry run: nothing written)" if dry else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
