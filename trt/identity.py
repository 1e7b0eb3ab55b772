"""Engine identity: what one engine was built from and for (one record per engine in the folder's
manifest, trt/manifest.py).

Standard TensorRT cannot tell whether a plan fits this GPU/version before deserialising it, and an
AOTInductor package for one device cannot run on another, so every engine carries this record and
it is checked first; any mismatch names the engine file and the settings to rebuild with.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Mapping, Optional

import torch

from ..vae.dtypes import DTYPE_BY_NAME
from .interface import EngineLoadError
from .backends import BACKEND_NAMES
from .buckets import BucketTable
from .fileio import file_sha256
from .video import VIDEO_COMPONENTS

FORMAT_VERSION = 1


def model_hash(state_dict: Mapping[str, torch.Tensor]) -> str:
    """Hash of names, shapes and fp32 values: the same weights give the same hash in any file dtype."""
    h = hashlib.sha256()
    for key in sorted(state_dict):
        t = state_dict[key].detach().to("cpu", torch.float32).contiguous()
        h.update(key.encode())
        h.update(repr(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:32]


def device_facts(device: torch.device) -> dict:
    """What an engine is tied to on `device`: device type, GPU name and compute capability."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        idx = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(idx)
        return {"device_type": "cuda", "gpu_name": torch.cuda.get_device_name(idx),
                "compute_capability": f"{major}.{minor}"}
    return {"device_type": device.type, "gpu_name": None, "compute_capability": None}


COMPONENTS = ("encoder", "decoder")  # the image engines a set can hold (build's default: both)
KNOWN_COMPONENTS = COMPONENTS + VIDEO_COMPONENTS


class IdentityError(EngineLoadError):
    """An engine that does not match this model, machine or software, or whose recorded identity is
    malformed; the message says how to rebuild."""


@dataclass(frozen=True)
class EngineIdentity:
    """Everything an engine's validity depends on, plus what the runner needs to use it."""

    model_hash: str
    model_kind: str
    component: str  # encoder | decoder | decode_slice_first | decode_slice_next
    dtype: str  # fp32 | fp16 | bf16: every input and output of the engine
    table: dict  # BucketTable.to_json() of the whole set (shared by build and run)
    entries: tuple[int, ...]  # table entries this engine serves; position = its optimization profile
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    backend: str
    backend_version: str
    device_type: str
    gpu_name: Optional[str]
    compute_capability: Optional[str]
    torch_version: str
    engine_sha256: str = ""
    engine_bytes: int = 0
    source: Optional[str] = None  # checkpoint the engine was built from
    latent_format: dict = field(default_factory=dict)
    build_options: dict = field(default_factory=dict)
    # Static full shape of every input by name, for engines whose inputs the table alone does not give
    # (the video slice engines' latents and causal cache). Empty for the image engines.
    input_shapes: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "EngineIdentity":
        try:
            data = json.loads(text)
        except ValueError as e:
            raise IdentityError(f"engine identity is not valid JSON ({e}); rebuild the engine set") from e
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: object, where: str = "engine identity") -> "EngineIdentity":
        """Parse and check every field's type and range, so an edited or hostile file fails here with
        an IdentityError naming the field, never later as a KeyError/IndexError/ValueError in the runner."""
        return cls(**_checked_fields(data, where))

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPE_BY_NAME[self.dtype]


def _bad(where: str, key: str, why: str) -> IdentityError:
    return IdentityError(f"{where}: field {key!r} {why}; the file was edited or damaged — rebuild the engine set "
                         "(`python -m turbovae build-engines ... --overwrite`)")


def _checked_fields(data: object, where: str) -> dict:
    if not isinstance(data, dict):
        raise IdentityError(f"{where}: expected a JSON object, got {type(data).__name__}; rebuild the engine set")
    names = {f.name: f for f in fields(EngineIdentity)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise _bad(where, unknown[0], "is not an engine identity field")
    missing = [n for n, f in names.items() if n not in data and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise _bad(where, missing[0], "is missing")
    out = dict(data)

    def want(key: str, ok: bool, why: str) -> None:
        if key in out and not ok:
            raise _bad(where, key, why)

    for key in ("model_hash", "model_kind", "component", "dtype", "backend", "backend_version", "device_type",
                "torch_version", "engine_sha256"):
        want(key, isinstance(out.get(key), str), "must be a string")
    for key in ("gpu_name", "compute_capability", "source"):
        want(key, out.get(key) is None or isinstance(out.get(key), str), "must be a string or null")
    for key in ("engine_bytes", "format_version"):
        want(key, _is_int(out.get(key)) and out.get(key) >= 0, "must be a non-negative integer")
    if out.get("format_version", FORMAT_VERSION) != FORMAT_VERSION:
        raise IdentityError(f"{where}: identity format {out['format_version']}, this TurboVAE reads "
                            f"{FORMAT_VERSION}; rebuild the engine set")
    want("dtype", out.get("dtype") in DTYPE_BY_NAME, f"must be one of {', '.join(DTYPE_BY_NAME)}")
    want("backend", out.get("backend") in BACKEND_NAMES, f"must be one of {', '.join(BACKEND_NAMES)}")
    want("component", out.get("component") in KNOWN_COMPONENTS, f"must be one of {', '.join(KNOWN_COMPONENTS)}")
    for key in ("input_names", "output_names"):
        v = out.get(key)
        want(key, isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(n, str) and n for n in v)
             and len(set(v)) == len(v), "must be a non-empty list of distinct names")
        out[key] = tuple(v)
    for key in ("table", "latent_format", "build_options", "input_shapes"):
        want(key, isinstance(out.get(key, {}), dict), "must be an object")
    try:
        table = BucketTable.from_json(out["table"])
    except (KeyError, TypeError, ValueError) as e:
        raise _bad(where, "table", f"is not a valid bucket/profile table ({type(e).__name__}: {e})") from None
    entries = out.get("entries")
    want("entries", isinstance(entries, (list, tuple)) and len(entries) > 0
         and all(_is_int(e) and 0 <= e < table.size for e in entries) and len(set(entries)) == len(entries),
         f"must list distinct table entries 0..{table.size - 1}")
    out["entries"] = tuple(entries)
    lf = out.get("latent_format", {})
    if out["component"] in ("encoder", "decoder"):
        for key in ("channels", "spatial_factor"):
            want("latent_format", _is_int(lf.get(key)) and lf.get(key) > 0, f"needs a positive integer {key!r}")
        want("latent_format", table.multiple % lf["spatial_factor"] == 0,
             f"spatial_factor {lf['spatial_factor']} must divide the table multiple {table.multiple}")
    shapes = out.get("input_shapes", {})
    want("input_shapes", all(isinstance(s, (list, tuple)) and s and all(_is_int(d) and d > 0 for d in s)
                             for s in shapes.values()), "must map names to lists of positive sizes")
    want("input_shapes", not shapes or set(shapes) == set(out["input_names"]), "must give every input's shape")
    want("input_shapes", bool(shapes) or out["component"] in ("encoder", "decoder"),
         "must give the static input shapes of a video slice engine")
    return out


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def mismatches(ident: EngineIdentity, *, backend_version: str, device: torch.device,
               model_hash_now: Optional[str]) -> list[str]:
    """Reasons this engine cannot run here (empty = fine)."""
    out = []
    here = device_facts(device)
    if ident.device_type != here["device_type"]:
        out.append(f"built for {ident.device_type}, running on {here['device_type']}")
    elif here["device_type"] == "cuda":
        if ident.compute_capability != here["compute_capability"]:
            out.append(f"built for compute capability {ident.compute_capability} ({ident.gpu_name}), "
                       f"this GPU is {here['compute_capability']} ({here['gpu_name']})")
        elif ident.gpu_name != here["gpu_name"]:
            out.append(f"built on {ident.gpu_name}, this GPU is {here['gpu_name']}")
    if ident.backend_version != backend_version:
        out.append(f"built with {ident.backend} {ident.backend_version}, installed {backend_version}")
    if model_hash_now is not None and ident.model_hash != model_hash_now:
        out.append(f"built from different weights (model hash {ident.model_hash}, checkpoint has {model_hash_now})")
    return out


def verify_file(engine_path: Path, ident: EngineIdentity) -> None:
    """Size and SHA-256 against the sidecar: catches truncated/corrupt engines before deserialising."""
    try:
        size = engine_path.stat().st_size
    except OSError as e:
        raise IdentityError(f"{engine_path}: listed in the manifest but not readable ({e.strerror}); "
                            "rebuild the engine set") from e
    if size != ident.engine_bytes:
        raise IdentityError(f"{engine_path}: {size} bytes, expected {ident.engine_bytes} (truncated or replaced); "
                            "rebuild the engine")
    if file_sha256(engine_path) != ident.engine_sha256:
        raise IdentityError(f"{engine_path}: content hash differs from its identity file (corrupt or replaced); "
                            "rebuild the engine")
