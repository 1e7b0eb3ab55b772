"""TensorRT 10.12+/11.x backend: ONNX -> strongly typed network -> plan; runtime on torch tensors.

`tensorrt` is imported lazily (it is often absent: NVIDIA's index, CUDA-major-specific wheels), and
every decision is a pure function in trt_logic.py. Every TensorRT call that reports failure through
its return value is checked; any failure becomes an EngineError, which the engine VAE turns into a
PyTorch fallback with one warning.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from pathlib import Path
from typing import Mapping, Optional, Sequence

import torch
from torch import nn

from ..vae.device_guard import on_device
from . import trt_logic as L
from .interface import (
    Backend,
    BackendUnavailable,
    BuildCancelled,
    BuildProgress,
    BuildSpec,
    EngineError,
    EngineLoadError,
    EngineRunError,
    LoadedEngine,
    ShapeRange,
)
from .fileio import atomic_write_bytes

log = logging.getLogger(__name__)

INSTALL_HINT = ("install TensorRT 10.12+ matching your CUDA: `pip install tensorrt-cu12` (CUDA 12) or "
                "`pip install tensorrt` (CUDA 13, TensorRT 11), or use the AOTInductor backend, which needs no "
                "TensorRT (backend `aoti` in the Build Engine node, `--backend aoti` on the command line)")
CACHE_DIR_ENV = "TURBOVAE_TRT_CACHE"


def import_tensorrt():
    """The `tensorrt` module, or BackendUnavailable naming the fix (missing package or libnvinfer)."""
    try:
        import tensorrt as trt  # noqa: PLC0415 - lazy by design
    except (ImportError, OSError) as e:
        raise BackendUnavailable(f"TensorRT is not usable here ({type(e).__name__}: {e}); {INSTALL_HINT}") from e
    L.check_version(getattr(trt, "__version__", "0.0"))
    return trt


def _logger(trt):
    return trt.Logger(trt.Logger.WARNING)


def _enum_names(enum) -> list[str]:
    return [n for n in dir(enum) if n.isupper()]


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV, Path.home() / ".cache" / "turbovae" / "tensorrt"))


def _monitor_class(trt):
    """An IProgressMonitor subclass reporting phases to BuildProgress; returning False cancels."""

    class Monitor(trt.IProgressMonitor):
        def __init__(self, progress: BuildProgress):
            trt.IProgressMonitor.__init__(self)
            self.progress = progress
            self.cancelled = False

        def phase_start(self, phase_name, parent_phase, num_steps):
            self.progress.report(f"TensorRT: {phase_name}")

        def phase_finish(self, phase_name):
            pass

        def step_complete(self, phase_name, step):
            if self.progress.cancelled():
                self.cancelled = True
                return False
            return True

    return Monitor


class TensorRTBackend(Backend):
    name = "tensorrt"
    suffix = ".engine"

    def __init__(self, cache_dir: Optional[Path] = None):
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()

    def version(self) -> str:
        return import_tensorrt().__version__

    def check_available(self, device: torch.device) -> None:
        import_tensorrt()
        if torch.device(device).type != "cuda" or not torch.cuda.is_available():
            raise BackendUnavailable("TensorRT engines need a CUDA GPU; on CPU use the AOTInductor backend "
                                     "(backend `aoti` in the Build Engine node, `--backend aoti` on the command line)")

    # -- build ---------------------------------------------------------------------------------
    def build(self, module: nn.Module, example: Sequence[torch.Tensor], spec: BuildSpec, out_path: Path,
              progress: BuildProgress, *, overwrite: bool = False, name: Optional[str] = None) -> None:
        from .export import export_onnx

        self.check_available(spec.device)
        name = name or out_path.name
        onnx_path = out_path.parent / "onnx" / (Path(name).stem + ".onnx")
        progress.report(f"{name}: ONNX export")
        # Export on CPU keeps the GPU free for the builder (its workspace comes from free memory).
        cpu_spec = BuildSpec(**{**spec.__dict__, "device": torch.device("cpu")})
        export_onnx(module, [x.cpu() for x in example], cpu_spec, onnx_path, overwrite=True)
        progress.check_cancel()
        gc.collect()
        torch.cuda.empty_cache()
        with on_device(spec.device):  # the builder times kernels on the current device
            plan = self.build_plan(onnx_path, spec, progress)
        atomic_write_bytes(out_path, plan, overwrite=overwrite)

    def build_plan(self, onnx_path: Path, spec: BuildSpec, progress: BuildProgress) -> bytes:
        trt = import_tensorrt()
        logger = _logger(trt)
        try:
            builder = trt.Builder(logger)
        except (TypeError, RuntimeError) as e:  # "factory function returned nullptr": no usable CUDA
            raise BackendUnavailable(f"TensorRT cannot initialise CUDA ({e}); check the driver / CUDA version") from e
        nflags = trt.NetworkDefinitionCreationFlag
        flags = L.network_flags(_enum_names(nflags), int(getattr(nflags, "STRONGLY_TYPED", -1))
                                if hasattr(nflags, "STRONGLY_TYPED") else None)
        network = L.check(builder.create_network(flags), "create_network", EngineError)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(onnx_path)):  # finds model.onnx.data next to the file
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise EngineError(f"TensorRT could not parse {onnx_path}: {errors or 'no details'}")
        config = L.check(builder.create_builder_config(), "create_builder_config", EngineError)
        free, _total = torch.cuda.mem_get_info(spec.device)
        ws = spec.workspace_bytes or L.workspace_bytes(free)
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, ws)
        config.builder_optimization_level = spec.optimization_level
        for flag in L.builder_flags(_enum_names(trt.BuilderFlag)):
            config.set_flag(getattr(trt.BuilderFlag, flag))
        net_inputs = {network.get_input(i).name: tuple(network.get_input(i).shape) for i in range(network.num_inputs)}
        dynamic = L.dynamic_inputs(net_inputs)
        for prof in spec.profiles if dynamic else ():  # a static network needs (and takes) no profile
            p = builder.create_optimization_profile()
            for name in dynamic:
                lo, opt, hi = prof[name]
                p.set_shape(name, lo, opt, hi)
            if config.add_optimization_profile(p) < 0:
                raise EngineError(f"TensorRT rejected optimization profile {prof}")
        cache_file = L.timing_cache_path(self.cache_dir, _capability(spec.device), trt.__version__)
        cache = config.create_timing_cache(cache_file.read_bytes() if cache_file.is_file() else b"")
        L.check(config.set_timing_cache(cache, False), "set_timing_cache", EngineError)
        monitor = _monitor_class(trt)(progress) if hasattr(trt, "IProgressMonitor") else None
        if monitor is not None:
            config.progress_monitor = monitor
        progress.report(f"TensorRT build (workspace {ws / 2**30:.1f} GiB, level {spec.optimization_level})")
        plan = builder.build_serialized_network(network, config)
        if monitor is not None and monitor.cancelled:
            raise BuildCancelled("engine build cancelled by the user; nothing was written")
        if plan is None:
            raise EngineError(f"TensorRT failed to build {onnx_path.name} (see the TensorRT log above); "
                              "free GPU memory or lower the optimization level")
        try:
            atomic_write_bytes(cache_file, bytes(config.get_timing_cache().serialize()), overwrite=True)
        except OSError as e:
            log.warning("could not save the TensorRT timing cache %s: %s", cache_file, e)
        return bytes(plan)

    # -- load ----------------------------------------------------------------------------------
    def load(self, path: Path, spec_profiles: Sequence[Mapping[str, ShapeRange]], device: torch.device,
             input_names: Sequence[str], output_names: Sequence[str],
             dtype: Optional[torch.dtype] = None) -> "TRTEngine":
        trt = import_tensorrt()
        device = torch.device(device)
        with on_device(device):  # the runtime, the engine and its context live on the current device
            try:
                runtime = trt.Runtime(_logger(trt))
            except (TypeError, RuntimeError) as e:
                raise BackendUnavailable(f"TensorRT runtime cannot initialise CUDA ({e})") from e
            engine = runtime.deserialize_cuda_engine(path.read_bytes())
            if engine is None:
                raise EngineLoadError(f"{path}: TensorRT could not deserialise the engine (built for another GPU "
                                      "or TensorRT version, or corrupt); rebuild it")
            return TRTEngine(trt, path, engine, spec_profiles, input_names, output_names, device, dtype)


def _capability(device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}.{minor}"


class TRTEngine(LoadedEngine):
    """One deserialised plan + one execution context, run on torch tensors."""

    def __init__(self, trt, path: Path, engine, profiles: Sequence[Mapping[str, ShapeRange]],
                 input_names: Sequence[str], output_names: Sequence[str], device: torch.device,
                 dtype: Optional[torch.dtype] = None):
        self.trt, self.path, self.engine, self.device = trt, path, engine, device
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        is_input = {n: engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.inputs = [n for n in names if is_input[n]]
        self.outputs = [n for n in names if not is_input[n]]
        if sorted(self.inputs) != sorted(input_names) or sorted(self.outputs) != sorted(output_names):
            raise EngineLoadError(f"{path}: engine I/O {self.inputs}->{self.outputs} differs from its identity file")
        self.dtypes = {n: L.torch_dtype(str(engine.get_tensor_dtype(n))) for n in names}
        wrong = {n: str(d) for n, d in self.dtypes.items() if dtype is not None and d != dtype}
        if wrong:
            raise EngineLoadError(f"{path}: engine I/O dtypes {wrong} differ from the manifest's {dtype}; "
                                  "rebuild the engine set")
        self.ranges = [[L.input_range(tuple(engine.get_tensor_shape(n)),
                                      lambda n=n, k=k: engine.get_tensor_profile_shape(n, k)) for n in self.inputs]
                       for k in range(max(engine.num_optimization_profiles, 1))]
        L.check_profiles(path, self.inputs, self.ranges, profiles)
        try:
            self.context = engine.create_execution_context()
        except (RuntimeError, MemoryError) as e:
            raise EngineLoadError(f"{path}: cannot create an execution context ({e})") from e
        if self.context is None:
            raise EngineLoadError(f"{path}: cannot create an execution context (out of GPU memory?)")
        self.active_profile = 0
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @property
    def memory_bytes(self) -> int:
        if self.engine is None:
            return 0
        act = getattr(self.engine, "device_memory_size_v2", None)
        if act is None:
            act = getattr(self.engine, "device_memory_size", 0)
        return int(act) + int(self.path.stat().st_size)  # activations + weights (≈ plan size)

    def release(self) -> None:
        self.context = None
        self.engine = None
        gc.collect()

    @contextlib.contextmanager
    def _on_stream(self, tensors: Sequence[torch.Tensor]):
        """A private stream ordered after the caller's stream on entry and before it on exit."""
        if self.stream is None:
            yield 0
            return
        caller = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(caller)
        for t in tensors:
            t.record_stream(self.stream)
        with torch.cuda.stream(self.stream):
            yield self.stream.cuda_stream
        caller.wait_stream(self.stream)

    def run(self, inputs: Mapping[str, torch.Tensor], profile: Optional[int] = None) -> dict[str, torch.Tensor]:
        if self.context is None:
            raise EngineRunError(f"{self.path.name}: engine was released")
        feeds = {n: inputs[n].to(self.dtypes[n]).contiguous() for n in self.inputs}
        shapes = [tuple(feeds[n].shape) for n in self.inputs]
        k = L.choose_profile(self.ranges, shapes) if profile is None else profile
        if profile is not None and not all(L.shape_in_range(s, r) for s, r in zip(shapes, self.ranges[k])):
            raise EngineRunError(f"{self.path.name}: shapes {shapes} outside profile {k}")
        try:
            with on_device(self.device), self._on_stream(list(feeds.values())) as handle:
                ctx = self.context
                if k != self.active_profile or self.engine.num_optimization_profiles > 1:
                    L.check(ctx.set_optimization_profile_async(k, handle), f"set_optimization_profile_async({k})")
                    self.active_profile = k
                for n in self.inputs:
                    L.check(ctx.set_input_shape(n, feeds[n].shape), f"set_input_shape({n}, {tuple(feeds[n].shape)})")
                    L.check(ctx.set_tensor_address(n, feeds[n].data_ptr()), f"set_tensor_address({n})")
                outs = {}
                for n in self.outputs:
                    shape = tuple(ctx.get_tensor_shape(n))
                    if not L.output_shape_ok(shape):
                        raise EngineRunError(f"{self.path.name}: output {n} has unresolved shape {shape}")
                    outs[n] = torch.empty(shape, dtype=self.dtypes[n], device=self.device)
                    L.check(ctx.set_tensor_address(n, outs[n].data_ptr()), f"set_tensor_address({n})")
                L.check(ctx.execute_async_v3(handle), "execute_async_v3")
            if self.stream is not None:
                caller = torch.cuda.current_stream(self.device)
                for t in outs.values():
                    t.record_stream(caller)
        except torch.OutOfMemoryError as e:
            raise EngineRunError(f"{self.path.name}: out of GPU memory ({e})") from e
        except EngineError:
            raise
        except Exception as e:
            raise EngineRunError(f"{self.path.name}: execution failed ({type(e).__name__}: {e})") from e
        return outs
