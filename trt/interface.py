"""One interface for engine backends (build, load, describe, run) and the errors the fallback catches.

The backends themselves and the choice between them live in `backends.py`, which imports them;
this module imports none of them, so each backend can import the interface without a cycle."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import torch
from torch import nn

# (min, opt, max) full tensor shapes of one input for one optimization profile.
ShapeRange = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


class EngineError(RuntimeError):
    """Base of every engine failure; `EngineVAE` turns any of these into one warning + PyTorch fallback."""


class BackendUnavailable(EngineError):
    """The backend cannot run here (not installed, no GPU); the message names the fix."""


class EngineLoadError(EngineError):
    """An engine file that cannot be deserialised or does not match (identity, truncation)."""


class EngineRunError(EngineError):
    """A shape outside the engine's ranges, a False return code, an out-of-memory or execution error."""


class BuildCancelled(EngineError):
    """The user cancelled a build; nothing was written."""


class BuildProgress:
    """Phase-level progress plus elapsed time (no fake percentages: backends report sparsely).

    `callback(message, fraction_or_None)` is told about phases and steps; `should_cancel()` is polled
    between phases and, for TensorRT, inside the builder's progress monitor.
    """

    def __init__(self, callback: Optional[Callable[[str, Optional[float]], None]] = None,
                 should_cancel: Optional[Callable[[], bool]] = None):
        self.callback = callback
        self.should_cancel = should_cancel
        self.t0 = time.perf_counter()

    def report(self, message: str, fraction: Optional[float] = None) -> None:
        if self.callback is not None:
            self.callback(f"{message} [{time.perf_counter() - self.t0:.0f} s]", fraction)

    def cancelled(self) -> bool:
        return bool(self.should_cancel and self.should_cancel())

    def check_cancel(self) -> None:
        if self.cancelled():
            raise BuildCancelled("engine build cancelled by the user; nothing was written")


@dataclass(frozen=True)
class BuildSpec:
    """What to build: graph I/O names, the engine dtype and device, and one shape range per profile.

    `profiles[k][name]` is the (min, opt, max) shape of input `name` in profile k; a static engine has
    one profile with min == opt == max. `dims[name][axis] = (symbol, factor)` says that axis equals
    factor·symbol, so exported graphs declare `factor*Dim(symbol)` (divisibility is part of the graph,
    and tensors sharing a symbol — e.g. caches at 2x the latent size — stay tied).
    """

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    dtype: torch.dtype
    device: torch.device
    profiles: tuple[Mapping[str, ShapeRange], ...]
    dims: Mapping[str, Mapping[int, tuple[str, int]]]
    workspace_bytes: Optional[int] = None
    optimization_level: int = 3


class LoadedEngine(ABC):
    """A deserialised engine ready to run; `run` returns outputs by name."""

    path: Path

    @abstractmethod
    def run(self, inputs: Mapping[str, torch.Tensor], profile: int = 0) -> dict[str, torch.Tensor]: ...

    @property
    @abstractmethod
    def memory_bytes(self) -> int:
        """Memory this engine holds (weights + activation reservation where the backend reports it)."""

    @abstractmethod
    def release(self) -> None: ...

    def describe(self) -> str:
        return f"{type(self).__name__}({self.path.name}, {self.memory_bytes / 2**20:.0f} MiB)"


class Backend(ABC):
    name: str
    suffix: str

    @abstractmethod
    def version(self) -> str: ...

    @abstractmethod
    def check_available(self, device: torch.device) -> None:
        """Raise BackendUnavailable naming the fix when this backend cannot build or run on `device`."""

    @abstractmethod
    def build(self, module: nn.Module, example: Sequence[torch.Tensor], spec: BuildSpec, out_path: Path,
              progress: BuildProgress, *, overwrite: bool = False, name: Optional[str] = None) -> None:
        """Write the engine to `out_path` atomically (never a partial file). `name` is the engine's final
        file name when `out_path` is a temporary one (messages and side files use it)."""

    @abstractmethod
    def load(self, path: Path, spec_profiles: Sequence[Mapping[str, ShapeRange]], device: torch.device,
             input_names: Sequence[str], output_names: Sequence[str],
             dtype: Optional[torch.dtype] = None) -> LoadedEngine:
        """Deserialise `path`; raise EngineLoadError (or BackendUnavailable) on any failure, including I/O
        names, dtypes (`dtype`: the manifest's, every input and output) or shapes the engine reports
        differently from its manifest."""


def shape_in_range(shape: Sequence[int], rng: ShapeRange) -> bool:
    lo, _opt, hi = rng
    return len(shape) == len(lo) and all(a <= s <= b for s, a, b in zip(shape, lo, hi))
