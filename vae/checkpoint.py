"""Reading checkpoints safely and checking them strictly against an architecture.

Only safetensors and `torch.load(weights_only=True)` are used: a checkpoint is data, never code.
The strict check is ours (not `load_state_dict(strict=True)`): the SeedVR2 reference silently skips
missing conv weights, so every key and every shape is compared here before any weight is copied.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional, Union

import torch

StateDict = dict[str, torch.Tensor]
ShapeTable = Mapping[str, tuple[int, ...]]

SAFETENSORS_SUFFIXES = (".safetensors", ".sft")
PICKLE_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")
DIFFUSERS_WEIGHT_NAMES = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors")


class CheckpointError(ValueError):
    """A file that is not a checkpoint of the expected architecture; the message says what it looks like."""


@dataclass
class KeyReport:
    """Differences between a state dict and an architecture's key/shape table."""

    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    wrong_shape: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.wrong_shape)

    def describe(self, limit: int = 12) -> str:
        parts = []
        for title, items in (("missing", self.missing), ("unexpected", self.unexpected)):
            if items:
                shown = ", ".join(items[:limit]) + (f", … (+{len(items) - limit} more)" if len(items) > limit else "")
                parts.append(f"{len(items)} {title} key(s): {shown}")
        if self.wrong_shape:
            shown = ", ".join(f"{k} {tuple(got)} (expected {tuple(exp)})" for k, got, exp in self.wrong_shape[:limit])
            parts.append(f"{len(self.wrong_shape)} wrong-shape key(s): {shown}")
        return "; ".join(parts)


def compare_keys(state_dict: Mapping[str, torch.Tensor], expected: ShapeTable) -> KeyReport:
    report = KeyReport()
    for key, shape in expected.items():
        if key not in state_dict:
            report.missing.append(key)
        elif tuple(state_dict[key].shape) != tuple(shape):
            report.wrong_shape.append((key, tuple(state_dict[key].shape), tuple(shape)))
    report.unexpected = sorted(k for k in state_dict if k not in expected)
    report.missing.sort()
    return report


# --------------------------------------------------------------------------------------------
# Architecture registry: each architecture module registers how to recognise and build itself.
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Architecture:
    """How to recognise a checkpoint family and build a model from it.

    `detect` returns True when the state dict has this family's signature keys (loose: the strict
    check happens in `build`). `build` receives the state dict (and an optional diffusers config)
    and returns a loaded `VAEModel`, raising CheckpointError on any key/shape mismatch.
    """

    name: str
    detect: Callable[[Mapping[str, torch.Tensor]], bool]
    build: Optional[Callable[..., "torch.nn.Module"]] = None
    priority: int = 0


# Filled by vae/registry.py, which registers the built-in families' architectures (and by tests or
# plugins through `register_architecture`); this module never imports an architecture package.
_ARCHITECTURES: list[Architecture] = []


def register_architecture(arch: Architecture) -> None:
    if any(a.name == arch.name for a in _ARCHITECTURES):
        _ARCHITECTURES[:] = [a for a in _ARCHITECTURES if a.name != arch.name]
    _ARCHITECTURES.append(arch)
    _ARCHITECTURES.sort(key=lambda a: -a.priority)


def unregister_architecture(name: str) -> None:
    """Forget the architecture registered under `name` (nothing when there is none)."""
    _ARCHITECTURES[:] = [a for a in _ARCHITECTURES if a.name != name]


def registered_architectures() -> list[Architecture]:
    return list(_ARCHITECTURES)


def _looks_like_sd_kl(sd: Mapping[str, torch.Tensor]) -> bool:
    """SD/SDXL/Flux-style 2-D KL autoencoders (diffusers or original LDM key names)."""
    for key in ("decoder.up_blocks.0.resnets.0.norm1.weight", "decoder.up.0.block.0.norm1.weight",
                "first_stage_model.decoder.up.0.block.0.norm1.weight"):
        w = sd.get(key)
        if w is not None:
            conv = sd.get(key.replace("norm1.weight", "conv1.weight"))
            return conv is None or conv.ndim == 4
    return False


# Recognised only to say what a file is; it has no builder.
SD_KL = Architecture("SD-style 2-D KL autoencoder (SD1.x/SDXL/SD3/Flux)", _looks_like_sd_kl, None, -10)


def detect_architecture(sd: Mapping[str, torch.Tensor]) -> Optional[Architecture]:
    for arch in registered_architectures():
        if arch.detect(sd):
            return arch
    return None


# Where other tools keep a VAE inside a bigger file: LDM-style bundles, training wrappers (EMA, DDP).
BUNDLE_PREFIXES = ("first_stage_model.", "vae.", "ema_vae.", "model.vae.", "module.", "model.")


@dataclass(frozen=True)
class Unwrapped:
    """A VAE state dict found under `prefix` of a larger/wrapped one; `ignored` keys lay outside it."""

    state_dict: StateDict
    prefix: str = ""
    ignored: int = 0


def unwrap_vae_keys(sd: Mapping[str, torch.Tensor]) -> Unwrapped:
    """The VAE part of `sd`: the whole dict if an architecture recognises it, else the keys under
    the first prefix (a prefix shared by every key, then the usual bundle prefixes) whose stripped
    keys an architecture recognises. Why: training wrappers save `module.`/`vae.`-prefixed keys and
    LDM-style bundles keep the VAE under `first_stage_model.`; the strict key/shape check still
    applies in full to what is returned. Falls back to `sd` unchanged, so the caller's error names
    what the file looks like.
    """
    if detect_architecture(sd) is not None or not sd:
        return Unwrapped(dict(sd))
    for prefix in _candidate_prefixes(sd):
        inner = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
        arch = detect_architecture(inner) if inner else None
        if arch is not None and arch.build is not None:
            return Unwrapped(inner, prefix, len(sd) - len(inner))
    return Unwrapped(dict(sd))


def _candidate_prefixes(sd: Mapping[str, torch.Tensor]) -> list[str]:
    """Dotted prefixes shared by every key (longest first), then the usual bundle prefixes."""
    keys = list(sd)
    parts = keys[0].split(".")[:-1]
    shared = [p for p in (".".join(parts[:i]) + "." for i in range(len(parts), 0, -1))
              if all(k.startswith(p) for k in keys)]
    return shared + [p for p in BUNDLE_PREFIXES if p not in shared]


# --------------------------------------------------------------------------------------------
# Reading files
# --------------------------------------------------------------------------------------------
def _unwrap(obj: object, path: str) -> StateDict:
    if isinstance(obj, Mapping):
        for nested in ("state_dict", "model", "module", "params_ema"):
            inner = obj.get(nested)
            if isinstance(inner, Mapping) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                obj = inner
                break
        tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        if tensors:
            return dict(tensors)
    raise CheckpointError(f"{path}: no tensors found; this does not look like a model checkpoint")


def resolve_checkpoint_path(path: Union[str, os.PathLike]) -> tuple[Path, Optional[dict]]:
    """A file, or a diffusers folder (`config.json` + `diffusion_pytorch_model.safetensors`, maybe under `vae/`)."""
    p = Path(path)
    if p.is_dir():
        for folder in (p, p / "vae"):
            for name in DIFFUSERS_WEIGHT_NAMES:
                if (folder / name).is_file():
                    cfg_file = folder / "config.json"
                    return folder / name, read_diffusers_config(cfg_file) if cfg_file.is_file() else None
        raise CheckpointError(f"{p}: folder has no diffusers VAE weights ({' or '.join(DIFFUSERS_WEIGHT_NAMES)})")
    if not p.exists():
        if p.is_symlink():
            raise CheckpointError(f"{p}: a symbolic link whose target is missing or loops back on itself; "
                                  "point it at the checkpoint file")
        raise FileNotFoundError(f"checkpoint not found: {p}")
    config = None
    sidecar = p.with_name("config.json")
    if p.name in DIFFUSERS_WEIGHT_NAMES and sidecar.is_file():
        config = read_diffusers_config(sidecar)
    return p, config


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colour codes (torch colours some errors)


def _first_line(error: BaseException, limit: int = 160) -> str:
    """The first line of an error message without terminal colour codes (torch's are long and coloured)."""
    text = [t.strip() for t in ANSI_ESCAPE.sub("", str(error)).strip().splitlines() if t.strip()]
    # torch's weights-only refusal puts the useful line ("Unsupported global: …") after a long preamble
    detail = [t for t in text if t.startswith("WeightsUnpickler error:")]
    line = (detail or text or ["no message"])[0]
    return line if len(line) <= limit else line[:limit - 1] + "…"


MAX_CONFIG_BYTES = 1 << 20  # a diffusers VAE config is about 1 kB


def read_diffusers_config(path: Path) -> dict:
    """A diffusers `config.json` as a dict; CheckpointError naming the file for anything else."""
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise CheckpointError(f"{path}: {path.stat().st_size} bytes, too large for a diffusers VAE config")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: not a readable diffusers config.json ({type(e).__name__}: {e}); fix or "
                              "delete the file (it only describes the architecture)") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: a diffusers config.json must hold a JSON object, got {type(data).__name__}")
    return data


def read_state_dict(path: Union[str, os.PathLike]) -> StateDict:
    """Tensors from a safetensors file, or from a pickle via `torch.load(weights_only=True)` only."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in SAFETENSORS_SUFFIXES:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(p))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{p}: not a readable safetensors file ({e}); is it truncated?") from e
    if suffix in PICKLE_SUFFIXES:
        try:
            obj = torch.load(str(p), map_location="cpu", weights_only=True, mmap=False)
        except pickle.UnpicklingError as e:  # torch's weights-only refusal: the file holds Python objects
            raise CheckpointError(
                f"{p}: holds Python objects besides tensors, which are not loaded (only torch.load(weights_only="
                f"True) is used: {_first_line(e)}). Save just the state dict, or convert it to .safetensors."
            ) from e
        except Exception as e:  # truncation and corruption surface as EOFError, IndexError, RuntimeError, OSError…
            raise CheckpointError(
                f"{p}: cannot be read; the file looks truncated or corrupted ({type(e).__name__}: {_first_line(e)}). "
                "Download or copy it again."
            ) from e
        return _unwrap(obj, str(p))
    raise CheckpointError(
        f"{p}: unsupported file type '{suffix}'; expected one of "
        f"{', '.join(SAFETENSORS_SUFFIXES + PICKLE_SUFFIXES)} or a diffusers folder"
    )


def architecture_error(sd: Mapping[str, torch.Tensor], expected_name: str, report: Optional[KeyReport] = None,
                       source: str = "state dict") -> CheckpointError:
    """A CheckpointError that says what the file looks like and what differs."""
    arch = detect_architecture(sd)
    looks = arch.name if arch else "no known VAE architecture"
    msg = f"{source} is not a valid {expected_name} checkpoint: it looks like {looks}"
    if report is not None and not report.ok:
        msg += f". {report.describe()}"
    return CheckpointError(msg)


def check_finite(sd: Mapping[str, torch.Tensor], source: str = "state dict") -> None:
    """CheckpointError when a floating-point weight holds NaN or Inf: such a file decodes to NaN images,
    so it is refused at load, naming the first bad tensor and how many there are."""
    bad = [k for k, t in sd.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise CheckpointError(f"{source}: weight {bad[0]}{more} contains NaN or Inf values; the file is damaged "
                              "or was saved after a diverged training step — use an intact copy")


def check_strict(sd: Mapping[str, torch.Tensor], expected: ShapeTable, expected_name: str,
                 source: str = "state dict") -> None:
    """Raise CheckpointError unless `sd` has exactly the keys and shapes of `expected`."""
    report = compare_keys(sd, expected)
    if not report.ok:
        raise architecture_error(sd, expected_name, report, source)
    for key, tensor in sd.items():
        if not tensor.is_floating_point():
            raise CheckpointError(f"{source}: tensor {key} has dtype {tensor.dtype}; expected floating point weights")
