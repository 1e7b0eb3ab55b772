"""Deprecation aliases for modules that moved: the old import path keeps working, warns once, and IS the
new module (the same object in `sys.modules`), so module state and monkeypatching through the old path reach
the code that runs. Old paths are shims written by the rename of issue 35; they name the new path to import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Optional


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; import it from there (the old path is a deprecated alias)",
                  DeprecationWarning, stacklevel=4)


def alias_module(old: str, new: str) -> ModuleType:
    """Make module `old` (a shim calling this at import) the module `new`: warn, import `new`, and replace
    `old` in `sys.modules` so the import statement that loaded the shim binds the new module."""
    _warn(old, new)
    module = importlib.import_module(new)
    sys.modules[old] = module
    return module


class _PackageAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `old.<sub>` for a moved package and loads it as `new.<sub>` (the same module object)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> Optional[importlib.machinery.ModuleSpec]:
        if not fullname.startswith(self.old + "."):
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module; exec_module swaps it for the real one

    def exec_module(self, module: ModuleType) -> None:
        new = self.new + module.__name__[len(self.old):]
        _warn(module.__name__, new)
        # the import system returns what sys.modules holds after exec_module: the new module itself
        sys.modules[module.__name__] = importlib.import_module(new)


def alias_package(old: str, new: str) -> ModuleType:
    """Make package `old` (a shim `__init__` calling this) the package `new`, and every `old.<sub>` the module
    `new.<sub>`, by a finder placed first on `sys.meta_path` (once per package)."""
    if not any(isinstance(f, _PackageAlias) and f.old == old for f in sys.meta_path):
        sys.meta_path.insert(0, _PackageAlias(old, new))
    return alias_module(old, new)
