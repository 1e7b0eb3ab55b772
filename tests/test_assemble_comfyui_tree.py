"""scripts/assemble_comfyui_tree.py on toy trees: newer files win, the base is untouched, TREE.md names
every placed file's source, and bad inputs are refused with the fix in the message."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "assemble_comfyui_tree.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("assemble_comfyui_tree", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


assembler = _load_script()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def trees(tmp_path: Path):
    base = tmp_path / "base"
    write(base / "comfyui_version.py", '__version__ = "0.8.0"\n')
    write(base / "comfy" / "sd.py", "BASE_SD = True\n")
    write(base / "comfy" / "ops.py", "BASE_OPS = True\n")
    base.joinpath("comfy", "sd.py").chmod(0o444)  # a read-only base still gives a writable tree
    newer = tmp_path / "newer"
    write(newer / "comfy" / "sd.py", "NEWER_SD = True\n")
    write(newer / "comfy" / "ldm" / "seedvr" / "vae.py", "SEEDVR = True\n")
    write(newer / assembler.MANIFEST_NAME, json.dumps({"files": {
        "comfy/sd.py": {"repo": "owner/ComfyUI", "commit": "abc123", "note": "glue"},
        "comfy/ldm/seedvr/vae.py": {"repo": "other/ComfyUI", "commit": "def456"},
    }}))
    return base, newer, tmp_path / "out"


def test_newer_files_are_placed_over_a_copy_and_recorded(trees):
    base, newer, out = trees
    placed = assembler.assemble(base, [newer], out, base_note="release tarball")
    assert (out / "comfy" / "sd.py").read_text() == "NEWER_SD = True\n"
    assert (out / "comfy" / "ldm" / "seedvr" / "vae.py").read_text() == "SEEDVR = True\n"
    assert (out / "comfy" / "ops.py").read_text() == "BASE_OPS = True\n"
    assert (base / "comfy" / "sd.py").read_text() == "BASE_SD = True\n", "the base tree must not change"
    assert {(p.relative_path, p.replaced_base_file) for p in placed} == {
        ("comfy/sd.py", True), ("comfy/ldm/seedvr/vae.py", False)}
    note = (out / assembler.TREE_NOTE_NAME).read_text()
    assert "ComfyUI 0.8.0" in note and "release tarball" in note
    assert "| comfy/sd.py | owner/ComfyUI | abc123 | yes | glue |" in note
    assert "| comfy/ldm/seedvr/vae.py | other/ComfyUI | def456 | no (new) |" in note
    assert not out.with_name("out.partial").exists()


def test_an_existing_output_is_never_overwritten(trees):
    base, newer, out = trees
    out.mkdir()
    with pytest.raises(assembler.AssemblyError, match="never overwritten"):
        assembler.assemble(base, [newer], out)


def test_a_file_without_a_source_entry_is_refused(trees):
    base, newer, out = trees
    write(newer / "nodes.py", "UNLISTED = True\n")
    with pytest.raises(assembler.AssemblyError, match=r"files without an entry \['nodes.py'\]"):
        assembler.assemble(base, [newer], out)
    assert not out.exists()


def test_a_folder_without_a_manifest_or_a_base_without_a_version_is_refused(trees, tmp_path):
    base, newer, out = trees
    (newer / assembler.MANIFEST_NAME).unlink()
    with pytest.raises(assembler.AssemblyError, match="SOURCES.json"):
        assembler.assemble(base, [newer], out)
    with pytest.raises(assembler.AssemblyError, match="comfyui_version.py"):
        assembler.assemble(tmp_path / "newer", [], out)


def test_the_command_line_reports_bad_input_without_a_traceback(trees, capsys):
    base, newer, out = trees
    assert assembler.main(["--base", str(base), "--newer", str(newer), "--out", str(out)]) == 0
    assert assembler.main(["--base", str(base), "--newer", str(newer), "--out", str(out)]) == 2
    assert "never overwritten" in capsys.readouterr().err
    assert assembler.main(["--base", str(base), "--out", str(out) + "2", "--check-vae", "wan2.1"]) == 2


def _git(repo: Path, *args: str) -> str:
    import subprocess

    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(repo), "PATH": __import__("os").environ["PATH"]}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture
def git_base(tmp_path: Path):
    """A git repository of a toy core with two commits (0.33.0 then 0.34.0), an executable, a symlink and a
    large file whose blob is then deleted, as a partial mirror lacks it."""
    pytest.importorskip("shutil").which("git") or pytest.skip("git is not installed")
    repo = tmp_path / "core"
    write(repo / "comfyui_version.py", '__version__ = "0.33.0"\n')
    write(repo / "comfy" / "sd.py", "BASE_SD = 33\n")
    _git(repo.parent, "init", "-q", str(repo))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "0.33.0")
    first = _git(repo, "rev-parse", "HEAD").strip()
    write(repo / "comfyui_version.py", '__version__ = "0.34.0"\n')
    write(repo / "main.py", "#!/usr/bin/env python\n")
    (repo / "main.py").chmod(0o755)
    (repo / "link.py").symlink_to("main.py")
    write(repo / "comfy" / "tokenizer.json", "{}" * 1000)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "0.34.0")
    blob = _git(repo, "rev-parse", "HEAD:comfy/tokenizer.json").strip()
    (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()  # loose objects: the blob is gone
    return repo, first


def test_a_git_commit_as_the_base_is_written_exactly(git_base, tmp_path):
    repo, first = git_base
    out = tmp_path / "tree"
    assembler.assemble(repo, [], out, base_note="upstream master", base_commit="HEAD")
    assert (out / "comfyui_version.py").read_text() == '__version__ = "0.34.0"\n'
    assert (out / "comfy" / "sd.py").read_text() == "BASE_SD = 33\n"
    assert (out / "main.py").stat().st_mode & 0o111 and (out / "link.py").is_symlink()
    assert not (out / "comfy" / "tokenizer.json").exists(), "a file without its contents is left out, not written"
    assert not (out / ".git").exists()
    note = (out / assembler.TREE_NOTE_NAME).read_text()
    head = _git(repo, "rev-parse", "HEAD").strip()
    assert "ComfyUI 0.34.0" in note and f"git commit {head}" in note and "upstream master" in note
    assert "`comfy/tokenizer.json`" in note
    older = tmp_path / "older"
    assembler.assemble(repo, [], older, base_commit=first[:10])
    assert (older / "comfyui_version.py").read_text() == '__version__ = "0.33.0"\n' and not (older / "main.py").exists()


def test_a_git_base_without_that_commit_is_refused(git_base, tmp_path, capsys):
    repo, _ = git_base
    with pytest.raises(assembler.AssemblyError, match="has no commit 'deadbeef'"):
        assembler.assemble(repo, [], tmp_path / "tree", base_commit="deadbeef")
    assert not (tmp_path / "tree").exists()
    assert assembler.main(["--base", str(repo), "--base-commit", "nope", "--out", str(tmp_path / "t2")]) == 2
    assert "--base-commit" in capsys.readouterr().err
