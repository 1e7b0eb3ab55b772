"""ComfyUI core's own VAEs as a benchmark baseline (`python -m turbovae bench --comfyui PATH`).

Why: a ComfyUI user already has core's VAEs; the question before installing TurboVAE is whether ours is
faster on the same weights and gives the same image. So the main job can add a row per case for core's
VAE, built by core's own loader (`comfy.sd.VAE(sd=...)`, which picks its Wan 2.1/Qwen-Image, Wan 2.2 or
SeedVR2 model from the keys) from the case's seeded weights, and called the way core's VAE Decode/Encode
nodes call it (`VAE.decode` / `VAE.encode`, with core's own batching and chunking).

Nothing of ComfyUI is shipped: the tree is imported at run time from the folder the user names, and only
for the duration of `session()`. While it is open, an import hook binds the tree's top-level names
(`comfy`, `comfy_api`, `folder_paths`, `utils`, ...) to that folder, so they cannot resolve to another copy
on sys.path (the test doubles, a pip package named `comfy`) and nothing the tree provides is looked up
on sys.path by our code; modules of those names imported before are set aside and put back afterwards,
and every module the tree added is dropped, so nothing of it shadows or leaks into later code.

Layouts: core's decode returns images in [0, 1], channels last; its encode takes such images (frames as
the batch) and returns the latent mean. Core's Wan VAEs take and return raw latents, as ours do; its SeedVR2
VAE takes and returns them scaled, `(raw - shift) * scaling_factor` (its `comfy_format_encoded`), so a
SeedVR2 side converts with our config's factors. `CoreSide.comparable` maps core's output back to ours
(channels first in [-1, 1]; the mean half of our moments; raw latents) so errors are measured in our units;
decode outputs are compared clamped to [-1, 1], as every side returns them to a user.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import re
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Iterator, Optional

import torch

from ..vae.registry import Family, families
from ..vae.registry import family as registry_family
from .common import BenchRow
from ..vae.measuring import max_abs, psnr


def core_families() -> tuple[str, ...]:
    """Keys of the registered families core has a VAE for (`Family.core_state_dict`); the main job's exact-tiles
    cases are not among them (they compare two of our own paths)."""
    return tuple(f.key for f in families() if f.core_state_dict is not None)


def __getattr__(name: str) -> tuple[str, ...]:
    if name == "CORE_FAMILIES":  # read from the registry when asked
        return core_families()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

ADD_ROWS_HINT = ("note: add ComfyUI core's own VAEs as a baseline row per case with "
                 "--comfyui /path/to/ComfyUI (a checkout with its requirements installed)")


class ComfyUIUnusable(ImportError):
    """The named folder is not a ComfyUI tree this bench can import (the message says what to fix)."""


@dataclass(frozen=True)
class CoreTree:
    """A ComfyUI folder and what it says it is."""

    path: Path
    version: str
    commit: Optional[str]
    assembled: bool = False  # a tree scripts/assemble_comfyui_tree.py made: a release plus newer core files

    @property
    def label(self) -> str:
        """The row name: "ComfyUI core <version> (<commit>)", or "(assembled tree)" for an assembled one."""
        where = self.commit or ("assembled tree" if self.assembled else None)
        return f"ComfyUI core {self.version}" + (f" ({where})" if where else "")

    def module_names(self) -> frozenset[str]:
        """Top-level names importable from the tree: packages (with or without __init__.py) and modules."""
        names = set()
        for entry in self.path.iterdir():
            if entry.is_file() and entry.suffix == ".py" and entry.stem.isidentifier():
                names.add(entry.stem)
            elif entry.is_dir() and entry.name.isidentifier() and any(entry.glob("*.py")):
                names.add(entry.name)
        return frozenset(names)


# What scripts/assemble_comfyui_tree.py writes into a tree it assembles (the provenance of every newer file).
ASSEMBLED_NOTE = "TREE.md"
VERSION_LINE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.M)


def find_tree(path: str | Path) -> CoreTree:
    """The tree at `path` (version from comfyui_version.py, commit from git when it is a checkout)."""
    root = Path(path).expanduser().resolve()
    if not (root / "comfy" / "sd.py").is_file():
        raise ComfyUIUnusable(f"--comfyui {path}: not a ComfyUI tree (no comfy/sd.py there); name the folder "
                              "that holds ComfyUI's main.py and comfy/")
    version_file = root / "comfyui_version.py"
    found = VERSION_LINE.search(version_file.read_text()) if version_file.is_file() else None
    return CoreTree(root, found.group(1) if found else "version unknown", _git_commit(root),
                    (root / ASSEMBLED_NOTE).is_file())


def _git_commit(root: Path) -> Optional[str]:
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=8", "HEAD"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


class _TreeFinder(importlib.abc.MetaPathFinder):
    """Resolves the tree's top-level names (and so their submodules) in the tree only."""

    def __init__(self, tree: CoreTree, names: frozenset[str]):
        self.tree, self.names = tree, names

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names:
            return None  # submodules are found through their parent's __path__, which lies in the tree
        return importlib.machinery.PathFinder.find_spec(fullname, [str(self.tree.path)])


def _owned(name: str, names: frozenset[str]) -> bool:
    return name.partition(".")[0] in names


class StubbedCall(RuntimeError):
    """Core called into a package that `--comfyui-stub` replaced: the stub was not enough for this run."""


class _StubMeta(type):
    """Stand-ins for a missing package's names: attributes resolve (to further stand-ins, which can be
    subclassed and used in annotations and isinstance checks), but any call raises StubbedCall."""

    def __getattr__(cls, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _StubMeta(f"{cls.__name__}.{attr}", (), {})

    def __call__(cls, *args, **kwargs):
        raise StubbedCall(f"{cls.__name__} was called, but it is a stub (--comfyui-stub): carry the real package")


class _StubModule(ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _StubMeta(f"{self.__name__}.{attr}", (), {})


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []  # a package, so `import av.video` resolves to a stub too


class _StubFinder(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: answers only for the named packages (and their submodules) that nothing else on
    the path provides, so a package that is installed is always the real one. `used` lists what it stubbed."""

    def __init__(self, names: frozenset[str]):
        self.names, self.used = names, []

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in self.names:
            return None
        if fullname.partition(".")[0] not in self.used:
            self.used.append(fullname.partition(".")[0])
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


@contextmanager
def session(tree: CoreTree, device: torch.device, stubs: tuple[str, ...] = ()) -> Iterator["CoreVAEs"]:
    """Core's loader, imported from `tree` for the block; sys.modules is as before once it ends, and so is the
    root logger (core logs at import, and a first `logging.warning` with no handler installs one on stderr).

    `stubs`: top-level packages core's `comfy.sd` imports but a VAE never calls (e.g. `av`, for video files), for
    a machine that lacks them: where nothing installed provides one, an empty stand-in is imported instead, and
    the core rows' note names it (`CoreVAEs.stubbed`). A call into a stand-in raises StubbedCall."""
    bad = [n for n in stubs if not n.isidentifier()]
    if bad:
        raise ValueError(f"--comfyui-stub takes top-level package names (e.g. av); not {bad}")
    names = tree.module_names()
    if set(stubs) & names:
        raise ValueError(f"--comfyui-stub {sorted(set(stubs) & names)}: the tree itself provides these")
    stub_finder = _StubFinder(frozenset(stubs) - {n.partition(".")[0] for n in sys.modules})
    root = logging.getLogger()
    root_handlers, root_level = list(root.handlers), root.level
    set_aside = {n: m for n, m in sys.modules.items() if _owned(n, names)}
    for n in set_aside:
        del sys.modules[n]
    finder = _TreeFinder(tree, names)
    sys.meta_path.insert(0, finder)
    sys.meta_path.append(stub_finder)
    try:
        yield CoreVAEs(tree, _import_loader(tree, device), device, stubbed=tuple(stub_finder.used))
    finally:
        sys.meta_path.remove(finder)
        sys.meta_path.remove(stub_finder)
        for n in [n for n in sys.modules if _owned(n, names) or _owned(n, frozenset(stub_finder.used))]:
            del sys.modules[n]
        sys.modules.update(set_aside)
        root.handlers[:] = root_handlers
        root.setLevel(root_level)


def _import_loader(tree: CoreTree, device: torch.device) -> ModuleType:
    """`comfy.sd`, imported as `main.py --cpu` would on a CPU device (core's device choice reads that flag
    when its model management is first imported)."""
    try:
        cli_args = importlib.import_module("comfy.cli_args")
        cli_args.args.cpu = device.type == "cpu"
        sd = importlib.import_module("comfy.sd")
    except ImportError as e:
        raise ComfyUIUnusable(f"cannot import ComfyUI from {tree.path}: {type(e).__name__}: {e}. Run the bench "
                              "with a Python that has ComfyUI's requirements (pip install -r "
                              f"{tree.path / 'requirements.txt'}), e.g. ComfyUI's own venv") from e
    where = Path(getattr(sd, "__file__", "") or "").resolve()
    if tree.path not in where.parents:
        raise ComfyUIUnusable(f"comfy.sd was imported from {where}, not from {tree.path}")
    return sd


# ------------------------------------------------------------------------------------------------
# Core's VAE on our weights, in our layout
# ------------------------------------------------------------------------------------------------
@dataclass
class CoreSide:
    """One core VAE and the conversions between our tensors and core's node-level tensors."""

    name: str
    vae: object  # comfy.sd.VAE
    latent_channels: int
    latent_scale: float = 1.0  # core latent = (raw - latent_shift) * latent_scale
    latent_shift: float = 0.0
    note: str = ""  # said in the core row's note (e.g. the packages stubbed for the import)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """Our input (latent B,C,T,h,w, or pixels 1,3,T,H,W in [-1, 1]) as core's nodes hand it to the VAE:
        latents as they are, pixels as frames of channels-last images in [0, 1]."""
        if self.is_latent(x):
            return (x - self.latent_shift) * self.latent_scale if self.scaled else x
        if x.shape[0] != 1:
            raise ValueError(f"core's encode takes one clip (frames as the batch); got a batch of {x.shape[0]}")
        return ((x[0] + 1) / 2).permute(1, 2, 3, 0).contiguous()

    def is_latent(self, x: torch.Tensor) -> bool:
        return x.shape[1] == self.latent_channels

    @property
    def scaled(self) -> bool:
        return (self.latent_scale, self.latent_shift) != (1.0, 0.0)

    def run(self, prepared: torch.Tensor) -> torch.Tensor:
        """Core's own call, as its VAE Decode / VAE Encode nodes make it."""
        if prepared.ndim == 5 and prepared.shape[1] == self.latent_channels:
            return self.vae.decode(prepared)
        return self.vae.encode(prepared)

    def comparable(self, out: torch.Tensor, decoded: bool) -> torch.Tensor:
        """Core's output in our layout: decoded images channels first in [-1, 1]; the latent mean as is."""
        if decoded:
            frames = out if out.ndim == 5 else out.unsqueeze(1)  # (B, T, H, W, C)
            return frames.movedim(-1, 1) * 2 - 1
        return out / self.latent_scale + self.latent_shift if self.scaled else out


def ours_comparable(out: torch.Tensor, decoded: bool, latent_channels: int) -> torch.Tensor:
    """Our (or the reference's) output in the units core's is compared in: decoded images clamped to
    [-1, 1]; of encode moments (mean, log-variance) the mean, which is what core's encode returns."""
    return out.clamp(-1, 1) if decoded else out[:, :latent_channels]


class CoreVAEs:
    """Builds core VAEs from our weights with core's loader, in the session that imported it."""

    def __init__(self, tree: CoreTree, sd_module: ModuleType, device: torch.device, stubbed: tuple[str, ...] = ()):
        self.tree, self._sd, self.device, self.stubbed = tree, sd_module, device, stubbed

    @property
    def note(self) -> str:
        """What the core rows say about the import: the packages stubbed because a VAE never calls them."""
        return f"core imported with {', '.join(self.stubbed)} stubbed (never called by a VAE)" if self.stubbed else ""

    def side(self, family: str, model: torch.nn.Module, dtype: torch.dtype) -> Optional[CoreSide]:
        """Core's VAE for our `model`'s weights (`family`: a registered family's key), or None when this core's
        loader does not recognise them (e.g. SeedVR2 before core had it): such cases run without a core row, and
        a line on stderr says so."""
        if family not in core_families():
            raise ValueError(f"core has no VAE for family {family!r}; families: {', '.join(core_families())}")
        fam = registry_family(family)
        try:
            vae = self._sd.VAE(sd=core_weights(fam, model), device=self.device, dtype=dtype)
        except RuntimeError as e:  # torch's load_state_dict: another model's keys, or not a released configuration
            reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            print(f"note: {self.tree.label} could not load these {family} weights ({reason}); those cases have no "
                  "core row (its loader took them for another model, or for a configuration it does not build: "
                  "it builds the released ones, and --quick uses tiny ones)", file=sys.stderr)
            return None
        if getattr(vae, "first_stage_model", None) is None:
            print(f"note: {self.tree.label} has no {family} VAE (its loader did not recognise the weights); "
                  "those cases have no core row", file=sys.stderr)
            return None
        fmt = model.latent_format
        if fam.core_scales_latents:  # e.g. core's SeedVR2 VAE works in scaled latents (see the module docstring)
            return CoreSide(self.tree.label, vae, fmt.channels, fmt.scaling_factor, fmt.shift_factor, self.note)
        return CoreSide(self.tree.label, vae, fmt.channels, note=self.note)


def core_weights(family: Family, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Our model's weights under the key names core's loader expects (the family's `core_state_dict`; Wan: the
    original checkpoint names)."""
    return family.core_state_dict(model)


def core_rows(side: CoreSide, row_ref: BenchRow, row: BenchRow, measured: tuple, ref_out: torch.Tensor,
              out: torch.Tensor, decoded: bool) -> list[BenchRow]:
    """A case's rows with core's between the reference's and ours: core's row gives its error against the
    reference (max abs err, PSNR) and against ours (`err_vs_ours`); the other two carry core's time."""
    core_ms, core_mb, core_held, core_out = measured
    theirs = side.comparable(core_out, decoded)
    ref, ours = (ours_comparable(o, decoded, side.latent_channels) for o in (ref_out, out))
    row_core = BenchRow(row.section, row.case, side.name, core_ms, row_ref.ms, core_mb, max_abs(theirs, ref),
                        psnr(theirs, ref) if decoded else None, note="; ".join(n for n in (row.note, side.note) if n),
                        err_vs_ours=max_abs(theirs, ours),
                        held_mb=core_held)
    row_ref.core_ms = row.core_ms = core_ms
    return [row_ref, row_core, row]
