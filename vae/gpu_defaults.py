"""GPU defaults per architecture, decided by measurement: the one table the loader, the passes and the
Compile Settings node read.

A GPU path that is on by default must make the cases it serves faster on the GPU, or be off for that
architecture. Each entry of `GPU_DEFAULTS` records what the GPU ablation measured for one architecture
(`VAEModel.kind`); docs/gpu.md ("Defaults per architecture") names the results file and rows behind each
entry. Kinds without an entry get `UNMEASURED`: every path on, as before any measurement.

- `compile`: whether a connected Compile Settings node compiles this architecture on CUDA. Where compile
  measured slower the loader leaves the model eager and logs why; the node's `architectures` input set to
  "all" compiles it anyway (to measure it again on another GPU or torch).
- `channels_last_without_fused_norms`: whether channels-last activations stay on on CUDA when the fused
  Triton norms do not run (no Triton, or the norms' self-check failed): where the unfused norms are slower
  on channels-last tensors, the pass runs contiguous there.

CPU passes are not affected: the CPU choices are measured and documented per section (docs/BENCHMARKS.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch


@dataclass(frozen=True)
class GpuDefaults:
    """The measured GPU defaults of one architecture (see the module doc for each field)."""

    compile: bool = True
    channels_last_without_fused_norms: bool = True
    measured: bool = True  # False: no GPU measurement decided it (the generic default)


UNMEASURED = GpuDefaults(measured=False)

# VAEModel.kind -> defaults. Qwen-Image and Wan 2.1 share the Wan 2.1 architecture and were measured on it.
GPU_DEFAULTS: dict[str, GpuDefaults] = {
    "seedvr2": GpuDefaults(compile=False, channels_last_without_fused_norms=False),
    "qwen_image": GpuDefaults(),
    "wan2.1": GpuDefaults(),
}

COMPILE_ALL = "all"
COMPILE_MEASURED = "where measured faster"
COMPILE_ARCHITECTURES = (COMPILE_MEASURED, COMPILE_ALL)


def gpu_defaults(kind: str) -> GpuDefaults:
    """The entry of `kind`, or `UNMEASURED` for an architecture no GPU run has measured."""
    return GPU_DEFAULTS.get(kind, UNMEASURED)


def compile_applies(kind: str, device: Union[str, torch.device], architectures: str = COMPILE_MEASURED) -> bool:
    """Whether a Compile Settings node compiles a model of `kind` that will run on `device`. ValueError naming
    the choices for an unknown `architectures`."""
    if architectures not in COMPILE_ARCHITECTURES:
        raise ValueError(f"architectures must be one of {', '.join(map(repr, COMPILE_ARCHITECTURES))}, "
                         f"got {architectures!r}")
    if architectures == COMPILE_ALL or torch.device(device).type != "cuda":
        return True
    return gpu_defaults(kind).compile


def channels_last_applies(kind: str, on_gpu: bool, fused_norms_run: bool) -> bool:
    """Whether a pass of `kind` keeps channels-last activations, given where it runs and whether fused norms run."""
    if not on_gpu or fused_norms_run:
        return True
    return gpu_defaults(kind).channels_last_without_fused_norms


def describe_compile() -> str:
    """What compile does per architecture on a GPU, from the table: the Compile Settings node's text."""
    slower = sorted(k for k, d in GPU_DEFAULTS.items() if not d.compile)
    faster = sorted(k for k, d in GPU_DEFAULTS.items() if d.compile)
    return (f"On NVIDIA GPUs compile measured faster for {', '.join(faster)} and slower for {', '.join(slower)}: "
            f"with 'architectures' = '{COMPILE_MEASURED}' the slower ones stay eager (one log line says so); "
            f"other architectures compile (not measured yet). On CPU every architecture compiles. "
            f"docs/gpu.md gives the measurements.")
