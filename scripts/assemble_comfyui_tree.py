#!/usr/bin/env python3
"""Assemble a test ComfyUI tree: a released ComfyUI tree with newer core files placed over it.

Why: the real-server tests (tests/test_nodes_comfyui.py) and the core bench rows should run against the
ComfyUI users run now, but the newest core that matters to us (the native SeedVR2 VAE and nodes, the 2026
Wan VAE) may exist only as files of a newer or unreleased core. This script builds such a tree at run time,
outside the repository, from two inputs the user supplies:

    BASE     a ComfyUI tree (e.g. a release checkout); it is copied, never modified
    NEWER    one or more folders of newer core files laid out with ComfyUI's relative paths, each with a
             SOURCES.json manifest: {"files": {"<relative path>": {"repo": ..., "commit": ..., "note": ...}}}

and writes OUT (which must not exist): BASE copied, each NEWER folder's files placed over it in order, and
OUT/TREE.md saying where every file came from. No ComfyUI code is in this repository; the script only copies.

    python scripts/assemble_comfyui_tree.py --base /path/to/ComfyUI --newer /path/to/newer-files --out /path/to/tree

BASE may also be one commit of a git repository (`--base /path/to/repo.git --base-commit SHA`), e.g. a mirror
whose history holds a newer upstream commit than any release tree at hand: the commit's tree is written out
file by file (no work tree or checkout needed), so the tree is exactly that commit. A mirror may lack some large
blobs; those files are left out (never written half) and TREE.md lists them.

With --check it then imports the assembled tree in a child interpreter (default: the running one;
--python picks another, e.g. the venv the real-server tests use) and prints what comfy.sd.VAE builds for
each kind of state dict named by --check-vae KIND=FILE (safetensors files), and that every module named by
--check-module imports; on success it writes OUT/READY.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MANIFEST_NAME = "SOURCES.json"
TREE_NOTE_NAME = "TREE.md"
READY_NAME = "READY"


class AssemblyError(Exception):
    """A bad input to the assembly, with the fix in the message."""


@dataclass(frozen=True)
class PlacedFile:
    """One newer file placed into the tree and where it came from."""

    relative_path: str
    repo: str
    commit: str
    note: str
    replaced_base_file: bool


def read_manifest(newer_dir: Path) -> dict[str, dict[str, str]]:
    """The per-file sources of one newer-files folder; every file in the folder must have an entry."""
    manifest_path = newer_dir / MANIFEST_NAME
    if not manifest_path.is_file():
        raise AssemblyError(f"{newer_dir} has no {MANIFEST_NAME}; write one listing each file's repo and commit")
    try:
        files = json.loads(manifest_path.read_text())["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise AssemblyError(f"{manifest_path} is not {{\"files\": {{path: {{repo, commit}}}}}}: {exc}") from exc
    on_disk = {p.relative_to(newer_dir).as_posix() for p in newer_dir.rglob("*")
               if p.is_file() and p.name != MANIFEST_NAME}
    missing_entries = sorted(on_disk - set(files))
    missing_files = sorted(set(files) - on_disk)
    if missing_entries or missing_files:
        raise AssemblyError(
            f"{manifest_path} and the folder disagree: files without an entry {missing_entries}, "
            f"entries without a file {missing_files}")
    for rel, source in files.items():
        if not isinstance(source, dict) or not source.get("repo"):
            raise AssemblyError(f"{manifest_path}: entry {rel!r} needs at least a 'repo'")
    return files


def base_version(base: Path) -> str:
    """The base tree's version string as its comfyui_version.py declares it (read as text, not imported)."""
    version_file = base / "comfyui_version.py"
    if not version_file.is_file():
        raise AssemblyError(f"{base} has no comfyui_version.py; pass a ComfyUI tree as --base")
    for line in version_file.read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise AssemblyError(f"{version_file} declares no __version__")


def _git(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    """Run git on `repo` (a bare mirror or a work tree); a failure is an AssemblyError with git's message."""
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, check=False)
    except FileNotFoundError as exc:
        raise AssemblyError("git is not installed; install it or pass a ComfyUI tree as --base") from exc
    if done.returncode != 0:
        raise AssemblyError(f"git {' '.join(args[:2])} in {repo} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def resolve_commit(repo: Path, commit: str) -> str:
    """The full hash of `commit` in `repo`, or an AssemblyError naming what to pass."""
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").decode().strip()
    except AssemblyError:
        raise AssemblyError(f"{repo} has no commit {commit!r}; pass --base-commit with a commit of that repository "
                            "(git -C REPO log --oneline)") from None


def git_base_version(repo: Path, commit: str) -> str:
    """The version a commit's comfyui_version.py declares (read from git, not imported)."""
    try:
        text = _git(repo, "show", f"{commit}:comfyui_version.py").decode()
    except AssemblyError:
        raise AssemblyError(f"commit {commit} of {repo} has no comfyui_version.py; pass a ComfyUI commit") from None
    for line in text.splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise AssemblyError(f"comfyui_version.py of {commit} declares no __version__")


def export_commit(repo: Path, commit: str, dest: Path) -> list[str]:
    """Write the tree of `commit` into `dest` (files, executable bits, symlinks); return the paths whose blobs
    the repository lacks (a mirror may hold only part of the objects), which are not written."""
    listing = _git(repo, "ls-tree", "-r", "-z", "--full-tree", commit).split(b"\0")
    entries = []  # (mode, sha, path)
    for item in filter(None, listing):
        meta, path = item.split(b"\t", 1)
        mode, kind, sha = meta.split()
        if kind == b"blob":
            entries.append((mode.decode(), sha.decode(), path.decode()))
    # one `cat-file --batch` for all blobs: '<sha> blob <size>\n<bytes>\n' or '<sha> missing\n' per request
    stream = _git(repo, "cat-file", "--batch", stdin="".join(f"{sha}\n" for _m, sha, _p in entries).encode())
    missing, pos = [], 0
    for mode, sha, rel in entries:
        header_end = stream.index(b"\n", pos)
        header = stream[pos:header_end].split()
        pos = header_end + 1
        if header[1:] == [b"missing"]:
            missing.append(rel)
            continue
        size = int(header[2])
        data, pos = stream[pos:pos + size], pos + size + 1
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == "120000":
            os.symlink(data.decode(), target)
        else:
            target.write_bytes(data)
            if mode == "100755":
                target.chmod(0o755)
    return missing


def assemble(base: Path, newer_dirs: list[Path], out: Path, base_note: str = "",
             base_commit: str | None = None) -> list[PlacedFile]:
    """Copy base (a tree, or with `base_commit` that commit of the git repository `base`) to out and place each
    newer folder's files over it; return what was placed."""
    if out.exists():
        raise AssemblyError(f"{out} exists; pick a new --out (an assembled tree is never overwritten)")
    manifests = [(d, read_manifest(d)) for d in newer_dirs]
    if base_commit is not None:
        base_commit = resolve_commit(base, base_commit)
        version = git_base_version(base, base_commit)
    else:
        version = base_version(base)
    staging = out.with_name(out.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    missing: list[str] = []
    if base_commit is not None:
        staging.mkdir(parents=True)
        missing = export_commit(base, base_commit, staging)
        base_note = "; ".join(filter(None, [f"git commit {base_commit} of `{base}`", base_note]))
    else:
        shutil.copytree(base, staging, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", ".git"))
        for path in staging.rglob("*"):  # a read-only base must give a writable copy
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o200)
    placed: list[PlacedFile] = []
    for newer_dir, files in manifests:
        for rel, source in sorted(files.items()):
            target = staging / rel
            existed = target.exists()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(newer_dir / rel, target)
            placed.append(PlacedFile(rel, source["repo"], source.get("commit", "unknown"),
                                     source.get("note", ""), existed))
    (staging / TREE_NOTE_NAME).write_text(tree_note(base, version, newer_dirs, placed, base_note, missing))
    staging.rename(out)
    return placed


def tree_note(base: Path, version: str, newer_dirs: list[Path], placed: list[PlacedFile], base_note: str = "",
              missing: list[str] = ()) -> str:
    """TREE.md: the base, the base files it lacks and, per placed file, its source repository and commit."""
    lines = [
        "# Assembled ComfyUI test tree",
        "",
        f"Built by scripts/assemble_comfyui_tree.py from base `{base}` (ComfyUI {version})"
        + (" and newer files from " + ", ".join(f"`{d}`" for d in newer_dirs) if newer_dirs else ", no newer files")
        + ".",
        *([f"Base: {base_note}"] if base_note else []),
        *([f"Not in this tree (the base repository lacks their contents): {', '.join(f'`{m}`' for m in missing)}"]
          if missing else []),
        "Every file not listed below is the base tree's.",
        "",
        "| file | repo | commit | replaced base file | note |",
        "| --- | --- | --- | --- | --- |",
    ]
    for item in placed:
        lines.append(f"| {item.relative_path} | {item.repo} | {item.commit} | "
                     f"{'yes' if item.replaced_base_file else 'no (new)'} | {item.note} |")
    return "\n".join(lines) + "\n"


CHECK_SNIPPET = r"""
import importlib, json, sys
sys.argv = [sys.argv[0], "--cpu"]
tree, modules, vaes = sys.argv_payload
sys.path.insert(0, tree)
import comfy.options
comfy.options.enable_args_parsing()
import comfy.sd, comfy.utils
from importlib import metadata
for dist in ("torch", "comfyui-frontend-package", "comfy-aimdo", "comfy-kitchen"):
    try:
        print(f"package: {dist} {metadata.version(dist)}")
    except metadata.PackageNotFoundError:
        print(f"package: {dist} not installed")
for name in modules:
    importlib.import_module(name)
    print(f"import ok: {name}")
for kind, path in vaes:
    sd, metadata = comfy.utils.load_torch_file(path, return_metadata=True)
    vae = comfy.sd.VAE(sd=sd, metadata=metadata)
    model = vae.first_stage_model
    print(f"VAE ok: {kind}: {type(model).__module__}.{type(model).__name__} latent_channels={vae.latent_channels}")
"""


def check_tree(out: Path, python: str, modules: list[str], vae_files: list[tuple[str, str]]) -> str:
    """Import the assembled tree in a child interpreter; return its report or raise with its stderr."""
    payload = json.dumps([str(out), modules, vae_files])
    code = f"import sys, json\nsys.argv_payload = json.loads({payload!r})\n" + CHECK_SNIPPET
    result = subprocess.run([python, "-c", code], cwd=out, capture_output=True, text=True)
    if result.returncode != 0:
        raise AssemblyError(f"the assembled tree {out} did not import:\n{result.stdout}\n{result.stderr[-4000:]}")
    return result.stdout


def parse_vae_spec(spec: str) -> tuple[str, str]:
    """KIND=FILE from --check-vae."""
    kind, sep, path = spec.partition("=")
    if not sep or not kind or not Path(path).is_file():
        raise AssemblyError(f"--check-vae {spec!r}: give KIND=FILE with an existing safetensors file")
    return kind, path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True,
                        help="a ComfyUI tree (copied, not modified), or a git repository with --base-commit")
    parser.add_argument("--base-commit", default=None,
                        help="write this commit of the --base git repository as the base tree")
    parser.add_argument("--newer", type=Path, action="append", default=[],
                        help="a folder of newer core files with SOURCES.json (repeatable; later ones win)")
    parser.add_argument("--out", type=Path, required=True, help="where to build the tree (must not exist)")
    parser.add_argument("--base-note", default="", help="where the base tree came from (written to TREE.md)")
    parser.add_argument("--check", action="store_true", help="import the tree afterwards and write READY")
    parser.add_argument("--python", default=sys.executable, help="interpreter for --check")
    parser.add_argument("--check-module", action="append", default=[], help="a module that must import")
    parser.add_argument("--check-vae", action="append", default=[], help="KIND=FILE for comfy.sd.VAE(sd=...)")
    args = parser.parse_args(argv)
    try:
        vae_files = [parse_vae_spec(s) for s in args.check_vae]
        placed = assemble(args.base.resolve(), [d.resolve() for d in args.newer], args.out.resolve(), args.base_note,
                          base_commit=args.base_commit)
        print(f"assembled {args.out}: {len(placed)} newer files over {args.base}")
        if args.check:
            print(check_tree(args.out.resolve(), args.python, args.check_module, vae_files), end="")
            (args.out / READY_NAME).touch()
            print(f"wrote {args.out / READY_NAME}")
    except AssemblyError as exc:
        print(f"assemble_comfyui_tree: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
