"""AOTInductor backend: `torch.export` + `aoti_compile_and_package` -> one `.pt2` per table entry.

Needs no TensorRT, runs on CPU and GPU, and is the backend the CPU tests exercise end to end.
AOTInductor packages do not reject inputs outside the exported ranges reliably, so every call is
checked against the recorded range first. The package also carries its I/O dtypes in its metadata
(`IO_METADATA_KEY`), compared with the manifest at load, before the first run.
"""

from __future__ import annotations

import gc
import json
import logging
from pathlib import Path
from typing import BinaryIO, Mapping, Optional, Sequence

import torch
from torch import nn

from ..vae.device_guard import on_device
from .interface import (
    Backend,
    BackendUnavailable,
    BuildProgress,
    BuildSpec,
    EngineLoadError,
    EngineRunError,
    LoadedEngine,
    ShapeRange,
    shape_in_range,
)
from .fileio import atomic_file

log = logging.getLogger(__name__)

IO_METADATA_KEY = "turbovae_io"  # JSON {"inputs": {name: dtype}, "outputs": [dtype, ...]} in the package


def inductor_options(device: torch.device) -> dict:
    """Inductor settings per device type. CPU: `freezing` treats the weights as constants, so Inductor
    prepacks every conv for oneDNN; without it a batch-1 conv with few channels x frames x rows falls to
    PyTorch's reference conv3d (the size heuristic in ATen's `use_mkldnn`), several times slower
    (`bench --sections engines`). Inductor freezes only while grad is off (`compile_package` turns it off).
    CUDA: Inductor's defaults (not measured on a GPU yet)."""
    return {"freezing": True} if torch.device(device).type == "cpu" else {}


def program_device(program: torch.export.ExportedProgram) -> torch.device:
    """The device of a program's first tensor input or weight (a build exports on one device)."""
    for node in program.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        if isinstance(val, torch.Tensor):
            return val.device
    return torch.device("cpu")


def io_metadata(program: torch.export.ExportedProgram) -> str:
    """The dtypes a program's user inputs and outputs really have (from the traced graph)."""
    sig = program.graph_signature
    vals = {n.name: n.meta.get("val") for n in program.graph.nodes}
    kinds = torch.export.graph_signature

    def dtype_of(spec) -> Optional[str]:
        val = vals.get(getattr(spec.arg, "name", None))
        return str(val.dtype) if hasattr(val, "dtype") else None

    inputs = [dtype_of(s) for s in sig.input_specs if s.kind == kinds.InputKind.USER_INPUT]
    outputs = [dtype_of(s) for s in sig.output_specs if s.kind == kinds.OutputKind.USER_OUTPUT]
    return json.dumps({"inputs": [d for d in inputs if d], "outputs": [d for d in outputs if d]})


def check_io_metadata(path: Path, metadata: Mapping[str, str], dtype: torch.dtype, n_inputs: int,
                      n_outputs: int) -> None:
    """EngineLoadError unless the package's recorded I/O dtypes are all `dtype` (the manifest's) and the
    counts match. Packages without the record (built elsewhere) are checked on their outputs instead."""
    text = metadata.get(IO_METADATA_KEY)
    if text is None:
        return
    try:
        io = json.loads(text)
        ins, outs = list(io["inputs"]), list(io["outputs"])
    except (ValueError, KeyError, TypeError) as e:
        raise EngineLoadError(f"{path}: unreadable I/O record in the package ({e}); rebuild the engine") from e
    want = str(dtype)
    if len(ins) != n_inputs or len(outs) != n_outputs:
        raise EngineLoadError(f"{path}: package has {len(ins)} inputs / {len(outs)} outputs, the manifest "
                              f"{n_inputs} / {n_outputs}; rebuild the engine set")
    wrong = sorted({d for d in ins + outs if d != want})
    if wrong:
        raise EngineLoadError(f"{path}: package computes in {', '.join(wrong)}, the manifest says {want}; it would "
                              "read its inputs as the wrong type (garbage or NaN) — rebuild the engine set")


def dynamic_shapes(spec: BuildSpec, profile: Mapping[str, ShapeRange]) -> tuple:
    """`torch.export` dynamic_shapes for one profile: axes with min < max become factor·Dim(symbol)."""
    symbols: dict[str, torch.export.Dim] = {}
    out = []
    for name in spec.input_names:
        lo, _opt, hi = profile[name]
        axes = {}
        for axis, (symbol, factor) in spec.dims.get(name, {}).items():
            if lo[axis] == hi[axis]:
                continue
            if lo[axis] % factor or hi[axis] % factor:
                raise ValueError(f"input {name} axis {axis}: range {lo[axis]}..{hi[axis]} is not in steps of {factor}")
            if symbol not in symbols:
                symbols[symbol] = torch.export.Dim(symbol, min=lo[axis] // factor, max=hi[axis] // factor)
            axes[axis] = factor * symbols[symbol] if factor != 1 else symbols[symbol]
        out.append(axes or None)
    return tuple(out)


def export_dynamic_shapes(spec: BuildSpec, profile: Mapping[str, ShapeRange]) -> Optional[tuple]:
    """`dynamic_shapes` for torch.export, or None for an all-static graph (a graph taking `*args`, like the
    video slice graphs, has a different input structure and accepts only None there)."""
    shapes = dynamic_shapes(spec, profile)
    return None if all(s is None for s in shapes) else shapes


class AOTIEngine(LoadedEngine):
    def __init__(self, path: Path, runner, profile: Mapping[str, ShapeRange], input_names: Sequence[str],
                 output_names: Sequence[str], memory_bytes: int, device: torch.device = torch.device("cpu")):
        self.path = path
        self.device = device  # what the package was loaded onto; it runs there
        self._runner = runner
        self._profile = profile
        self._inputs = tuple(input_names)
        self._outputs = tuple(output_names)
        self._memory = memory_bytes

    def run(self, inputs: Mapping[str, torch.Tensor], profile: int = 0) -> dict[str, torch.Tensor]:
        if self._runner is None:
            raise EngineRunError(f"{self.path.name}: engine was released")
        if profile != 0:
            raise EngineRunError(f"{self.path.name}: AOTInductor packages hold one profile, asked for {profile}")
        args = []
        for name in self._inputs:
            x = inputs.get(name)
            if not isinstance(x, torch.Tensor):
                raise EngineRunError(f"{self.path.name}: input {name} not given (got {', '.join(inputs)})")
            if not shape_in_range(tuple(x.shape), self._profile[name]):
                lo, _, hi = self._profile[name]
                raise EngineRunError(f"{self.path.name}: input {name} shape {tuple(x.shape)} outside {lo}..{hi}")
            args.append(x.contiguous())
        try:
            with on_device(self.device):
                out = self._runner(*args)
        except torch.OutOfMemoryError as e:
            raise EngineRunError(f"{self.path.name}: out of memory ({e})") from e
        except Exception as e:  # AOTI surfaces C++ failures as RuntimeError and friends
            raise EngineRunError(f"{self.path.name}: execution failed ({type(e).__name__}: {e})") from e
        outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
        if len(outs) != len(self._outputs):
            raise EngineRunError(f"{self.path.name}: {len(outs)} outputs, expected {len(self._outputs)}")
        return dict(zip(self._outputs, outs))

    @property
    def memory_bytes(self) -> int:
        return self._memory if self._runner is not None else 0

    def release(self) -> None:
        self._runner = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class AOTIBackend(Backend):
    name = "aoti"
    suffix = ".pt2"

    def version(self) -> str:
        return f"torch-{torch.__version__}"

    def check_available(self, device: torch.device) -> None:
        if not hasattr(torch._inductor, "aoti_compile_and_package"):
            raise BackendUnavailable(f"torch {torch.__version__} has no AOTInductor packaging; upgrade to torch >= 2.6")
        if torch.device(device).type == "cuda" and not torch.cuda.is_available():
            raise BackendUnavailable("an AOTInductor engine for CUDA needs a CUDA device")

    def build(self, module: nn.Module, example: Sequence[torch.Tensor], spec: BuildSpec, out_path: Path,
              progress: BuildProgress, *, overwrite: bool = False, name: Optional[str] = None) -> None:
        if len(spec.profiles) != 1:
            raise ValueError("an AOTInductor package holds exactly one shape range; build one package per profile")
        self.check_available(spec.device)
        module = module.to(device=spec.device, dtype=spec.dtype).eval()
        example = tuple(x.to(device=spec.device, dtype=spec.dtype) for x in example)
        name = name or out_path.name
        progress.check_cancel()
        progress.report(f"{name}: torch.export")
        with torch.inference_mode(False), torch.no_grad():
            ep = torch.export.export(module, example, dynamic_shapes=export_dynamic_shapes(spec, spec.profiles[0]))
        progress.check_cancel()
        progress.report(f"{name}: AOTInductor compile (cannot be interrupted)")
        with atomic_file(out_path, overwrite=overwrite) as f, on_device(spec.device):
            self.compile_package(ep, f)  # a file object: the temporary name carries no .pt2 suffix
            progress.check_cancel()
        progress.report(f"{name}: written")

    def compile_package(self, program: torch.export.ExportedProgram, file: BinaryIO) -> None:
        """Compile `program` into the open package file `file`, recording its I/O dtypes (the one step
        that takes minutes; tests of the surrounding logic replace it and `load_runner` with a plain
        export save/load)."""
        configs = {"aot_inductor.metadata": {IO_METADATA_KEY: io_metadata(program)}}
        configs.update(inductor_options(program_device(program)))
        with torch.no_grad():  # Inductor applies `freezing` only with grad off
            torch._inductor.aoti_compile_and_package(program, package_path=file, inductor_configs=configs)

    def load_runner(self, path: Path):
        """A callable running the package at `path` on positional inputs."""
        return torch._inductor.aoti_load_package(str(path))

    def load(self, path: Path, spec_profiles: Sequence[Mapping[str, ShapeRange]], device: torch.device,
             input_names: Sequence[str], output_names: Sequence[str],
             dtype: Optional[torch.dtype] = None) -> AOTIEngine:
        self.check_available(device)
        device = torch.device(device)
        before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        try:
            with on_device(device):  # the package loads its weights onto the current device
                runner = self.load_runner(path)
        except Exception as e:  # a truncated/corrupt zip raises many types
            raise EngineLoadError(f"{path}: cannot load AOTInductor package ({type(e).__name__}: {e}); "
                                  "rebuild the engine") from e
        if dtype is not None and callable(getattr(runner, "get_metadata", None)):
            try:
                metadata = dict(runner.get_metadata())
            except Exception as e:  # a C++ loader error surfaces as RuntimeError and friends
                raise EngineLoadError(f"{path}: cannot read the package metadata ({e}); rebuild the engine") from e
            check_io_metadata(path, metadata, dtype, len(input_names), len(output_names))
        held = (torch.cuda.memory_allocated(device) - before) if device.type == "cuda" else path.stat().st_size
        return AOTIEngine(path, runner, spec_profiles[0], input_names, output_names, held, device)
