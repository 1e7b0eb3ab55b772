"""Engine identity: a JSON sidecar saying what an engine was built from and for.

Standard TensorRT cannot tell whether a plan fits this GPU/version before deserialising it, and an
AOTInductor package for one device cannot run on another, so every engine carries this record and
it is checked first; any mismatch names the engine file and the settings to rebuild with.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Optional

import torch

from .backend import EngineLoadError
from .fileio import atomic_write_text, file_sha256

FORMAT_VERSION = 1


def sidecar_path(engine_path: Path) -> Path:
    """`decoder_1024x1024.pt2` -> `decoder_1024x1024.pt2.json`."""
    return engine_path.with_name(engine_path.name + ".json")


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


@dataclass(frozen=True)
class EngineIdentity:
    """Everything an engine's validity depends on, plus what the runner needs to use it."""

    model_hash: str
    model_kind: str
    component: str  # encoder | decoder | decode_slice_first | decode_slice_next
    dtype: str  # fp32 | fp16 | bf16
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
    # (the video slice engines' latents and causal memory). Empty for the image engines.
    input_shapes: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "EngineIdentity":
        data = json.loads(text)
        for key in ("input_names", "output_names", "entries"):
            data[key] = tuple(data[key])
        return cls(**data)

    def write(self, engine_path: Path, *, overwrite: bool = False) -> Path:
        return atomic_write_text(sidecar_path(engine_path), self.to_json(), overwrite=overwrite)


class IdentityError(EngineLoadError):
    """An engine that does not match this model, machine or software; the message says how to rebuild."""


def read_identity(engine_path: Path) -> EngineIdentity:
    side = sidecar_path(engine_path)
    if not side.is_file():
        raise IdentityError(f"{engine_path}: no identity file {side.name} next to it; engines built by other tools "
                            "are not loaded blindly — rebuild with `python -m turbovae build-engines`")
    try:
        ident = EngineIdentity.from_json(side.read_text())
    except (ValueError, TypeError, KeyError) as e:
        raise IdentityError(f"{side}: unreadable identity file ({e}); rebuild the engine") from e
    if ident.format_version != FORMAT_VERSION:
        raise IdentityError(f"{engine_path}: identity format {ident.format_version}, this TurboVAE reads "
                            f"{FORMAT_VERSION}; rebuild the engine")
    return ident


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
    size = engine_path.stat().st_size
    if ident.engine_bytes and size != ident.engine_bytes:
        raise IdentityError(f"{engine_path}: {size} bytes, expected {ident.engine_bytes} (truncated or replaced); "
                            "rebuild the engine")
    if ident.engine_sha256 and file_sha256(engine_path) != ident.engine_sha256:
        raise IdentityError(f"{engine_path}: content hash differs from its identity file (corrupt or replaced); "
                            "rebuild the engine")
