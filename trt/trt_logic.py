"""TensorRT decisions as pure functions (no `tensorrt` import): testable on any machine.

Covers what differs between TensorRT 10.12+ and 11.x (flags that 11 removed), profile choice,
shape checks, dtype mapping, workspace sizing, timing-cache keys and return-code checking.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence

import torch

from .interface import EngineError, EngineLoadError, EngineRunError, ShapeRange, shape_in_range

MIN_VERSION = (10, 12)

# TensorRT DataType member name -> torch dtype (I/O dtypes are read from the engine, never assumed).
TRT_TO_TORCH = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT32": torch.int32,
                "INT64": torch.int64, "INT8": torch.int8, "UINT8": torch.uint8, "BOOL": torch.bool}

# Builder flags TensorRT 11 removed (AttributeError there). Precision must come from the ONNX dtypes
# (strongly typed network), so none of these is ever set, on 10.x either.
REMOVED_IN_11 = ("FP16", "BF16", "INT8", "FP8", "INT4", "FP4", "OBEY_PRECISION_CONSTRAINTS",
                 "PREFER_PRECISION_CONSTRAINTS")


def parse_version(text: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", text or "")
    if not m:
        raise ValueError(f"unrecognised TensorRT version {text!r}")
    return int(m.group(1)), int(m.group(2))


def check_version(text: str) -> tuple[int, int]:
    v = parse_version(text)
    if v < MIN_VERSION:
        raise EngineError(f"TensorRT {text} is too old: TurboVAE needs 10.12 or newer (pip install -U tensorrt-cu12 "
                          "for CUDA 12, or tensorrt for CUDA 13)")
    return v


def network_flags(flag_members: Iterable[str], strongly_typed_value: Optional[int]) -> int:
    """Network creation flags: STRONGLY_TYPED where the enum has it (10.x); on 11 it is always on.

    EXPLICIT_BATCH is never set: a no-op since 10.0 and gone in 11.
    """
    return (1 << strongly_typed_value) if "STRONGLY_TYPED" in set(flag_members) and strongly_typed_value is not None \
        else 0


def builder_flags(available: Iterable[str], *, tf32: bool = True, refit: bool = False,
                  version_compatible: bool = False) -> list[str]:
    """Builder flag names to set, limited to what this TensorRT exposes; never a precision flag."""
    have = set(available)
    wanted = []
    if tf32:
        wanted.append("TF32")
    if refit:
        wanted.append("REFIT_IDENTICAL" if "REFIT_IDENTICAL" in have else "REFIT")
    if version_compatible:
        wanted.append("VERSION_COMPATIBLE")
    return [f for f in wanted if f in have and f not in REMOVED_IN_11]


def workspace_bytes(free_bytes: int, *, fraction: float = 0.75, reserve: int = 1 << 30,
                    cap: Optional[int] = None) -> int:
    """Builder workspace from free device memory (TensorRT's default is the whole device)."""
    budget = int(max(free_bytes - reserve, 0) * fraction)
    if cap is not None:
        budget = min(budget, cap)
    if budget < 256 << 20:
        raise EngineError(f"only {free_bytes / 2**30:.1f} GiB free on the GPU; TensorRT needs a workspace of at least "
                          "256 MiB — unload other models (ComfyUI: 'Unload models') and retry")
    return budget


def timing_cache_path(cache_dir: Path, compute_capability: str, trt_version: str) -> Path:
    """One timing cache per (compute capability, TensorRT version): never loaded with ignore_mismatch."""
    safe = re.sub(r"[^0-9A-Za-z.]+", "_", f"sm{compute_capability}_trt{trt_version}")
    return Path(cache_dir) / f"timing_{safe}.cache"


def choose_profile(ranges: Sequence[Sequence[ShapeRange]], shapes: Sequence[Sequence[int]]) -> int:
    """Index of the profile containing every input shape; the smallest max volume wins, ties the first.

    `ranges[k][i]` is the (min, opt, max) of input i in profile k.
    """
    hits = []
    for k, prof in enumerate(ranges):
        if all(shape_in_range(tuple(s), r) for s, r in zip(shapes, prof)):
            vol = 1
            for r in prof:
                for v in r[2]:
                    vol *= v
            hits.append((vol, k))
    if not hits:
        raise EngineRunError(f"input shapes {[tuple(s) for s in shapes]} are outside every optimization profile")
    return min(hits)[1]


def is_static(shape: Sequence[int]) -> bool:
    """A network/engine tensor shape without -1 (dynamic) dimensions."""
    return all(int(d) >= 0 for d in shape)


def dynamic_inputs(shapes: Mapping[str, Sequence[int]]) -> list[str]:
    """Network inputs that need optimization-profile dimensions: the dynamic ones, in order. A fully
    static network (the video slice engines: latents + causal cache) gets no profile at all."""
    return [name for name, shape in shapes.items() if not is_static(shape)]


def input_range(engine_shape: Sequence[int], profile_shape: Callable[[], Sequence[Sequence[int]]]) -> ShapeRange:
    """(min, opt, max) of one engine input: its own shape when static (such inputs have no profile
    dimensions to query), else the profile's."""
    if is_static(engine_shape):
        s = tuple(int(d) for d in engine_shape)
        return s, s, s
    lo, opt, hi = (tuple(int(d) for d in dims) for dims in profile_shape())
    return lo, opt, hi


def torch_dtype(trt_dtype_name: str) -> torch.dtype:
    try:
        return TRT_TO_TORCH[trt_dtype_name.split(".")[-1].upper()]
    except KeyError:
        raise EngineError(f"engine uses TensorRT dtype {trt_dtype_name}, which TurboVAE cannot feed") from None


def check(result, what: str, exc: type = EngineRunError):
    """TensorRT reports many failures as False/None instead of raising: turn those into errors."""
    if result is None or result is False:
        raise exc(f"TensorRT {what} failed")
    return result


def output_shape_ok(shape: Sequence[int]) -> bool:
    return len(shape) > 0 and all(int(d) >= 0 for d in shape)


def check_profiles(path, input_names: Sequence[str], engine_ranges: Sequence[Sequence[ShapeRange]],
                   manifest_profiles: Sequence[Mapping[str, ShapeRange]]) -> None:
    """EngineLoadError unless the engine serves, profile by profile, the input ranges its manifest
    records (min and max of every recorded input): a plan swapped for another one with the same names
    would otherwise be fed shapes it was not built for."""
    if len(engine_ranges) < len(manifest_profiles):
        raise EngineLoadError(f"{path}: engine has {len(engine_ranges)} optimization profile(s), the manifest "
                              f"{len(manifest_profiles)}; rebuild the engine set")
    for k, prof in enumerate(manifest_profiles):
        for name, (lo, _opt, hi) in prof.items():
            if name not in input_names:
                raise EngineLoadError(f"{path}: engine has no input {name!r}; rebuild the engine set")
            elo, _eopt, ehi = engine_ranges[k][list(input_names).index(name)]
            if (tuple(elo), tuple(ehi)) != (tuple(lo), tuple(hi)):
                raise EngineLoadError(f"{path}: input {name} profile {k} is {tuple(elo)}..{tuple(ehi)} in the engine, "
                                      f"{tuple(lo)}..{tuple(hi)} in the manifest; rebuild the engine set")
