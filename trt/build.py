"""Build an engine set for a loaded VAE: one table, every component, one manifest.

All or nothing: every engine is written under a hidden temporary name first; only when all are built
are they published under their final names (atomically, never over an existing file without
`overwrite`), and the manifest that makes the folder a loadable set is written last. A failure or a
Cancel removes the temporary files, so the folder keeps its previous state (or has no manifest, which
the loader refuses with a message to rebuild).
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence

import torch
from torch import nn

from ..vae.accel.channels_last import settle_for_trace
from ..vae.dtypes import dtype_name
from .interface import BuildProgress, BuildSpec
from .backends import get_backend
from .buckets import BucketTable
from .engine_set import IO_NAMES, component_profiles
from .fileio import file_sha256, publish, refuse_existing, temporary_name
from .identity import COMPONENTS, EngineIdentity, device_facts, model_hash
from .manifest import MANIFEST_NAME, Manifest, ManifestEntry
from .video import (
    VIDEO_COMPONENTS,
    check_slice_latents,
    check_video_model,
    default_slice_latents,
    example_inputs,
    slice_io,
    slice_module,
)

log = logging.getLogger(__name__)


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


def plan_video_engines(table: BucketTable) -> list[tuple[int, ...]]:
    """One first/next pair per static bucket. Slice engines are static-shape (their causal cache has a
    fixed size per latent size), so a multi-profile table is refused rather than silently padded."""
    if table.mode == "multi_profile":
        raise ValueError("video slice engines are static-shape: build them with --static or --multi-ratio buckets "
                         "(one pair per clip size; a multi-profile table has no fixed size to build them at)")
    return [(i,) for i in range(len(table.buckets))]


@dataclass(frozen=True)
class EngineJob:
    """One engine file to write: which component, which table entries, where."""

    component: str
    entries: tuple[int, ...]
    path: Path


@dataclass
class GraphPlan:
    """What one job exports: the module, example inputs and the spec (plus static shapes to record)."""

    module: nn.Module
    example: list[torch.Tensor]
    spec: BuildSpec
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


def _check_components(components: Sequence[str], video: bool) -> None:
    for c in components:
        if c in VIDEO_COMPONENTS:
            raise ValueError(f"{c} is built with video=True (CLI: --video), not through components")
        if c not in COMPONENTS:
            raise ValueError(f"unknown component {c!r}; use {', '.join(COMPONENTS)}")
    if not components and not video:
        raise ValueError("nothing to build: give at least one component or video=True")


def plan_jobs(table: BucketTable, backend_name: str, suffix: str, out_dir: Path, components: Sequence[str],
              video: bool) -> list[EngineJob]:
    """Every engine file of the set, image components first, then the video slice pairs."""
    groups = plan_engines(backend_name, table)
    jobs = [EngineJob(c, g, out_dir / engine_name(c, table, g, suffix)) for c in components for g in groups]
    if video:
        for g in plan_video_engines(table):
            jobs += [EngineJob(c, g, out_dir / engine_name(c, table, g, suffix)) for c in VIDEO_COMPONENTS]
    return jobs


def preflight(out_dir: Path, table: BucketTable, *, backend: str, device: torch.device,
              components: Sequence[str] = COMPONENTS, video: bool = False, overwrite: bool = False,
              slice_latents: Optional[int] = None) -> list[EngineJob]:
    """Every check that needs no model: `slice_latents` only with video and in range, backend usable on
    `device`, table valid, components known, and no file to be written already there (unless `overwrite`).
    Returns the planned jobs. Why separate: a caller can fail fast before loading a checkpoint (or, in
    ComfyUI, before evicting every model)."""
    if slice_latents is not None:
        if not video:
            raise ValueError("slice_latents sets the video slice engines; build with video on (CLI: add --video) "
                             "or leave it unset")
        check_slice_latents(slice_latents)
    be = get_backend(backend)
    be.check_available(torch.device(device))
    table.validate()
    _check_components(components, video)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"{out_dir} exists and is not a folder; choose another output folder")
    jobs = plan_jobs(table, backend, be.suffix, out_dir, components, video)
    refuse_existing(out_dir / MANIFEST_NAME, overwrite)
    for job in jobs:
        refuse_existing(job.path, overwrite)
    return jobs


def image_plan(vae, job: EngineJob, table: BucketTable, dtype: torch.dtype, device: torch.device,
               optimization_level: int) -> GraphPlan:
    lf = vae.latent_format
    component = job.component
    module = vae.model.image_encoder() if component == "encoder" else vae.model.image_decoder()
    profiles = component_profiles(component, table, job.entries, lf.channels, lf.spatial_factor,
                                  image_channels=lf.image_channels)
    ins, outs = IO_NAMES[component]
    axis_factor = table.multiple // (1 if component == "encoder" else lf.spatial_factor)
    spec = BuildSpec(input_names=ins, output_names=outs, dtype=dtype, device=device, profiles=tuple(profiles),
                     dims={ins[0]: {2: ("h", axis_factor), 3: ("w", axis_factor)}},
                     optimization_level=optimization_level)
    example = [torch.randn(profiles[0][ins[0]][1], generator=torch.Generator().manual_seed(0))]
    return GraphPlan(module, example, spec)


def slice_plan(vae, job: EngineJob, table: BucketTable, dtype: torch.dtype, device: torch.device,
               optimization_level: int, slice_latents: int = 1) -> GraphPlan:
    """A static first (1 + k latents) or next (k latents) slice graph at the bucket's latent size (batch 1)."""
    f = vae.latent_format.spatial_factor
    bucket = table.buckets[job.entries[0]]
    io = slice_io(vae.model, job.component, (bucket.height // f, bucket.width // f), slice_latents)
    profile = {name: (shape, shape, shape) for name, shape in io.input_shapes.items()}
    spec = BuildSpec(input_names=io.input_names, output_names=io.output_names, dtype=dtype, device=device,
                     profiles=(profile,), dims={}, optimization_level=optimization_level)
    return GraphPlan(slice_module(vae.model, job.component), example_inputs(io), spec, dict(io.input_shapes))


def build_engine_set(vae, out_dir: Path, table: BucketTable, *, backend: str = "aoti",
                     dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None,
                     components: Sequence[str] = COMPONENTS, video: bool = False, overwrite: bool = False,
                     progress: Optional[BuildProgress] = None, source: Optional[str] = None,
                     optimization_level: int = 3, pad_to_bucket: bool = False,
                     slice_latents: Optional[int] = None) -> list[Path]:
    """Build every (component, entry group) engine of `table` into `out_dir`; return the engine paths.

    `vae` is a TurboVAE (its model provides `image_encoder()` / `image_decoder()`), loaded in fp32: the
    identity hash is taken from its weights and the loader hashes the fp32 checkpoint the same way.
    `video=True` also builds the video slice engines (decode_slice_first/next, one pair per static
    bucket; any model with the causal-step contract, see trt/video.py); `components` may then be empty.
    `slice_latents` is k, the latents per next-slice call (the first slice takes 1 + k; default:
    `video.default_slice_latents(device)`). Every input is validated and
    existing files are refused before any work unless `overwrite=True`. `pad_to_bucket` records in the
    manifest that sizes between buckets may run padded (approximate; see EngineSet).
    """
    progress = progress or BuildProgress(lambda m, _f: log.info(m))
    be = get_backend(backend)
    device = torch.device(device) if device is not None else vae.device
    jobs = preflight(Path(out_dir), table, backend=backend, device=device, components=components, video=video,
                     overwrite=overwrite, slice_latents=slice_latents)
    if vae.dtype != torch.float32:
        raise ValueError(f"build engines from the fp32 model (got {vae.dtype}); the engine dtype is the dtype= "
                         "argument")
    lf = vae.latent_format
    if table.multiple % lf.spatial_factor:
        raise ValueError(f"table multiple {table.multiple} is not a multiple of the VAE factor {lf.spatial_factor}")
    if video:
        check_video_model(vae.model)
    k = default_slice_latents(device) if slice_latents is None else slice_latents  # checked by preflight
    progress.report(f"hashing weights of {source or vae.source}")
    mhash = model_hash(vae.model.state_dict())
    facts = device_facts(device)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[Path, Path, EngineIdentity]] = []  # (temporary file, final path, identity)
    # The export traces the model: its layout self-check cannot run there, so it is decided now, eagerly.
    settle_for_trace(device, dtype)
    try:
        for n, job in enumerate(jobs):
            progress.check_cancel()
            progress.report(f"engine {n + 1}/{len(jobs)}: {job.path.name}", n / len(jobs))
            if job.component in VIDEO_COMPONENTS:
                plan = slice_plan(vae, job, table, dtype, device, optimization_level, k)
            else:
                plan = image_plan(vae, job, table, dtype, device, optimization_level)
            tmp = temporary_name(job.path)
            staged.append((tmp, job.path, None))
            be.build(plan.module, plan.example, plan.spec, tmp, progress, name=job.path.name)
            ident = EngineIdentity(
                model_hash=mhash, model_kind=vae.kind, component=job.component, dtype=dtype_name(dtype),
                table=table.to_json(), entries=tuple(job.entries), input_names=plan.spec.input_names,
                output_names=plan.spec.output_names, backend=be.name, backend_version=be.version(),
                torch_version=torch.__version__, engine_sha256=file_sha256(tmp), engine_bytes=tmp.stat().st_size,
                source=str(Path(source).resolve()) if source else vae.source, latent_format=asdict(lf),
                build_options={"optimization_level": optimization_level},
                input_shapes={k: list(v) for k, v in plan.input_shapes.items()}, **facts)
            staged[-1] = (tmp, job.path, ident)
        progress.check_cancel()
        manifest = Manifest(out_dir, tuple(ManifestEntry(final.name, ident) for _t, final, ident in staged),
                            {"pad_to_bucket": True} if pad_to_bucket else {})
        publish_set(manifest, [(tmp, final) for tmp, final, _i in staged], overwrite=overwrite)
    finally:
        for tmp, _final, _ident in staged:
            if os.path.lexists(tmp):
                tmp.unlink()
    written = [final for _t, final, _i in staged]
    progress.report(f"done: {len(written)} engine(s) and {MANIFEST_NAME} in {out_dir}", 1.0)
    return written


def publish_set(manifest: Manifest, files: Sequence[tuple[Path, Path]], *, overwrite: bool) -> None:
    """Move the finished temporary files to their names, then write the manifest (the commit point).

    Without `overwrite` each move fails if its target exists, and the files this call already moved are
    taken back, so nothing of the set is left. With `overwrite` the old manifest goes first: until the
    new one is written, the folder is not a loadable set (never a mix of old and new engines).
    """
    if overwrite and os.path.lexists(manifest.path):
        manifest.path.unlink()
    moved: list[Path] = []
    try:
        for tmp, final in files:
            publish(tmp, final, overwrite=overwrite)
            moved.append(final)
        manifest.write(overwrite=overwrite)
    except BaseException:
        if not overwrite:
            for final in moved:
                final.unlink()
        raise
