"""Issue 42, item 7: the layers of each architecture read as the architecture, their fast paths chosen once per pass
(vae/wan/pieces.py, vae/seedvr2/pieces.py) — no layer reads a `FastPaths` switch. Only a pass context's
`__init__` may (it is where the pieces are chosen)."""

import ast
from pathlib import Path

import pytest

from turbovae.vae.accel.switches import FastPaths

ROOT = Path(__file__).resolve().parents[1]
LAYER_MODULES = ["vae/wan/layers.py", "vae/seedvr2/layers.py", "vae/seedvr2/layerwise.py", "vae/seedvr2/subpixel.py"]


def _switch_reads(path: Path) -> list[str]:
    """`….fast.<switch>` or `fast.<switch>` reads outside a `__init__`, as 'function: source'."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Attribute) and node.attr in FastPaths.names() and function != "__init__":
            base = node.value
            if (isinstance(base, ast.Attribute) and base.attr == "fast") or (isinstance(base, ast.Name)
                                                                           and base.id == "fast"):
                found.append(f"{function}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


@pytest.mark.parametrize("module", LAYER_MODULES)
def test_no_layer_reads_a_fast_path_switch(module):
    assert _switch_reads(ROOT / module) == []


def test_the_check_sees_a_switch_read(tmp_path):
    """The AST check is not vacuous: a layer branching on a switch is found."""
    bad = tmp_path / "layers.py"
    bad.write_text("def forward(self, x, ctx):\n    return x if ctx.fast.sdpa else -x\n")
    assert _switch_reads(bad) == ["forward: ctx.fast.sdpa"]


@pytest.mark.parametrize("arch", ["wan", "seedvr2"])
def test_pieces_follow_every_switch(arch):
    """Each switch the architecture reads changes the pieces chosen for it (none is dropped on the way)."""
    if arch == "wan":
        from turbovae.vae.wan.layers import WAN_FAST_FIELDS as fields
        from turbovae.vae.wan.pieces import WanPieces as Pieces
    else:
        from turbovae.vae.seedvr2.model import SeedVR2VAE
        from turbovae.vae.seedvr2.pieces import SeedVR2Pieces as Pieces
        fields = SeedVR2VAE.fast_fields
    on = Pieces.of(FastPaths())
    for name in fields:
        assert Pieces.of(FastPaths().without(name)) != on, name
