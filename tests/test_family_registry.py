"""A VAE family is one registry entry (vae/registry.py): registering the toy family (tests/engines_toy.py) in one
place makes it appear everywhere a family is listed, and no module keeps a hand-written family list."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Optional

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
# Where family names may appear as data: the registry, each family's own package, the benchmark's per-family
# deep-dive sections, whose section names (bench/runner.py's SECTIONS, --full's sections and the
# --<section>-checkpoint options) name bench modules, not the families the package supports, and bench/cases.py,
# the one case table of the bench, keyed by registry key (each key and label checked against the registry when
# the bench is imported).
ALLOWED = ("vae/registry.py", "vae/seedvr2/", "vae/wan/", "bench/seedvr2.py", "bench/seedvr2_original.py",
           "bench/qwen.py", "bench/qwen_layered.py", "bench/cases.py", "bench/runner.py")
# The names a family went by as a constant: the registry's own (`registry.SEEDVR2`, ...) and those of the bench's
# retired name module (bench/family_names.py: `QWEN`, `WAN21`, where a case stood for one model of a family).
RETIRED_CONSTANTS = ("QWEN", "QWEN_IMAGE", "SEEDVR2", "WAN21", "WAN22")


def _family_names() -> set[str]:
    return {n for f in registry.families() for n in (*f.names, *f.kinds)}


def _family_constants() -> set[str]:
    """The registry's names bound to a family (or a tuple of them), and the retired bench constants."""
    def is_families(value) -> bool:
        return isinstance(value, registry.Family) or (
            isinstance(value, tuple) and bool(value) and all(isinstance(v, registry.Family) for v in value))

    return {name for name, value in vars(registry).items() if is_families(value)} | set(RETIRED_CONSTANTS)


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "a call")


def _family_lists(path: Path, names: set[str], constants: frozenset[str] = frozenset()) -> list[str]:
    """Where a module names a family by literal: a collection of two or more families, a comparison with one (an
    if/else on it), one passed to a call (a case table's row, `family("wan2.2")`, `arch="seedvr2"`), and any other
    literal family name (a table row's tuple, a default, a dict key). And where it holds a family by constant
    (`constants`, the names the registry binds to families and the retired bench ones): an import of one from the
    registry or from a module of family names, one in a collection (a hand-written family table:
    `{SEEDVR2: ..., WAN22: ...}`, or one of its rows: `(QWEN, 512, 512)`), one passed to a call."""
    found, seen = [], set()

    def family_constants(nodes) -> list[ast.Constant]:
        return [n for n in nodes if isinstance(n, ast.Constant) and n.value in names]

    def by_constant(node) -> Optional[str]:
        if isinstance(node, ast.Name) and node.id in constants:
            return node.id
        if isinstance(node, ast.Attribute) and node.attr in constants:
            return node.attr
        return None

    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = (node.module or "").rsplit(".", 1)[-1]
            held = [a.name for a in node.names if a.name in constants]
            if module == "family_names" or (module == "registry" and held):
                found.append(f"line {node.lineno}: families imported by constant from {node.module}: "
                             f"{', '.join(held or [a.name for a in node.names])}")
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            elts = node.keys if isinstance(node, ast.Dict) else node.elts
            hits = family_constants(elts)
            if len(hits) >= 2:
                found.append(f"line {node.lineno}: a list of families {[h.value for h in hits]}")
                seen.update(map(id, hits))
            held = [c for c in map(by_constant, elts) if c]
            if len(held) >= 2:
                found.append(f"line {node.lineno}: a table of families by constant {held}")
            elif held:
                found.append(f"line {node.lineno}: a table row of the family {held[0]}")
        elif isinstance(node, ast.Compare):
            hits = family_constants((node.left, *node.comparators))
            if hits:
                found.append(f"line {node.lineno}: a test for the family {hits[0].value!r}")
                seen.update(map(id, hits))
        elif isinstance(node, ast.Call):
            for hit in family_constants((*node.args, *(k.value for k in node.keywords))):
                found.append(f"line {node.lineno}: the family {hit.value!r} passed to {_call_name(node)}()")
                seen.add(id(hit))
            for held in filter(None, map(by_constant, (*node.args, *(k.value for k in node.keywords)))):
                found.append(f"line {node.lineno}: the family {held} passed to {_call_name(node)}() by constant")
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in seen:
            found.append(f"line {node.lineno}: the family {node.value!r} named by literal")
    return sorted(found, key=lambda line: int(line.split()[1].rstrip(":")))


def test_no_module_keeps_its_own_family_list():
    names, constants = _family_names(), frozenset(_family_constants())
    offenders = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("tests/", "scripts/", ".", "build/", "dist/")) or rel.startswith(ALLOWED):  # build/: a wheel's copy
            continue
        found = _family_lists(path, names, constants)
        if found:
            offenders[rel] = found
    assert not offenders, ("families written by hand outside vae/registry.py and bench/cases.py (read the registry, "
                           f"or the bench's case table, instead): {offenders}")


def test_the_family_list_check_can_fail(tmp_path):
    """The check above finds what it is for: a tuple of families, an if on one, a case table's row naming one,
    a keyword argument naming one, and a table row's tuple naming one; and a family table written with the
    registry's constants or the bench's retired ones, however it is keyed."""
    names, constants = _family_names(), frozenset(_family_constants())
    bad = tmp_path / "bad.py"
    bad.write_text('CASES = ("seedvr2", "wan2.2")\n\ndef f(arch):\n    return 1 if arch == "qwen_image" else 2\n')
    assert len(_family_lists(bad, names)) == 2
    bad.write_text('ROWS = (GpuCase("x", "qwen_image", 1), f(arch="wan2.2"))\nTABLE = [("qwen", 64, 64)]\n')
    assert _family_lists(bad, names) == ["line 1: the family 'qwen_image' passed to GpuCase()",
                                         "line 1: the family 'wan2.2' passed to f()",
                                         "line 2: the family 'qwen' named by literal"]
    bad.write_text("from .family_names import QWEN, SEEDVR2\nfrom ..vae.registry import WAN22, family\n"
                   "from ..vae import registry\n"
                   "INIT = {SEEDVR2: 1, registry.QWEN_IMAGE: 2}\n"
                   "SIZES = [(QWEN, 512, 512), (SEEDVR2, 256, 256)]\n"
                   "ONE = Case(WAN22, 64)\nLABELS = (('Wan 2.1', WAN21),)\n")
    assert _family_lists(bad, names, constants) == [
        "line 1: families imported by constant from family_names: QWEN, SEEDVR2",
        "line 2: families imported by constant from vae.registry: WAN22",
        "line 4: a table of families by constant ['SEEDVR2', 'QWEN_IMAGE']",
        "line 5: a table row of the family QWEN",
        "line 5: a table row of the family SEEDVR2",
        "line 6: the family WAN22 passed to Case() by constant",
        "line 7: a table row of the family WAN21"]
    assert {"SEEDVR2", "QWEN_IMAGE", "WAN22", "BUILTIN_FAMILIES"} <= constants  # read off the registry itself


def test_the_bench_case_table_is_keyed_by_registry_key():
    """bench/cases.py's keys are the registry's keys (as it spells them), each row's label a name of the family it
    sits under, and every section reads its rows from it in registration order, each with its family's key."""
    from turbovae.bench import cases

    assert set(cases.TABLE) <= {f.key for f in registry.families()}
    cases.check(cases.TABLE)
    for section in cases.SECTIONS:
        for quick, cuda in ((True, False), (False, False), (False, True)):
            rows = cases.for_section(section, quick=quick, cuda=cuda)
            keys = [r.family for r in rows if hasattr(r, "family")]
            order = [f.key for f in registry.families()]
            assert keys == sorted(keys, key=order.index), section
    with pytest.raises(registry.UnknownFamily):
        cases.check({"toy": cases.FamilyCases()})
    with pytest.raises(ValueError, match="how the registry spells"):
        cases.check({"Wan-2.2": cases.FamilyCases()})
    with pytest.raises(ValueError, match="sits under 'wan2.2'"):
        cases.check({"wan2.2": cases.FamilyCases(fidelity=(cases.FidelityCase("decode", 1, 8, 8, label="qwen"),))})
    with pytest.raises(ValueError, match="no section"):
        cases.for_section("budget")
    before = cases.for_section("gpu")
    with registry.registered(TOY_FAMILY):  # a family the table has no entry for: no rows, the others unchanged
        assert cases.for_section("gpu") == before and cases.family_cases("toy") == cases.FamilyCases()


def test_a_family_name_is_found_however_it_is_spelled():
    """The registry, not each caller (the planner's `plan` used to normalise Wan names by hand), forgives case and
    separators."""
    for spelled, key in (("Wan-2.1", "qwen_image"), ("wan21", "qwen_image"), ("WAN_2_2", "wan2.2"),
                         ("Qwen-Image", "qwen_image"), ("SeedVR2", "seedvr2")):
        assert registry.family(spelled).key == key
    from turbovae.vae.plan_pass import meta_model

    assert meta_model("wan22").kind == "wan2.2"
    with pytest.raises(registry.UnknownFamily):
        registry.family("wan2.3")


def test_each_exact_plan_declares_what_it_holds_as_its_runner_sees_it():
    """The planner prices and bounds an exact plan by its declared `holds_whole_frames` (vae/base.py `ExactTiling`),
    not by testing its type: for every family and direction it matches the runner method the plan calls (a staged
    plan carries per-tile state, a layer-wise one whole frames)."""

    class Which:
        def staged(self, plan):
            return False

        def layerwise(self, plan):
            return True

    for fam in registry.families():
        for decode in (True, False):
            plan = fam.exact_plan(decode=decode)
            if plan is not None:
                assert plan.holds_whole_frames is plan.run_with(Which()), (fam.key, decode)
