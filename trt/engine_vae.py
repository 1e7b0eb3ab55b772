"""`load_engine_vae`: a TurboVAE whose single-frame encode/decode (and, with SeedVR2 video slice
engines, clip decode) run engines, with PyTorch fallback.

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
from typing import Callable, Mapping, Optional, Union

import torch

from ..vae.api import TurboVAE, load_vae
from ..vae.base import VAEModel
from .backend import EngineError, EngineRunError
from .engine_set import EngineSet, engine_files
from .identity import IdentityError, model_hash, read_identity
from .video import SLICE_FIRST

log = logging.getLogger(__name__)


class EngineFallbackWarning(RuntimeWarning):
    """The engine path could not be used; PyTorch ran instead."""


class EngineVAE(TurboVAE):
    """TurboVAE with engines for single frames (T = 1) and, where the set has SeedVR2 video slice
    engines, for decoding clips (T >= 2 latents); everything else and every failure uses PyTorch."""

    VIDEO = "video decoder"  # fallback/warning key of the slice-engine path

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
            # One channel only: a log record *and* a warning printed the same line twice on a console.
            warnings.warn(message, EngineFallbackWarning, stacklevel=3)

    def _usable(self, key: str, component: str) -> bool:
        return self.engines is not None and key not in self._disabled and component in self.engines.components

    def _guarded(self, key: str, x: torch.Tensor,
                 run_one: Callable[[torch.Tensor], torch.Tensor]) -> Optional[torch.Tensor]:
        """`run_one` on each sample of a 5-D batch, concatenated; None (after one warning) on any failure.

        A size outside every bucket warns once per size and keeps the engines; any other failure
        disables this path (`key`) for good, since it would fail again.
        """
        x = x.to(self.engines.device)  # engines stay on their device even when the model is offloaded
        try:
            outs = [run_one(x[i:i + 1]) for i in range(x.shape[0])]
        except EngineRunError as e:
            if "outside every" in str(e):
                h, w = x.shape[-2:]
                self._warn(f"shape:{key}:{h}x{w}", f"TurboVAE engine: {e}; using PyTorch for this size")
                return None
            self._fail(key, e)
            return None
        except (EngineError, RuntimeError) as e:
            self._fail(key, e)
            return None
        self.engine_calls += 1
        return torch.cat(outs).to(device=self.device, dtype=self.dtype)

    def _engine(self, component: str, x: torch.Tensor) -> Optional[torch.Tensor]:
        """Engine output for a 5-D single-frame batch, or None when the PyTorch path must run."""
        if x.shape[2] != 1 or not self._usable(component, component):
            return None
        f = self.spatial_factor
        return self._guarded(component, x, lambda s: self.engines.run(component, s[:, :, 0], f).unsqueeze(2))

    def _engine_clip(self, z: torch.Tensor) -> Optional[torch.Tensor]:
        """Pixels of a 5-D clip (T >= 2 latents) from the video slice engines, or None for PyTorch."""
        if z.shape[2] < 2 or not self._usable(self.VIDEO, SLICE_FIRST):
            return None
        f, tf = self.spatial_factor, self.temporal_factor
        return self._guarded(self.VIDEO, z, lambda s: self.engines.run_clip(s, f, tf))

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

    def run_decode(self, z: torch.Tensor, *, temporal_slice: Optional[int] = None) -> torch.Tensor:
        """Images on the decoder engine, clips on the slice engines (`temporal_slice` does not apply:
        each engine call is one latent); `decode` keeps the checks, num_frames trimming and 4-D rules."""
        out = self._engine("decoder", z) if z.shape[2] == 1 else self._engine_clip(z)
        if out is not None:
            return out
        return super().run_decode(z, temporal_slice=temporal_slice)

    def tile_pass(self, *, decode: bool) -> Callable[[torch.Tensor], torch.Tensor]:
        """Fast tiles on the engines: a tile (one temporal slice) runs like a whole input would — image
        and clip decode, image encode — and on PyTorch where no engine serves its size."""
        model_pass = super().tile_pass(decode=decode)

        def run(x: torch.Tensor) -> torch.Tensor:
            if decode:
                out = self._engine("decoder", x) if x.shape[2] == 1 else self._engine_clip(x)
            else:
                out = self._engine("encoder", x)
            return out if out is not None else model_pass(x)

        return run

    # -- memory --------------------------------------------------------------------------------
    def engine_memory_bytes(self) -> int:
        return self.engines.memory_bytes() if self.engines is not None else 0

    def engine_footprint_bytes(self) -> int:
        """Device memory the engines hold once all are loaded (see `EngineSet.footprint_bytes`)."""
        return self.engines.footprint_bytes() if self.engines is not None else 0

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
