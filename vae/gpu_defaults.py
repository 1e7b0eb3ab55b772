"""GPU defaults per architecture, decided by measurement: what the loader, the passes and the Compile Settings
node read.

A GPU path that is on by default must make the cases it serves faster on the GPU, or be off for that
architecture. Each architecture declares what the GPU ablation measured for it (`VAEModel.gpu_defaults()`, the
contract on the base class; its own model code holds the values); docs/gpu.md ("Defaults per architecture") names
the results file and rows behind each. An architecture no GPU run has measured gets `UNMEASURED`: every path on, as
before any measurement.

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
from typing import Mapping, Union

import torch


@dataclass(frozen=True)
class GpuDefaults:
    """The measured GPU defaults of one architecture (see the module doc for each field)."""

    compile: bool = True
    channels_last_without_fused_norms: bool = True
    measured: bool = True  # False: no GPU measurement decided it (the generic default)


UNMEASURED = GpuDefaults(measured=False)
# Measured on a GPU with every path helping: the Wan 2.1 architecture (Qwen-Image / Wan 2.1).
MEASURED_ALL_ON = GpuDefaults()
# SeedVR2 on the first H100 run: compile slower, channels-last slower where the fused norms do not run.
MEASURED_SEEDVR2 = GpuDefaults(compile=False, channels_last_without_fused_norms=False)

COMPILE_ALL = "all"
COMPILE_MEASURED = "where measured faster"
COMPILE_ARCHITECTURES = (COMPILE_MEASURED, COMPILE_ALL)


def compile_applies(defaults: GpuDefaults, device: Union[str, torch.device],
                    architectures: str = COMPILE_MEASURED) -> bool:
    """Whether a Compile Settings node compiles a model with these measured `defaults` (`model.gpu_defaults()`)
    that will run on `device`. ValueError naming the choices for an unknown `architectures`."""
    if architectures not in COMPILE_ARCHITECTURES:
        raise ValueError(f"architectures must be one of {', '.join(map(repr, COMPILE_ARCHITECTURES))}, "
                         f"got {architectures!r}")
    if architectures == COMPILE_ALL or torch.device(device).type != "cuda":
        return True
    return defaults.compile


def channels_last_applies(defaults: GpuDefaults, on_gpu: bool, fused_norms_run: bool) -> bool:
    """Whether a pass keeps channels-last activations, given its architecture's measured `defaults`, where it runs
    and whether fused norms run."""
    if not on_gpu or fused_norms_run:
        return True
    return defaults.channels_last_without_fused_norms


def describe_compile(by_architecture: Mapping[str, GpuDefaults]) -> str:
    """What compile does per architecture on a GPU (`by_architecture`: name -> measured defaults, e.g.
    `vae.registry.gpu_defaults_by_title()`): the Compile Settings node's text."""
    faster = [k for k, d in by_architecture.items() if d.measured and d.compile]
    slower = [k for k, d in by_architecture.items() if d.measured and not d.compile]
    unmeasured = [k for k, d in by_architecture.items() if not d.measured]
    return (f"On NVIDIA GPUs compile measured faster for {', '.join(faster) or 'none'} and slower for "
            f"{', '.join(slower) or 'none'}: with 'architectures' = '{COMPILE_MEASURED}' the slower ones stay eager "
            f"(one log line says so); {', '.join(unmeasured) or 'other architectures'} compile (not measured yet). "
            f"On CPU every architecture compiles. docs/gpu.md gives the measurements.")
