"""`load_engine_vae`: a TurboVAE whose single-frame encode/decode run engines, with PyTorch fallback.

Anything that goes wrong — TensorRT missing, identity mismatch, a corrupt file, a shape outside
every bucket/profile, out of memory, an execution error — gives one clear warning and the PyTorch
path (the checkpoint the engines were built from, or `fallback=`). Never a wrong or resized image:
outputs are cropped back to the request and shape-checked.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Mapping, Optional, Union

import torch

from ..vae.api import TurboVAE, load_vae
from ..vae.base import VAEModel
from .backend import EngineError, EngineRunError
from .engine_set import EngineSet, engine_files
from .identity import IdentityError, model_hash, read_identity

log = logging.getLogger(__name__)


class EngineFallbackWarning(RuntimeWarning):
    """The engine path could not be used; PyTorch ran instead."""


class EngineVAE(TurboVAE):
    """TurboVAE with engines for single frames (T = 1); clips and failures use the PyTorch model."""

    def __init__(self, model: VAEModel, engines: Optional[EngineSet], source: Optional[str] = None):
        super().__init__(model, source=source)
        self.engines = engines
        self._disabled: dict[str, str] = {}
        self._warned: set[str] = set()
        self.engine_calls = 0  # runs served by engines (tests and benchmarks read it)

    def __repr__(self) -> str:
        eng = self.engines.describe() if self.engines is not None else "none"
        return f"EngineVAE(kind={self.kind!r}, engines={eng}, fallback={self.source!r})"

    def _warn(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)
            warnings.warn(message, EngineFallbackWarning, stacklevel=3)

    def _engine(self, component: str, x: torch.Tensor) -> Optional[torch.Tensor]:
        """Engine output for a 5-D single-frame batch, or None when the PyTorch path must run."""
        if self.engines is None or component in self._disabled or x.shape[2] != 1:
            return None
        if component not in self.engines.components:
            return None
        f = self.spatial_factor
        x = x.to(self.engines.device)  # engines stay on their device even when the model is offloaded
        try:
            outs = [self.engines.run(component, x[i:i + 1, :, 0], f) for i in range(x.shape[0])]
        except EngineRunError as e:
            if "outside every" in str(e):
                h, w = x.shape[-2:]
                self._warn(f"shape:{component}:{h}x{w}", f"TurboVAE engine: {e}; using PyTorch for this size")
                return None
            self._fail(component, e)
            return None
        except (EngineError, RuntimeError) as e:
            self._fail(component, e)
            return None
        self.engine_calls += 1
        return torch.cat(outs).unsqueeze(2).to(device=self.device, dtype=self.dtype)

    def _fail(self, component: str, err: Exception) -> None:
        self._disabled[component] = str(err)
        self._warn(f"fail:{component}", f"TurboVAE engine {component} failed ({err}); using PyTorch from now on")

    def encode_moments(self, pixels: torch.Tensor, *, temporal_slice: Optional[int] = None) -> torch.Tensor:
        x = self.pad_frames(self.check_pixels(pixels))
        if x.shape[2] == 1:
            out = self._engine("encoder", x)
            if out is not None:
                return out
        return super().encode_moments(pixels, temporal_slice=temporal_slice)

    def decode(self, latents: torch.Tensor, *, temporal_slice: Optional[int] = None,
               num_frames: Optional[int] = None) -> torch.Tensor:
        z = self.check_latents(latents)
        if z.shape[2] == 1 and num_frames in (None, 1):
            out = self._engine("decoder", z)
            if out is not None:
                return out.squeeze(2) if latents.ndim == 4 else out
        return super().decode(latents, temporal_slice=temporal_slice, num_frames=num_frames)

    # -- memory --------------------------------------------------------------------------------
    def engine_memory_bytes(self) -> int:
        return self.engines.memory_bytes() if self.engines is not None else 0

    def release_engines(self) -> None:
        if self.engines is not None:
            self.engines.release()


def load_engine_vae(path: Union[str, os.PathLike], *, dtype: Optional[torch.dtype] = None,
                    device: Union[None, str, torch.device] = None,
                    fallback: Union[None, str, os.PathLike, Mapping[str, torch.Tensor]] = None,
                    lazy: bool = False) -> EngineVAE:
    """An engine file or folder -> EngineVAE. The PyTorch model comes from `fallback` or, when not
    given, from the checkpoint recorded in the engines' identity files."""
    path = Path(path)
    device = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    files = engine_files(path)
    ident = None
    problem = None
    try:
        ident = read_identity(files[0])
    except IdentityError as e:
        problem = e
    checkpoint = fallback if fallback is not None else (ident.source if ident else None)
    if checkpoint is None or (not isinstance(checkpoint, Mapping) and not Path(checkpoint).exists()):
        raise FileNotFoundError(
            f"{path}: the engines need their checkpoint for the PyTorch path and it was not found "
            f"({checkpoint or 'not recorded'}); pass fallback=<checkpoint> (node: the fallback VAE input)")
    # The identity hash is of the fp32 weights (as `build_engine_set` hashes them): load fp32 on the CPU,
    # hash, then move to the requested dtype/device.
    base = load_vae(checkpoint, dtype=torch.float32, device="cpu")
    weights_hash = model_hash(base.model.state_dict())
    base.to(device=device, dtype=dtype if dtype is not None else torch.float32)
    source = base.source
    if ident is not None and ident.model_kind != base.kind:
        problem = IdentityError(f"{files[0]}: built for a {ident.model_kind} VAE, the fallback is {base.kind}")
    engines = None
    if problem is None:
        try:
            engines = EngineSet(path, device, model_hash=weights_hash, lazy=lazy)
        except (EngineError, OSError) as e:
            problem = e
    vae = EngineVAE(base.model, engines, source=source)
    if problem is not None:
        vae._warn("load", f"TurboVAE: engines in {path} are not used ({problem}); running PyTorch")
    return vae
