"""Build an engine set for a loaded VAE: one table, every component, identity sidecars."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from .backend import BuildProgress, BuildSpec, get_backend
from .buckets import BucketTable
from .engine_set import COMPONENTS, IO_NAMES, component_profiles
from .fileio import file_sha256, refuse_existing
from .identity import EngineIdentity, device_facts, model_hash, sidecar_path

log = logging.getLogger(__name__)

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def engine_name(component: str, table: BucketTable, entries: Sequence[int], suffix: str) -> str:
    if len(entries) > 1:
        return f"{component}_profiles{suffix}"
    e = entries[0]
    label = table.profiles[e].name if table.mode == "multi_profile" else table.buckets[e].name
    return f"{component}_{label}{suffix}"


def plan_engines(backend_name: str, table: BucketTable) -> list[tuple[int, ...]]:
    """Which table entries share one engine file: TensorRT puts all profiles in one engine (weights
    once); static buckets and AOTInductor packages are one entry per file."""
    n = len(table.profiles) if table.mode == "multi_profile" else len(table.buckets)
    if backend_name == "tensorrt" and table.mode == "multi_profile":
        return [tuple(range(n))]
    return [(i,) for i in range(n)]


def build_engine_set(vae, out_dir: Path, table: BucketTable, *, backend: str = "aoti",
                     dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None,
                     components: Sequence[str] = COMPONENTS, overwrite: bool = False,
                     progress: Optional[BuildProgress] = None, source: Optional[str] = None,
                     optimization_level: int = 3) -> list[Path]:
    """Build every (component, entry group) engine of `table` into `out_dir`; return the engine paths.

    `vae` is a TurboVAE (its model provides `image_encoder()` / `image_decoder()`), loaded in fp32: the
    identity hash is taken from its weights and the loader hashes the fp32 checkpoint the same way.
    Existing files are refused before any work unless `overwrite=True`.
    """
    progress = progress or BuildProgress(lambda m, _f: log.info(m))
    be = get_backend(backend)
    device = torch.device(device) if device is not None else vae.device
    be.check_available(device)
    table.validate()
    if vae.dtype != torch.float32:
        raise ValueError(f"build engines from the fp32 model (got {vae.dtype}); the engine dtype is the dtype= "
                         "argument")
    lf = vae.latent_format
    if table.multiple % lf.spatial_factor:
        raise ValueError(f"table multiple {table.multiple} is not a multiple of the VAE factor {lf.spatial_factor}")
    for c in components:
        if c not in COMPONENTS:
            raise ValueError(f"unknown component {c!r}; use {', '.join(COMPONENTS)}")
    out_dir = Path(out_dir)
    groups = plan_engines(backend, table)
    jobs = [(c, g, out_dir / engine_name(c, table, g, be.suffix)) for c in components for g in groups]
    for _c, _g, p in jobs:
        refuse_existing(p, overwrite)
        refuse_existing(sidecar_path(p), overwrite)
    progress.report(f"hashing weights of {source or vae.source}")
    mhash = model_hash(vae.model.state_dict())
    facts = device_facts(device)
    written = []
    for n, (component, entries, path) in enumerate(jobs):
        progress.check_cancel()
        progress.report(f"engine {n + 1}/{len(jobs)}: {path.name}", n / len(jobs))
        module = vae.model.image_encoder() if component == "encoder" else vae.model.image_decoder()
        profiles = component_profiles(component, table, entries, lf.channels, lf.spatial_factor)
        ins, outs = IO_NAMES[component]
        axis_factor = table.multiple // (1 if component == "encoder" else lf.spatial_factor)
        spec = BuildSpec(input_names=ins, output_names=outs, dtype=dtype, device=device, profiles=tuple(profiles),
                         dims={ins[0]: {2: ("h", axis_factor), 3: ("w", axis_factor)}},
                         optimization_level=optimization_level)
        example = [torch.randn(profiles[0][ins[0]][1], generator=torch.Generator().manual_seed(0))]
        be.build(module, example, spec, path, progress, overwrite=overwrite)
        ident = EngineIdentity(
            model_hash=mhash, model_kind=vae.kind, component=component, dtype=DTYPE_NAMES[dtype],
            table=table.to_json(), entries=tuple(entries), input_names=ins, output_names=outs,
            backend=be.name, backend_version=be.version(), torch_version=torch.__version__,
            engine_sha256=file_sha256(path), engine_bytes=path.stat().st_size,
            source=str(Path(source).resolve()) if source else vae.source, latent_format=asdict(lf),
            build_options={"optimization_level": optimization_level}, **facts)
        ident.write(path, overwrite=overwrite)
        written.append(path)
    progress.report(f"done: {len(written)} engine(s) in {out_dir}", 1.0)
    return written
