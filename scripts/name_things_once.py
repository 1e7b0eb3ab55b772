"""Issue 42, item 3, run once on the merged main: one name per thing. Idempotent: a second run changes nothing.
Prints every file it moves or rewrites.

    python scripts/name_things_once.py [--dry-run]

What it does, in order:
1. device memory, the predicted peak, the budget and what the allocator measures go into one `vae/memory/`
   package (`MOVES`); `vae/memory_plan.py`, which is the planner's front door and no memory at all, becomes
   `vae/plan_pass.py`, named after the one function it offers. Every import of a moved module is rewritten from
   its syntax tree (relative imports stay relative; `from pkg import module` keeps its local name with `as`), and
   the modules' dotted and slashed paths are rewritten in code, tests and docs;
2. the causal state is a *cache* everywhere (`CAUSAL_CACHE`: `CausalMemory` -> `CausalCache`, `memory_layout`
   -> `cache_layout`, ...; "causal memory" in prose);
3. one pass context name: `PassContext` (vae/base.py); Wan's `StreamContext` alias is gone, SeedVR2's subclass
   is `SeedVR2PassContext` (it adds the layer-wise split) and its `PassContext = SeedVR2Pass` alias is gone.
Results files, the CHANGELOG's history and the rename scripts are left as they were written.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "turbovae"
LEAVE_TEXT = ("docs/results/", "CHANGELOG.md", "scripts/finish_renames.py", "scripts/name_things_once.py",
              "bench_results/", "build/")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".sh", ".txt", ".yaml", ".yml", ".cfg"}

MOVES = {  # old file -> new file (repository paths)
    "vae/free_memory.py": "vae/memory/device.py",
    "vae/memory_budget.py": "vae/memory/budget.py",
    "vae/peak_memory.py": "vae/memory/peak.py",
    "vae/op_memory.py": "vae/memory/op_rules.py",
    "vae/cpu_conv_memory.py": "vae/memory/cpu_conv.py",
    "vae/meta_device.py": "vae/memory/meta_device.py",
    "vae/allocator_peak.py": "vae/memory/allocator.py",
    "vae/oom.py": "vae/memory/oom.py",
    "vae/placement.py": "vae/memory/placement.py",
    "vae/memory_plan.py": "vae/plan_pass.py",
}
MEMORY_INIT = '''"""Memory, in one place: what a device has free (`device`), the budget a pass may use (`budget`), the peak a
pass will reach, predicted on meta tensors (`peak`, with what kernels allocate inside ops: `op_rules`, `cpu_conv`,
`meta_device`), the peak the allocator measured (`allocator`), where a pass keeps what it holds (`placement`) and
what an allocation failure is (`oom`). The causal state a pass carries between steps is a cache
(`vae/base.py`'s `CausalCache`), not this package's business."""
'''

CAUSAL_CACHE = [  # word renames, in this order
    ("CausalMemory", "CausalCache"),
    ("MemoryHandoff", "CacheHandoff"),
    ("memory_layout", "cache_layout"),
    ("_memory_in", "_cache_in"),
    ("memory_in", "cache_in"),
    ("memory_out", "cache_out"),
    ("memory_frames", "cache_frames"),
    ("_memory_tail", "_cache_tail"),
]
PROSE = [(re.compile(r"\b([Cc])ausal memory\b"), r"\1ausal cache")]

SEEDVR2_FILES = ("vae/seedvr2/", "tests/test_seedvr2")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def tracked() -> list[str]:
    return [p for p in git("ls-files").splitlines() if (ROOT / p).is_file()]


def module_of(path: str) -> str:
    parts = [PACKAGE, *Path(path).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULE_MOVES = {module_of(old): module_of(new) for old, new in MOVES.items()}


# -- 1. moves ------------------------------------------------------------------------------------------------
def move_files(dry: bool) -> dict[str, str]:
    """The moves still to make (new path -> old path), made unless `dry`."""
    init = ROOT / "vae" / "memory" / "__init__.py"
    if not init.exists():
        print("create vae/memory/__init__.py")
        if not dry:
            init.parent.mkdir(exist_ok=True)
            init.write_text(MEMORY_INIT)
            git("add", str(init.relative_to(ROOT)))
    todo = {new: old for old, new in MOVES.items() if (ROOT / old).exists()}
    for new, old in todo.items():
        print(f"move {old} -> {new}")
        if not dry:
            git("mv", old, new)
    return todo


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _relative(target: str, module: str, is_package: bool) -> str:
    here = module.split(".") if is_package else module.split(".")[:-1]
    there = target.split(".")
    common = 0
    while common < min(len(here), len(there)) and here[common] == there[common]:
        common += 1
    dots = "." * (len(here) - common + 1)
    return dots + ".".join(there[common:])


def _moved(name: str) -> str:
    for old, new in MODULE_MOVES.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return name


def _names(aliases: list[ast.alias]) -> str:
    return ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in aliases)


def _render(target: str, aliases: list[ast.alias], relative_to: str, is_package: bool, relative: bool,
            indent: str) -> str:
    shown = _relative(target, relative_to, is_package) if relative else target
    line = f"from {shown} import {_names(aliases)}"
    if len(indent + line) <= 116:
        return line
    inner = "\n".join(f"{indent}    {a.name}{f' as {a.asname}' if a.asname else ''}," for a in aliases)
    return f"from {shown} import (\n{inner}\n{indent})"


def rewrite_imports(path: str, text: str, old_path: str) -> str:
    """Each import naming a moved module, and every relative import of a moved file, rewritten from the syntax
    tree; the rest of the file as it was. Relative imports are resolved where the file was (`old_path`) and
    written relative to where it is."""
    in_package = not path.startswith(("tests/", "scripts/"))
    old_module = module_of(old_path) if in_package else "tests.x"
    new_module = module_of(path) if in_package else "tests.x"
    is_package = path.endswith("__init__.py")
    tree = ast.parse(text)
    edits = []
    for node in ast.walk(tree):
        indent = " " * getattr(node, "col_offset", 0)
        if isinstance(node, ast.ImportFrom):
            absolute = _absolute(node, old_module, is_package)
            groups: dict[str, list[ast.alias]] = {}
            for alias in node.names:
                full = f"{absolute}.{alias.name}"
                if full in MODULE_MOVES:  # `from pkg import module`
                    parent, leaf = MODULE_MOVES[full].rsplit(".", 1)
                    local = alias.asname or alias.name
                    groups.setdefault(parent, []).append(ast.alias(leaf, None if leaf == local else local))
                else:
                    groups.setdefault(_moved(absolute), []).append(alias)
            was = _render(absolute, node.names, old_module, is_package, bool(node.level), indent)
            now = [_render(t, a, new_module, is_package, bool(node.level), indent) for t, a in groups.items()]
            if now != [was]:
                edits.append((node, now))
        elif isinstance(node, ast.Import):
            if any(_moved(a.name) != a.name for a in node.names):
                edits.append((node, [f"import {_names([ast.alias(_moved(a.name), a.asname) for a in node.names])}"]))
    if not edits:
        return text
    lines = text.splitlines(keepends=True)
    for node, new in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        start, end = node.lineno - 1, node.end_lineno - 1
        indent = " " * node.col_offset
        head, tail = lines[start][:node.col_offset], lines[end][node.end_col_offset:]
        lines[start:end + 1] = [head + ("\n" + indent).join(new) + tail]
    return "".join(lines)


def rewrite_paths(text: str) -> str:
    """Slashed and dotted module paths in prose, strings and docs."""
    for old, new in MOVES.items():
        text = re.sub(rf"(?<![\w/]){re.escape(old)}\b", new, text)
        old_dotted, new_dotted = (p[:-3].replace("/", ".") for p in (old, new))
        text = re.sub(rf"(?<![\w.]){re.escape(old_dotted)}\b(?!/)", new_dotted, text)
        text = re.sub(rf"\b{PACKAGE}\.{re.escape(old_dotted)}\b", f"{PACKAGE}.{new_dotted}", text)
    return text


# -- 2. and 3. words ----------------------------------------------------------------------------------------
def rename_words(path: str, text: str) -> str:
    for old, new in CAUSAL_CACHE:
        text = re.sub(rf"\b{old}\b", new, text)
    for pattern, repl in PROSE:
        text = pattern.sub(repl, text)
    text = re.sub(r"\nStreamContext = PassContext[^\n]*", "", text)
    text = re.sub(r"\bStreamContext\b", "PassContext", text)
    if path.startswith(SEEDVR2_FILES) and "SeedVR2PassContext" not in text:  # not yet done
        text = re.sub(r"\n\nPassContext = SeedVR2Pass[^\n]*\n", "", text)
        text = text.replace("import PassContext as BasePassContext", "import BASE_PASS_CONTEXT")
        text = re.sub(r"\bSeedVR2Pass\b", "SeedVR2PassContext", text)
        text = re.sub(r"\bPassContext\b", "SeedVR2PassContext", text)
        text = re.sub(r"\bBasePassContext\b", "PassContext", text).replace("BASE_PASS_CONTEXT", "PassContext")
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print what would change, change nothing")
    dry = parser.parse_args().dry_run
    was_at = move_files(dry)  # a file moved by this run: its relative imports are read where it was
    for path in tracked():
        if path.startswith(LEAVE_TEXT) or Path(path).suffix not in TEXT_SUFFIXES:
            continue
        if dry and path in MOVES and MOVES[path] in was_at:  # a dry run moved nothing: read it where it is
            path = MOVES[path]
            file = ROOT / was_at[path]
        else:
            file = ROOT / path
        text = file.read_text()
        new = rewrite_imports(path, text, was_at.get(path, path)) if path.endswith(".py") else text
        new = rename_words(path, rewrite_paths(new))
        if new != text:
            print(f"rewrite {path}")
            if not dry:
                file.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
