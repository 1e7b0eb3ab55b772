"""Every module that moved in issue 35's rename still imports at its old path: it warns that it moved and IS
the new module (one object), so module state and monkeypatching through either path are the same.
turbovae-deprecated-alias: this file names the old paths on purpose (the rename leaves such files alone)."""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import pytest

MOVED = {
    "turbovae.vae.fast_options": "turbovae.vae.accel.switches",
    "turbovae.vae.fast_paths": "turbovae.vae.accel.self_checks",
    "turbovae.vae.kernels": "turbovae.vae.accel.kernels",
    "turbovae.vae.channels_last": "turbovae.vae.accel.channels_last",
    "turbovae.vae.memory_format": "turbovae.vae.accel.tensor_layout",
    "turbovae.vae.weight_layout": "turbovae.vae.accel.weight_layout",
    "turbovae.vae.cuda_graphs": "turbovae.vae.accel.cuda_graphs",
    "turbovae.vae.compile": "turbovae.vae.accel.compile",
    "turbovae.vae.ops": "turbovae.vae.norms",
    "turbovae.vae.plans": "turbovae.vae.exact_tiling",
    "turbovae.vae.tiling.api": "turbovae.vae.tiled",
    "turbovae.vae.parallel.api": "turbovae.vae.parallel.passes",
    "turbovae.vae.memory": "turbovae.vae.free_memory",
    "turbovae.trt": "turbovae.engines",
    "turbovae.engines.backend": "turbovae.engines.interface",
    "turbovae.engines.backend_registry": "turbovae.engines.backends",
}


def _fresh_import(name: str):
    """Import `name` with its old-path alias (and any alias of a package above it) dropped first, so the
    shim runs again and its warning is seen."""
    sys.modules.pop(name, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(name)
    return module, [w for w in caught if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_imports_warns_and_is_the_new_module(old):
    new = importlib.import_module(MOVED[old])
    module, warned = _fresh_import(old)
    assert module is new
    assert sys.modules[old] is new
    assert any(MOVED[old] in str(w.message) for w in warned), [str(w.message) for w in warned]


def test_moved_package_aliases_its_submodules():
    """`import turbovae.trt.<sub>` and `from turbovae.trt import <sub>` give the engines module itself."""
    for old_pkg, new_pkg in [(o, n) for o, n in MOVED.items() if o.endswith((".trt", ".kernels"))]:
        new = importlib.import_module(new_pkg)
        subs = sorted(p.stem for p in Path(new.__file__).parent.glob("*.py")
                      if p.stem != "__init__")
        assert subs, new_pkg
        for sub in subs:
            try:
                real = importlib.import_module(f"{new_pkg}.{sub}")
            except ImportError as e:  # an optional accelerator (Triton) that is not installed here
                if e.name == "triton":
                    continue
                raise
            sys.modules.pop(f"{old_pkg}.{sub}", None)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                assert importlib.import_module(f"{old_pkg}.{sub}") is real
                assert getattr(importlib.import_module(old_pkg), sub) is real


def test_monkeypatching_the_old_path_reaches_the_new_module(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old_name = sorted(n for n in MOVED if not n.endswith((".trt", ".kernels")))[0]
        old = importlib.import_module(old_name)
    monkeypatch.setattr(old, "_turbovae_alias_probe", 1, raising=False)
    assert importlib.import_module(MOVED[old_name])._turbovae_alias_probe == 1
