"""A VAE family is one registry entry (vae/registry.py): registering the toy family (tests/engines_toy.py) in one
place makes it appear everywhere a family is listed, and no module keeps a hand-written family list."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
import torch

import turbovae
from turbovae import cli
from turbovae.bench import main as job
from turbovae.bench.common import BenchOptions
from turbovae.vae import doctor, registry
from turbovae.vae.checkpoint import CheckpointError, registered_architectures
from turbovae.vae.parallel import cost

sys.path.insert(0, str(Path(__file__).parent))
from engines_toy import TOY_FAMILY, ToyVAE, save_toy_checkpoint  # noqa: E402

ROOT = Path(turbovae.__file__).resolve().parent


def _everywhere() -> dict[str, bool]:
    """Whether the toy family shows in each place that lists families (read afresh each time)."""
    return {
        "doctor": "toy" in [name for name, _ in doctor._architectures(False)],
        "bench --quick": any(c.family == "toy" for c in job.cases(BenchOptions(quick=True))),
        "loader list": TOY_FAMILY.title in registry.supported_text(),
        "cost model": "toy" in [n for f in registry.families() for n in f.names],
    }


@pytest.mark.slow
def test_the_toy_family_is_one_entry_found_everywhere(tmp_path, capsys):
    before_archs = registered_architectures()
    assert not any(_everywhere().values())
    with registry.registered(TOY_FAMILY):
        assert all(_everywhere().values()), _everywhere()
        # doctor --json lists it (a zero budget skips every micro-bench run, but each family still has its rows)
        out = tmp_path / "doctor.json"
        assert cli.main(["doctor", "--json", "--out", str(out), "--bench-seconds", "0"]) == 0
        rows = [r for r in json.loads(out.read_text())["bench"] if r["architecture"] == "toy"]
        assert [r["direction"] for r in rows] == ["decode", "encode"]
        # the benchmark's --quick job runs its case against its own plain path (no diffusers class)
        res = tmp_path / "bench.json"
        assert cli.main(["bench", "--quick", "--repeat", "1", "--device", "cpu", "--cases", "Toy", "--out",
                         str(res)]) == 0
        bench_rows = json.loads(res.read_text())["rows"]
        assert [r["variant"] for r in bench_rows] == ["plain path (original Toy engine VAE not installable)",
                                                      "turbovae"]
        assert bench_rows[1]["max_abs_err"] == 0.0
        # the cost model knows the family, and says why it cannot split its frames (no exact tiling)
        assert "toy" not in cost.architectures()
        with pytest.raises(ValueError, match="declares no exact tiling"):
            cost.predict("toy", True, "1080p image")
        # the loader's list, its error text, and the engine builder, which starts from a loaded checkpoint
        ckpt = tmp_path / "toy.safetensors"
        save_toy_checkpoint(ckpt)
        vae = turbovae.load_vae(ckpt, device="cpu")
        assert isinstance(vae.model, ToyVAE) and registry.family_of_kind(vae.kind) is TOY_FAMILY
        from turbovae.trt.buckets import Bucket, static_table
        from turbovae.trt.build import image_plan, preflight

        table = static_table(Bucket(64, 64))
        jobs = preflight(tmp_path / "engines", table, backend="aoti", device=torch.device("cpu"))
        plan = image_plan(vae, next(j for j in jobs if j.component == "decoder"), table, torch.float32,
                          torch.device("cpu"), 3)
        assert plan.module is vae.model.decoder
    capsys.readouterr()
    assert not any(_everywhere().values())
    assert registered_architectures() == before_archs  # undone exactly (the toy's own detection stays registered)
    with pytest.raises(registry.UnknownFamily, match="registered: qwen_image"):
        registry.family("toy")


def test_unsupported_file_error_names_the_registered_families(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "other.safetensors"
    save_file({"some.weight": torch.zeros(2)}, str(path))
    with pytest.raises(CheckpointError) as err:
        turbovae.load_vae(path, device="cpu")
    assert registry.supported_text() in str(err.value)
    assert all(f.title in str(err.value) for f in registry.families())


def test_every_family_has_one_config_idiom_and_a_consistent_entry():
    for fam in registry.BUILTIN_FAMILIES:
        real, tiny = fam.real(), fam.tiny()
        assert type(real) is type(tiny) and real != tiny
        model = fam.meta_model(real=True)
        assert model.kind in fam.kinds
        assert registry.family_of_kind(model.kind) is fam
        assert fam.exact_plan(decode=True) is not None  # every built-in family tiles exactly
        assert all(a in registered_architectures() for a in fam.architectures)
    from turbovae.vae.seedvr2 import SeedVR2Config
    from turbovae.vae.wan.config import TINY_WAN21, TINY_WAN22, WAN21, WAN22, WanConfig

    assert SeedVR2Config.real() == SeedVR2Config() and SeedVR2Config.tiny() != SeedVR2Config()

    assert (WanConfig.real(), WanConfig.real("wan2.2"), WanConfig.tiny(), WanConfig.tiny("wan2.2")) == (
        WAN21, WAN22, TINY_WAN21, TINY_WAN22)
    assert registry.core_scales_latents("seedvr2") and not registry.core_scales_latents("qwen_image")
    assert not registry.core_scales_latents("no such kind")


# -- no hand-written family list outside the registry ---------------------------------------------------
# Where family names may appear as data: the registry, each family's own package, and the benchmark's
# per-family deep-dive sections, whose section names (bench/runner.py's SECTIONS, --full's sections and the
# --<section>-checkpoint options) name bench modules, not the families the package supports.
ALLOWED = ("vae/registry.py", "vae/seedvr2/", "vae/wan/", "bench/seedvr2.py", "bench/seedvr2_original.py",
           "bench/qwen.py", "bench/qwen_layered.py", "bench/runner.py")


def _family_names() -> set[str]:
    return {n for f in registry.families() for n in (*f.names, *f.kinds)}


def _family_lists(path: Path, names: set[str]) -> list[str]:
    """Literal collections naming two or more families, and comparisons with a family name (an if/else on one)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            elts = node.keys if isinstance(node, ast.Dict) else node.elts
            hits = [e.value for e in elts if isinstance(e, ast.Constant) and e.value in names]
            if len(hits) >= 2:
                found.append(f"line {node.lineno}: a list of families {hits}")
        elif isinstance(node, ast.Compare):
            hits = [c.value for c in (node.left, *node.comparators) if isinstance(c, ast.Constant) and c.value in names]
            if hits:
                found.append(f"line {node.lineno}: a test for the family {hits[0]!r}")
    return found


def test_no_module_keeps_its_own_family_list():
    names = _family_names()
    offenders = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("tests/", "scripts/", ".", "build/", "dist/")) or rel.startswith(ALLOWED):  # build/: a wheel's copy
            continue
        found = _family_lists(path, names)
        if found:
            offenders[rel] = found
    assert not offenders, f"family lists outside vae/registry.py (read the registry instead): {offenders}"


def test_the_family_list_check_can_fail(tmp_path):
    """The check above finds what it is for: a tuple of families and an if on one."""
    bad = tmp_path / "bad.py"
    bad.write_text('CASES = ("seedvr2", "wan2.2")\n\ndef f(arch):\n    return 1 if arch == "qwen_image" else 2\n')
    assert len(_family_lists(bad, _family_names())) == 2
