"""One straight dependency direction: `vae/` never imports `trt/`, `nodes/` or ComfyUI, and its modules
form no import cycle. Checked two ways: statically over every module's imports (function-level ones too;
annotation-only `if TYPE_CHECKING:` imports excepted), and by importing each module of `vae/` on its own
in a fresh interpreter, watching which modules appear."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import turbovae

ROOT = Path(turbovae.__file__).resolve().parent
FORBIDDEN = ("comfy", "comfy_api", "folder_paths", "turbovae.trt", "turbovae.nodes", "turbovae.bench")


def _module_name(path: Path) -> str:
    parts = ["turbovae", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Absolute names of everything `path` imports (modules of this package resolved to the module)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in modules else target)
    return out


def _vae_graph() -> dict[str, set[str]]:
    files = sorted((ROOT / "vae").rglob("*.py"))
    modules = {_module_name(p) for p in files}
    return {_module_name(p): _imports(p, modules) for p in files}


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


def test_vae_has_no_import_cycle():
    graph = _vae_graph()
    assert len(graph) > 30  # every module of vae/ was parsed
    assert _cycle(graph) == []


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
