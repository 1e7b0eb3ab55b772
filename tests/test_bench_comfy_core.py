"""`bench --comfyui PATH`: ComfyUI core's VAEs as a baseline row, against a fake ComfyUI tree (no checkout in CI).

tests/fake_comfyui is a folder shaped like a ComfyUI tree whose `comfy.sd.VAE` has core's node-level interface
with TurboVAE's model behind it (its README says why): the adapter's key names, layouts and latent scaling must
reproduce TurboVAE's output through it, and importing it must leave no module of the tree behind.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from turbovae import cli
from turbovae.bench import comfy_core, comfy_profile, report
from turbovae.bench import main as job

FAKE = Path(__file__).parent / "fake_comfyui"
FAKE_LABEL = "ComfyUI core 0.0.0-fake"


def _tree_modules() -> dict[str, object]:
    """Modules under the fake tree's top-level names (other tests' ComfyUI doubles may hold `comfy`)."""
    names = comfy_core.find_tree(FAKE).module_names()
    return {n: m for n, m in sys.modules.items() if n.partition(".")[0] in names}


def _copy_fake(tmp_path: Path) -> Path:
    tree = tmp_path / "ComfyUI"
    shutil.copytree(FAKE, tree)
    return tree


def test_the_fake_is_shaped_like_a_comfyui_tree():
    assert (FAKE / "comfy" / "sd.py").is_file() and not (FAKE / "comfy" / "__init__.py").exists()
    assert comfy_core.find_tree(FAKE).module_names() == {"comfy", "comfyui_version", "utils"}


def test_find_tree_names_version_commit_or_assembly(tmp_path):
    tree = comfy_core.find_tree(FAKE)
    assert (tree.version, tree.commit, tree.label) == ("0.0.0-fake", None, FAKE_LABEL)
    copy = _copy_fake(tmp_path)
    (copy / comfy_core.ASSEMBLED_NOTE).write_text("# Assembled ComfyUI test tree\n")
    assert comfy_core.find_tree(copy).label == FAKE_LABEL + " (assembled tree)"
    if shutil.which("git"):
        git = ["git", "-C", str(copy), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run(git + ["init", "-q"], check=True)
        subprocess.run(git + ["add", "-A"], check=True)
        subprocess.run(git + ["commit", "-qm", "tree"], check=True)
        head = subprocess.run(git + ["rev-parse", "--short=8", "HEAD"], capture_output=True, text=True).stdout.strip()
        assert comfy_core.find_tree(copy).label == f"{FAKE_LABEL} ({head})"


def test_a_folder_without_comfy_is_refused_with_the_fix(tmp_path):
    with pytest.raises(comfy_core.ComfyUIUnusable, match="no comfy/sd.py"):
        comfy_core.find_tree(tmp_path)


def test_the_session_imports_the_tree_and_leaves_nothing_behind(tmp_path, monkeypatch):
    """A `comfy` already imported (the node tests' doubles, or the ComfyUI we run in) and a regular `comfy`
    package earlier on sys.path must neither be used nor lost; the tree's modules must not outlive the block."""
    stand_in = types.ModuleType("comfy")
    monkeypatch.setitem(sys.modules, "comfy", stand_in)
    decoy = tmp_path / "decoy"
    (decoy / "comfy").mkdir(parents=True)
    (decoy / "comfy" / "__init__.py").write_text("")
    (decoy / "comfy" / "sd.py").write_text("raise ImportError('the decoy comfy was imported')\n")
    monkeypatch.syspath_prepend(str(decoy))
    path_before, meta_before, modules_before = list(sys.path), list(sys.meta_path), _tree_modules()
    tree = comfy_core.find_tree(FAKE)
    with comfy_core.session(tree, torch.device("cpu")):
        sd = sys.modules["comfy.sd"]
        assert Path(sd.__file__).resolve() == FAKE.resolve() / "comfy" / "sd.py"
        assert sd.CPU_FLAG_AT_IMPORT is True  # as `main.py --cpu` sets it before model management loads
        import utils

        assert utils.FROM_FAKE_COMFYUI
    assert sys.modules["comfy"] is stand_in
    assert _tree_modules() == modules_before
    assert sys.path == path_before and sys.meta_path == meta_before


def test_the_session_cleans_up_after_an_error_inside_it():
    before = _tree_modules()
    with pytest.raises(RuntimeError, match="boom"):
        with comfy_core.session(comfy_core.find_tree(FAKE), torch.device("cpu")):
            raise RuntimeError("boom")
    assert _tree_modules() == before


def test_a_tree_that_cannot_be_imported_names_its_requirements(tmp_path):
    tree = _copy_fake(tmp_path)
    (tree / "comfy" / "sd.py").write_text("import a_package_comfyui_needs_but_is_missing\n")
    before = _tree_modules()
    with pytest.raises(comfy_core.ComfyUIUnusable, match="requirements.txt"):
        with comfy_core.session(comfy_core.find_tree(tree), torch.device("cpu")):
            pass
    assert _tree_modules() == before


def _run_job(tmp_path: Path, tree: Path, capsys) -> tuple[list[dict], str, str]:
    out = tmp_path / "bench.json"
    code = cli.main(["bench", "--quick", "--repeat", "1", "--device", "cpu", "--comfyui", str(tree), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads(out.read_text())
    assert data["complete"] and data["environment"]["comfyui"] == comfy_core.find_tree(tree).label
    return data["rows"], captured.out, captured.err


@pytest.mark.slow
def test_the_job_adds_a_core_row_equal_to_ours(tmp_path, capsys):
    before = _tree_modules()
    rows, out, err = _run_job(tmp_path, FAKE, capsys)
    assert "--comfyui /path" not in err  # the hint is for runs without core rows
    for case in job.SMOKE_CASES:
        case_rows = [r for r in rows if r["case"] == case.name]
        if case.family not in comfy_core.CORE_FAMILIES:
            assert [r["variant"] for r in case_rows][1:] != [FAKE_LABEL] and len(case_rows) == 2
            continue
        ref, core, ours = case_rows
        assert (ref["reference"], core["variant"], ours["variant"]) == (True, FAKE_LABEL, "turbovae")
        # the fake runs our model behind core's interface: the conversions must round-trip exactly
        assert core["err_vs_ours"] < 1e-5 and core["max_abs_err"] < 1e-4, case.name
        assert ref["core_ms"] == ours["core_ms"] == core["ms"] and core["core_ms"] is None
        assert core["peak_mb"] is not None
    assert "vs ComfyUI core" in out and "core err vs turbovae" in out and FAKE_LABEL in out
    assert _tree_modules() == before


@pytest.mark.slow
def test_a_core_without_a_family_runs_those_cases_without_a_core_row(tmp_path, capsys):
    tree = _copy_fake(tmp_path)
    (tree / "comfy" / "features.py").write_text("KNOWS_SEEDVR2 = False\nTINY_CONFIGS = True\n")
    rows, _, err = _run_job(tmp_path, tree, capsys)
    seedvr2 = [r for r in rows if r["case"].startswith("SeedVR2")]
    assert [r["variant"] for r in seedvr2] == [job.SEEDVR2_REFERENCE, "turbovae"]
    assert "has no seedvr2 VAE" in err
    assert sum(r["variant"] == FAKE_LABEL for r in rows) == 2  # the two Wan-family cases


@pytest.mark.slow
def test_weights_core_cannot_load_give_a_note_not_a_traceback(tmp_path, capsys):
    """Core's loader builds the released configurations only, so --quick's tiny weights fail to load in it."""
    tree = _copy_fake(tmp_path)
    (tree / "comfy" / "features.py").write_text("KNOWS_SEEDVR2 = True\nTINY_CONFIGS = False\n")
    rows, _, err = _run_job(tmp_path, tree, capsys)
    assert not any(r["variant"] == FAKE_LABEL for r in rows) and len(rows) == 2 * len(job.SMOKE_CASES)
    assert err.count("could not load these") == 3 and "size mismatch" in err


def test_cli_refuses_a_folder_that_is_not_comfyui(tmp_path, capsys):
    assert cli.main(["bench", "--quick", "--comfyui", str(tmp_path), "--out", str(tmp_path / "b.json")]) == 2
    assert "not a ComfyUI tree" in capsys.readouterr().err
    assert cli.main(["bench", "--sections", "qwen", "--comfyui", str(FAKE), "--out", str(tmp_path / "b.json")]) == 2
    assert "default job" in capsys.readouterr().err


def test_with_comfyui_the_full_job_adds_the_seedvr2_encodes():
    names = [c.name for c in job.cases(job.BenchOptions(comfyui=str(FAKE)))]
    assert names == [c.name for c in job.CPU_CASES + job.CORE_CPU_CASES]
    assert {c.kind for c in job.CORE_CPU_CASES} == {"encode"} and {c.frames for c in job.CORE_CPU_CASES} == {1, 5}


def test_report_shows_the_core_columns_only_with_core_rows():
    ref = dict(case="c", variant="ref", ms=4000.0, baseline_ms=4000.0, speedup=1.0, peak_mb=10.0, max_abs_err=None,
               psnr_db=None, reference=True, core_ms=3000.0)
    core = dict(case="c", variant=FAKE_LABEL, ms=3000.0, baseline_ms=4000.0, speedup=4 / 3, peak_mb=9.0,
                max_abs_err=2e-6, psnr_db=None, reference=False, err_vs_ours=3e-6)
    ours = dict(case="c", variant="ours", ms=1000.0, baseline_ms=4000.0, speedup=4.0, peak_mb=5.0, max_abs_err=1e-6,
                psnr_db=None, reference=False, core_ms=3000.0)
    md = report.format_markdown([ref, core, ours]).splitlines()
    assert md[0].endswith("| vs ComfyUI core | core err vs turbovae |")
    assert md[3] == f"| c | {FAKE_LABEL} | 3.00 s | 1.33x | 9 |  | 2.0e-06 |  |  | 3.0e-06 |"
    assert md[4] == "| c | ours | 1.00 s | 4.00x | 5 |  | 1.0e-06 |  | 3.00x |  |"
    plain = report.format_markdown([dict(ref, core_ms=None), dict(ours, core_ms=None)])
    assert "ComfyUI core" not in plain


def test_the_profile_prints_an_operator_table_per_side(capsys):
    assert comfy_profile.main(["--comfyui", str(FAKE), "--quick", "--cases", "SeedVR2", "--rows", "5"]) == 0
    out = capsys.readouterr().out
    case = next(c.name for c in job.SMOKE_CASES if c.family == "seedvr2")
    for side in (job.SEEDVR2_REFERENCE, FAKE_LABEL, "turbovae"):
        assert f"== {case}: {side}" in out
    assert out.count("Self CPU time total") == 3 and "aten::" in out
    assert comfy_profile.main(["--comfyui", str(FAKE), "--quick", "--cases", "exact tiles"]) == 2


def _tree_needing_av(tmp_path: Path) -> Path:
    """The fake tree with core's habit of importing a video package at import time (a VAE never calls it)."""
    tree = _copy_fake(tmp_path)
    sd = tree / "comfy" / "sd.py"
    sd.write_text("import av\nimport av.video.frame\n\n\nclass VideoInput(av.container.InputContainer):\n"
                  "    frame: av.VideoFrame = None\n\n\n" + sd.read_text())
    return tree


def test_stubbed_packages_let_core_import_and_are_named_then_dropped(tmp_path):
    pytest.importorskip("torch")
    if "av" in sys.modules or __import__("importlib").util.find_spec("av") is not None:
        pytest.skip("this Python has `av`: the stub is never used (a real package always wins)")
    tree = comfy_core.find_tree(_tree_needing_av(tmp_path))
    before = _tree_modules()
    with pytest.raises(comfy_core.ComfyUIUnusable, match="requirements.txt"):  # without the stub: the fix is named
        with comfy_core.session(tree, torch.device("cpu")):
            pass
    with comfy_core.session(tree, torch.device("cpu"), stubs=("av", "another_absent_pkg")) as core:
        assert core.stubbed == ("av",)  # only what core imported
        assert core.note == "core imported with av stubbed (never called by a VAE)"
        import av

        with pytest.raises(comfy_core.StubbedCall, match="carry the real package"):
            av.open("clip.mp4")
    assert "av" not in sys.modules and "av.video.frame" not in sys.modules
    assert _tree_modules() == before
    with pytest.raises(ValueError, match="top-level package names"):
        with comfy_core.session(tree, torch.device("cpu"), stubs=("av.video",)):
            pass


def test_the_job_with_a_stub_says_so_in_the_core_rows(tmp_path, capsys):
    if __import__("importlib").util.find_spec("av") is not None:
        pytest.skip("this Python has `av`: the stub is never used")
    tree = _tree_needing_av(tmp_path)
    out = tmp_path / "bench.json"
    code = cli.main(["bench", "--quick", "--repeat", "1", "--device", "cpu", "--comfyui", str(tree),
                     "--comfyui-stub", "av", "--cases", "Qwen-Image image decode", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = json.loads(out.read_text())["rows"]
    core = [r for r in rows if r["variant"] == FAKE_LABEL]
    assert core and all("av stubbed (never called by a VAE)" in r["note"] for r in core)
    assert all("stubbed" not in r["note"] for r in rows if r["variant"] != FAKE_LABEL)
    assert "av" not in sys.modules


def test_cli_refuses_stubs_without_a_tree_or_with_bad_names(tmp_path, capsys):
    assert cli.main(["bench", "--quick", "--comfyui-stub", "av", "--out", str(tmp_path / "b.json")]) == 2
    assert "add --comfyui PATH" in capsys.readouterr().err
    assert cli.main(["bench", "--quick", "--comfyui", str(FAKE), "--comfyui-stub", "av/x",
                     "--out", str(tmp_path / "b.json")]) == 2
    assert "top-level package names" in capsys.readouterr().err


def test_on_cuda_core_joins_clips_of_at_least_three_latent_frames():
    clips = [c for c in job.CORE_CUDA_CASES if c.kind == "decode" and c.frames > 1]
    assert {c.family for c in clips} == {"wan2.2", "seedvr2"}
    assert all((c.frames - 1) // 4 + 1 >= 3 for c in clips)  # 4x temporal compression, first frame alone
    wan21_clip = [c for c in job.CUDA_CASES if c.family == "qwen_image" and c.frames > 1]
    assert wan21_clip and all((c.frames - 1) // 4 + 1 >= 3 for c in wan21_clip)
