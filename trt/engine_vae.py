"""`load_engine_vae`: a TurboVAE whose single-frame encode/decode (and, with video slice engines,
clip decode) run engines, with PyTorch fallback.

Anything that goes wrong — TensorRT missing, identity mismatch, a corrupt file, a shape outside
every bucket/profile, out of memory, an execution error — gives one clear warning and the PyTorch
path (the checkpoint the engines were built from, or `fallback=`). Never a wrong or resized image:
outputs are cropped back to the request and shape-checked.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, Union

import torch

from ..vae.accel.self_checks import oom_may_switch_off
from ..vae.api import TurboVAE
from ..vae.loader import load_checkpoint, resolve_device
from ..vae.planning import PassPlan
from ..vae.base import Progress, VAEModel
from ..vae.memory.oom import OOM_FAILURES_TO_DISABLE, OomStreak, describe, is_out_of_memory, release_cached
from .interface import EngineError
from .engine_set import EngineSet, SizeNotServed, load_manifest
from .formats import is_engine_path
from .identity import IdentityError, model_hash
from .manifest import ManifestError, recorded_source
from .model_folders import climbs_out, describe_roots, in_model_folders
from .video import SLICE_FIRST

log = logging.getLogger(__name__)

ENGINE_OOM_FAILURES_TO_DISABLE = OOM_FAILURES_TO_DISABLE  # the one rule (vae/memory/oom.py), named for the engines


class EngineFallbackWarning(RuntimeWarning):
    """The engine path could not be used; PyTorch ran instead."""


class ApproximateResultWarning(UserWarning):
    """An input ran padded into a larger bucket (opted in with pad_to_bucket): close to, not equal to, PyTorch."""


class EngineSourceError(ValueError):
    """The checkpoint an engine folder names for its PyTorch path cannot be used (it is the engine folder
    itself, another engine folder, or lies outside the folders the caller allows)."""


class EngineVAE(TurboVAE):
    """TurboVAE with engines for single frames (T = 1) and, where the set has video slice engines
    (SeedVR2, Qwen-Image / Wan 2.1, Wan 2.2), for decoding clips (T >= 2 latents); everything else and
    every failure uses PyTorch."""

    VIDEO = "video decoder"  # fallback/warning key of the slice-engine path

    def __init__(self, model: VAEModel, engines: Optional[EngineSet], source: Optional[str] = None):
        if engines is not None and engines.kind != model.kind:
            # Why here: this is where engines meet a model. A SeedVR2 set next to a Wan model (or the reverse)
            # would run its own graphs on the other's latents; load_engine_vae falls back instead of this.
            raise IdentityError(f"{engines.path}: engines built for a {engines.kind} VAE cannot serve a {model.kind} "
                                "model; load them with their own checkpoint or rebuild them from this one")
        super().__init__(model, source=source)
        self.engines = engines
        self._disabled: dict[str, str] = {}
        self._warned: set[str] = set()
        self._oom_streak = OomStreak(ENGINE_OOM_FAILURES_TO_DISABLE)  # out-of-memory failures in a row, per path
        self.engine_calls = 0  # runs served by engines (tests and benchmarks read it)

    def __repr__(self) -> str:
        eng = self.engines.describe() if self.engines is not None else "none"
        return f"EngineVAE(kind={self.kind!r}, engines={eng}, fallback={self.source!r})"

    def _warn(self, key: str, message: str, category: type[Warning] = EngineFallbackWarning) -> None:
        if key not in self._warned:
            self._warned.add(key)
            # One channel only: a log record *and* a warning printed the same line twice on a console.
            warnings.warn(message, category, stacklevel=3)

    def _usable(self, key: str, component: str) -> bool:
        return self.engines is not None and key not in self._disabled and component in self.engines.components

    def _guarded(self, key: str, x: torch.Tensor,
                 run_one: Callable[[torch.Tensor], torch.Tensor]) -> Optional[torch.Tensor]:
        """`run_one` on each sample of a 5-D batch, concatenated; None (after one warning) on any failure.

        A size outside every bucket warns once per size and keeps the engines; an out-of-memory is
        transient (other models resident): PyTorch runs this call, the engine is tried again on the next,
        and only `ENGINE_OOM_FAILURES_TO_DISABLE` in a row disable it; any other failure disables this path
        (`key`) for good, since it would fail again.
        """
        x = x.to(self.engines.device)  # engines stay on their device even when the model is offloaded
        h, w = x.shape[-2:]
        out_of_memory: Optional[str] = None
        try:
            outs = [run_one(x[i:i + 1]) for i in range(x.shape[0])]
        except SizeNotServed as e:
            self._warn(f"shape:{key}:{h}x{w}", f"TurboVAE engine: {e}; using PyTorch for this size")
            return None
        except (EngineError, RuntimeError, MemoryError) as e:
            if not is_out_of_memory(e):
                self._fail(key, e)
                return None
            out_of_memory = describe(e)
        if out_of_memory is not None:  # outside the except block: the failed run's memory can be released
            self._out_of_memory(key, out_of_memory)
            return None
        self._oom_streak.succeeded(key)
        if self.engines.pad_to_bucket:
            f = 1 if key == "encoder" else self.spatial_factor
            sel = self.engines.table.choose(h * f, w * f)
            if sel is not None and not sel.exact:
                self._warn(f"padded:{key}:{h}x{w}", f"TurboVAE engine: {w * f}x{h * f} px ran padded into "
                           f"{sel.label} (pad_to_bucket): the result is approximate, not equal to PyTorch",
                           ApproximateResultWarning)
        self.engine_calls += 1
        out = outs[0] if len(outs) == 1 else torch.cat(outs)  # one sample: no copy of the whole output
        return out.to(device=self.device, dtype=self.dtype)

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

    def _out_of_memory(self, key: str, reason: str) -> None:
        release_cached(self.engines.device)
        streak = self._oom_streak.failed(key)
        if self._oom_streak.exhausted(key) and oom_may_switch_off("engines"):
            self._fail(key, f"out of memory {streak} times in a row; last: {reason}")
        else:
            self._warn(f"oom:{key}", f"TurboVAE engine {key} ran out of memory ({reason}); using PyTorch for this "
                                     "call, the engine is tried again on the next")

    def _fail(self, component: str, err: Union[Exception, str]) -> None:
        self._disabled[component] = str(err)
        self._warn(f"fail:{component}", f"TurboVAE engine {component} failed ({err}); using PyTorch from now on")

    def run_encode(self, x: torch.Tensor, *, plan: PassPlan, progress: Progress = None,
                   output_device=None) -> torch.Tensor:
        """Images on the encoder engine; the rest on PyTorch as `plan` says."""
        if x.shape[2] == 1:
            out = self._engine("encoder", x)
            if out is not None:
                return out
        return super().run_encode(x, plan=plan, progress=progress, output_device=output_device)

    def run_decode(self, z: torch.Tensor, *, plan: PassPlan, progress: Progress = None,
                   output_device=None) -> torch.Tensor:
        """Images on the decoder engine, clips on the slice engines (the plan's slices do not apply: each engine
        call is one latent); PyTorch as `plan` says where no engine serves. `decode` keeps the checks, the plan,
        num_frames trimming and 4-D rules."""
        out = self._engine("decoder", z) if z.shape[2] == 1 else self._engine_clip(z)
        if out is not None:
            return out
        return super().run_decode(z, plan=plan, progress=progress, output_device=output_device)

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
                    lazy: bool = False, pad_to_bucket: bool = False,
                    source_roots: Optional[Sequence[Union[str, os.PathLike]]] = None) -> EngineVAE:
    """An engine folder (or one engine file in it) -> EngineVAE.

    The manifest is read once. The PyTorch model comes from `fallback` or, when not given, from the
    checkpoint the manifest records; `source_roots` (the UI passes the VAE model folders) confines
    that recorded path. The model is loaded in fp32 on the CPU, hashed like the build hashed it, moved
    to `dtype`/`device`, and handed to the engine VAE. Any engine problem gives one warning and the
    PyTorch path; a checkpoint that cannot be found or used raises (there is nothing to fall back to).
    """
    path = Path(path)
    device = resolve_device(device)
    if not (path.is_dir() or path.is_file()):
        raise FileNotFoundError(f"engine folder or file not found: {path}")
    manifest, problem = None, None
    try:
        manifest = load_manifest(path)
    except IdentityError as e:
        problem = e
    folder = path if path.is_dir() else path.parent
    recorded = manifest.entries[0].identity.source if manifest is not None else recorded_source(folder)
    checkpoint = fallback if fallback is not None else recorded
    if checkpoint is None and problem is not None:
        raise ManifestError(f"{problem} (or pass fallback=<checkpoint> to run this VAE on PyTorch)") from problem
    if checkpoint is None:
        raise FileNotFoundError(
            f"{path}: the engines need their checkpoint for the PyTorch path and it is not recorded "
            f"({problem or 'no source in the manifest'}); pass fallback=<checkpoint> (node: the fallback VAE input)")
    if not isinstance(checkpoint, Mapping):
        checkpoint = check_source(Path(checkpoint), folder, source_roots if fallback is None else None)
    # The manifest's hash is of the fp32 weights (as `build_engine_set` hashes them): load fp32 on the CPU,
    # hash, then move to the requested dtype/device.
    base = load_checkpoint(checkpoint, dtype=torch.float32, device="cpu")
    weights_hash = model_hash(base.model.state_dict())
    base.to(device=device, dtype=dtype if dtype is not None else torch.float32)
    engines = None
    if manifest is not None:
        kinds = {e.identity.model_kind for e in manifest.entries}
        here = json.loads(json.dumps(asdict(base.latent_format)))  # as the manifest stores it (lists, not tuples)
        formats = [e.identity.latent_format for e in manifest.entries]
        if kinds != {base.kind}:
            problem = IdentityError(f"{path}: built for a {', '.join(sorted(kinds))} VAE, the fallback is {base.kind}")
        elif any(here.get(k) != v for lf in formats for k, v in lf.items()):
            problem = IdentityError(f"{path}: the manifest's latent format differs from the checkpoint's ({here}); "
                                    "rebuild the engine set")
        else:
            try:
                engines = EngineSet(manifest, device, model_hash=weights_hash, lazy=lazy, pad_to_bucket=pad_to_bucket)
            except (EngineError, OSError) as e:
                problem = e
    vae = EngineVAE(base.model, engines, source=base.source)
    if problem is not None:
        vae._warn("load", f"TurboVAE: engines in {path} are not used ({problem}); running PyTorch")
    elif engines.pad_to_bucket:
        log.warning("TurboVAE: %s runs sizes between buckets padded (pad_to_bucket): those results are approximate",
                    path)
    return vae


def check_source(source: Path, engine_folder: Path, roots: Optional[Sequence[Union[str, os.PathLike]]]) -> Path:
    """The checkpoint an engine folder's manifest names, made safe to load: it must exist, must not be
    an engine folder (the engine folder itself would recurse), and must be a file the user keeps in `roots`
    when given (directly, linked in, or under a linked folder; trt/model_folders.py)."""
    try:
        real = source.resolve(strict=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"{engine_folder}: the engines need their checkpoint for the PyTorch path and it "
                                f"was not found ({source}); pass fallback=<checkpoint> (node: the fallback VAE "
                                "input)") from None
    except (OSError, RuntimeError) as e:  # a symlink loop: ELOOP (OSError) or RuntimeError on older Pythons
        raise EngineSourceError(f"{engine_folder}: the recorded checkpoint {source} cannot be resolved ({e}); "
                                "pass fallback=<checkpoint>") from None
    folder = engine_folder.resolve()
    if real == folder or folder in real.parents or is_engine_path(real):
        raise EngineSourceError(f"{engine_folder}: the recorded checkpoint {source} is an engine folder or file, "
                                "not a VAE checkpoint; pass fallback=<checkpoint> or rebuild the engines from the "
                                "checkpoint")
    if roots is not None and not in_model_folders(source, real, roots):
        how = "climbs out of" if climbs_out(source) else "is outside"
        raise EngineSourceError(f"{engine_folder}: the recorded checkpoint {source} {how} the VAE model folder(s) "
                                f"{describe_roots(roots)} (a file there, linked in or under an extra_model_paths "
                                "root, is allowed); pick a fallback VAE from the list")
    return real
