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
