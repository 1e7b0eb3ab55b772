"""One straight dependency direction and no import cycle, read fresh from the source.

Every module of the package (the repository root's modules and every sub-package, not tests/ or scripts/) is
parsed with `ast`; relative imports are resolved to module names, counting imports inside functions and under
`if TYPE_CHECKING:` (an annotation-only import is still an edge a reader follows). Checked on that graph:
`vae/` never imports `trt/`, `nodes/`, `bench/` or ComfyUI, `trt/` never imports `nodes/`, `bench/` or the CLI,
no import cycle anywhere, and no module imports another module's leading-underscore name (a name another
module uses is public). Also: each module of `vae/` imported on its own in a fresh interpreter, watching which
modules appear."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import turbovae

ROOT = Path(turbovae.__file__).resolve().parent
FORBIDDEN = ("comfy", "comfy_api", "folder_paths", "turbovae.trt", "turbovae.nodes", "turbovae.bench")
ABOVE_TRT = ("turbovae.nodes", "turbovae.bench", "turbovae.cli",
             "comfy", "comfy_api", "folder_paths")
NOT_PACKAGE = {"tests", "scripts", "build", "dist"}  # folders of the repository that are not in the package

def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = ["turbovae", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_files() -> list[Path]:
    """Every .py file of the package: the root's modules and those of each folder that is a sub-package
    (an `__init__.py` in it and in every folder above it)."""
    files = sorted(ROOT.glob("*.py"))
    for init in sorted(ROOT.rglob("__init__.py")):
        rel = init.parent.relative_to(ROOT).parts
        if not rel or rel[0] in NOT_PACKAGE or any(part.startswith(".") for part in rel):
            continue
        if all((ROOT.joinpath(*rel[:i]) / "__init__.py").exists() for i in range(1, len(rel))):
            files += sorted(init.parent.glob("*.py"))
    return files


def _imported(path: Path, modules: set[str], root: Path = ROOT) -> list[tuple[str, str, str, int]]:
    """(module imported, name taken from it or "", local name bound to that module or "", line) for every
    import in `path`, relative ones resolved against the module's package; `from package import module`
    resolves to the module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, "", a.asname or "", node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[:len(parts) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((sub, "", a.asname or a.name, node.lineno) if sub in modules
                           else (target, a.name, "", node.lineno))
    return out


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Absolute names of everything `path` imports (modules of this package resolved to the module)."""
    return {target for target, _name, _bound, _line in _imported(path, modules)}


def _graph(files: list[Path]) -> dict[str, set[str]]:
    modules = {_module_name(p) for p in files}
    return {_module_name(p): _imports(p, modules) for p in files}


def _package_graph() -> dict[str, set[str]]:
    return _graph(_package_files())


def _vae_graph() -> dict[str, set[str]]:
    return {m: imps for m, imps in _package_graph().items() if m.startswith("turbovae.vae")}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle among the graph's own modules, or []."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str]:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if n not in graph or n == m:
                continue
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        state[m] = 2
        stack.pop()
        return []

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return []


def test_vae_imports_nothing_above_it():
    bad = {m: sorted(i for i in imps if i.startswith(FORBIDDEN)) for m, imps in _vae_graph().items()}
    assert {m: i for m, i in bad.items() if i} == {}


def test_trt_imports_nothing_above_it():
    graph = {m: imps for m, imps in _package_graph().items() if m.startswith("turbovae.trt")}
    assert len(graph) > 15  # every module of trt/ was parsed
    bad = {m: sorted(i for i in imps if i.startswith(ABOVE_TRT)) for m, imps in graph.items()}
    assert {m: i for m, i in bad.items() if i} == {}


def test_package_graph_covers_every_sub_package():
    graph = _package_graph()
    assert len([m for m in graph if m.startswith("turbovae.vae")]) > 30
    for name in ("turbovae", "turbovae.cli", "turbovae.trt.interface", "turbovae.nodes", "turbovae.bench.gpu",
                 "turbovae.vae.parallel.passes", "turbovae.vae.wan.model"):
        assert name in graph, name
    assert not [m for m in graph if m.startswith(("turbovae.tests", "turbovae.scripts"))]
    # a function-level import and an annotation-only one are edges too
    assert "turbovae.trt.engine_vae" in graph["turbovae.loading"]


def test_package_has_no_import_cycle():
    cycle = _cycle(_package_graph())
    assert cycle == [], "import cycle: " + " -> ".join(cycle)


def _private_imports(files: list[Path], root: Path = ROOT) -> list[str]:
    """`module:line ...` for every leading-underscore name a module takes from another module of the package,
    by `from other import _name` or as `other._name` on a module it imported."""
    modules = {_module_name(p, root) for p in files}
    private = lambda name: name.startswith("_") and not name.startswith("__")  # noqa: E731
    found = []
    for path in files:
        me = _module_name(path, root)
        bound = {}
        for target, name, local, line in _imported(path, modules, root):
            if target in modules and target != me and private(name):
                found.append(f"{me}:{line} imports {name} from {target}")
            if local and target in modules and target != me:
                bound[local] = target
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and private(node.attr)):
                found.append(f"{me}:{node.lineno} uses {bound[node.value.id]}.{node.attr}")
    return found


def test_no_module_imports_another_modules_private_name():
    assert _private_imports(_package_files()) == []


def test_private_import_finder_finds_both_forms(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def _helper():\n    pass\n")
    (pkg / "b.py").write_text("from .a import _helper\n")
    (pkg / "c.py").write_text("def f():\n    from . import a\n    return a._helper()\n")
    (pkg / "d.py").write_text("from .a import helper_made_public\nfrom . import a\nx = a.__name__\n")
    files = [pkg / "__init__.py", pkg / "a.py", pkg / "b.py", pkg / "c.py", pkg / "d.py"]
    assert _private_imports(files, pkg) == ["turbovae.b:1 imports _helper from turbovae.a",
                                            "turbovae.c:3 uses turbovae.a._helper"]


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_each_vae_module_imports_alone():
    """Each module, imported first in a fresh state, loads and pulls in no trt/ComfyUI module."""
    names = sorted(_vae_graph())
    code = f"""
import importlib, sys
import turbovae
base = {{k for k in sys.modules if k.startswith("turbovae.trt") or k.startswith("comfy")}}
for name in {names!r}:
    for k in [k for k in sys.modules if k.startswith("turbovae.vae")]:
        del sys.modules[k]
    try:
        importlib.import_module(name)
    except ImportError as e:  # an optional accelerator package (Triton) that is not installed here
        if e.name != "triton":
            raise
        continue
    extra = {{k for k in sys.modules if k.startswith({FORBIDDEN!r})}} - base
    assert not extra, (name, sorted(extra))
print("ok", len({names!r}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("ok")


def _reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module of the package that `start` imports, directly or through the modules it imports."""
    seen, todo = {start}, [start]
    while todo:
        for n in graph[todo.pop()]:
            if n in graph and n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def test_the_doctor_reaches_no_bench_module():
    """`python -m turbovae doctor` runs where the benchmark's optional packages are missing: neither its command
    (cli/doctor.py) nor its report (vae/doctor.py), nor anything they import, imports bench/."""
    graph = _package_graph()
    for start in ("turbovae.cli.doctor", "turbovae.vae.doctor"):
        reached = _reached(graph, start)
        assert "turbovae.vae.doctor" in reached and "turbovae.vae.measuring" in reached
        assert sorted(m for m in reached if m.startswith("turbovae.bench")) == [], start


def test_reached_follows_imports_through_modules():
    assert _reached({"a": {"b", "os"}, "b": {"c"}, "c": set(), "d": {"a"}}, "a") == {"a", "b", "c"}
