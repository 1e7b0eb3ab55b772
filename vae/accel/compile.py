"""torch.compile recipes for VAEs: per-region compilation that does not recompile on every prompt.

Compiling a whole VAE as one graph is slow to build, breaks on the causal-cache bookkeeping and
recompiles whenever anything about the call changes. Instead each *region* — every member of the
model's ModuleLists / Sequentials (resnets, attention, up/down blocks; found generically, without
architecture class names) — is compiled on its own, in place, the way `nn.Module.compile` does it:
state-dict keys, `.to()` and the architecture code are untouched.

Side effects, all required by torch and documented here: dynamo's per-code-object recompile limit
(`torch._dynamo.config.recompile_limit`, a.k.a. `cache_size_limit`) is process-wide, so it is
*raised* to `settings.cache_size_limit` when lower, never lowered. All regions share the code object
of `nn.Module._call_impl`, which is why the default of 8 is too small for a VAE.

If compilation fails (no C compiler, no Triton, an unsupported op) the model runs eagerly and one
warning is logged; genuine errors (the eager call fails too) are raised as usual. The eager re-run
starts from the causal state the region started from (`CausalState` snapshots; a region's tensor
inputs are also kept for input geometries it has not yet completed, where a compile is likely), and
runs after the `except` block so the failed attempt's memory is released first. An out-of-memory is
not a compile failure: it propagates to the pass's own retry (smaller tiles / slices).

torch.compile's own CUDA graphs (mode reduce-overhead or max-autotune, backend cudagraphs) are refused:
their outputs live in a pool the next replay overwrites, and the causal caches a region returns are
kept across calls. Whole-pass CUDA graphs (`cuda_graphs=True`, vae/accel/cuda_graphs.py) handle that.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch
from torch import nn

from . import self_checks
from ..causal_cache import CausalState
from ..gpu_defaults import COMPILE_ARCHITECTURES, COMPILE_MEASURED
from ..memory.oom import is_out_of_memory, release_cached

log = logging.getLogger("turbovae")

MODES = ("default", "max-autotune-no-cudagraphs")
# Backends every torch build has that run a region without CUDA graph trees: what the nodes offer.
BACKENDS = ("inductor", "aot_eager", "eager")
# torch.compile settings that capture CUDA graph trees around each region: refused (see the module doc).
GRAPH_TREE_MODES = ("reduce-overhead", "max-autotune")
GRAPH_TREE_BACKENDS = ("cudagraphs",)
DYNAMIC = {"auto": None, "true": True, "false": False}


@dataclass(frozen=True)
class CompileSettings:
    """What to hand to torch.compile for every region (hashable: it keys the compiled-model cache)."""

    backend: str = "inductor"
    mode: str = "default"
    dynamic: str = "auto"  # auto: static first, dynamic after a shape change (torch's dynamic=None)
    fullgraph: bool = False
    cache_size_limit: int = 64
    cuda_graphs: bool = False  # also capture whole passes as CUDA graphs (TurboVAE.use_cuda_graphs)
    # Which architectures the loader compiles on CUDA (vae/gpu_defaults.py): where compile measured faster, or all.
    architectures: str = COMPILE_MEASURED

    def __post_init__(self) -> None:
        backends = available_backends()
        if not isinstance(self.backend, str) or self.backend not in backends:
            raise ValueError(f"unknown torch.compile backend {self.backend!r}; choose one of {', '.join(backends)}")
        if self.mode in GRAPH_TREE_MODES or self.backend in GRAPH_TREE_BACKENDS:
            raise ValueError(f"torch.compile {self.backend}/{self.mode} captures CUDA graphs around each region, "
                             "whose outputs the next replay overwrites, and the VAE keeps its causal caches across "
                             "calls; use mode default or max-autotune-no-cudagraphs, and cuda_graphs=True for "
                             "whole-pass CUDA graphs")
        if self.mode not in MODES:
            raise ValueError(f"unknown compile mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.dynamic not in DYNAMIC:
            raise ValueError(f"dynamic must be one of {', '.join(DYNAMIC)} (got {self.dynamic!r})")
        if not isinstance(self.fullgraph, bool):
            raise ValueError(f"fullgraph must be True or False (got {self.fullgraph!r})")
        if isinstance(self.cache_size_limit, bool) or not isinstance(self.cache_size_limit, int) \
                or self.cache_size_limit < 1:
            raise ValueError(f"cache_size_limit must be an integer >= 1 (got {self.cache_size_limit!r})")
        if not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be True or False (got {self.cuda_graphs!r})")
        if self.architectures not in COMPILE_ARCHITECTURES:
            raise ValueError(f"architectures must be one of {', '.join(map(repr, COMPILE_ARCHITECTURES))} "
                             f"(got {self.architectures!r})")

    def torch_compile_kwargs(self) -> dict:
        """Keyword arguments for torch.compile (mode is an inductor option; other backends ignore it)."""
        kwargs = {"backend": self.backend, "dynamic": DYNAMIC[self.dynamic], "fullgraph": self.fullgraph}
        if self.backend == "inductor" and self.mode != "default":
            kwargs["mode"] = self.mode
        return kwargs


def available_backends() -> list[str]:
    import torch._dynamo

    return sorted(set(torch._dynamo.list_backends(exclude_tags=())) | set(BACKENDS))


def find_regions(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of every member of a ModuleList/Sequential, outermost first.

    A member that is itself a container is descended into; a member is never split further. A model
    without containers is a single region (itself, named "").
    """
    regions: list[tuple[str, nn.Module]] = []

    def visit(module: nn.Module, prefix: str) -> None:
        in_list = isinstance(module, (nn.ModuleList, nn.Sequential))
        for name, child in module.named_children():
            path = f"{prefix}.{name}" if prefix else name
            if in_list and not isinstance(child, (nn.ModuleList, nn.Sequential, nn.ModuleDict)):
                regions.append((path, child))
            else:
                visit(child, path)

    visit(model, "")
    return regions or [("", model)]


class _CompileState:
    """Shared by the regions of one compiled model: one failure switches them all to eager."""

    def __init__(self) -> None:
        self.failed = False


class _RegionCall:
    """Installed as a region's `_compiled_call_impl`: compiled call with an eager safety net."""

    def __init__(self, module: nn.Module, compiled: Callable, state: _CompileState, settings: CompileSettings):
        self._module = weakref.ref(module)
        self.compiled = compiled
        self.state = state
        self.settings = settings
        self.settled: set = set()  # input geometries this region has completed compiled

    def __call__(self, *args, **kwargs):
        module = self._module()
        device = _device_of(module, args)
        if self.state.failed or not self_checks.enabled("compile", device):
            return module._call_impl(*args, **kwargs)
        geometry = _geometry(args, kwargs)
        kept = None if geometry in self.settled else _with_cloned_tensors(args, kwargs)
        states = [(a, a.snapshot()) for a in (*args, *kwargs.values()) if isinstance(a, CausalState)]
        failure = None
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as compile_exc:
            if is_out_of_memory(compile_exc):
                raise  # not a compile failure: the pass retries smaller
            failure = _root_cause(compile_exc)
        if failure is None:
            self.settled.add(geometry)
            self_checks.used("compile")
            return out
        # Outside the except block: the failed attempt's tensors are released; the region starts again from
        # the causal state (and, where kept, the inputs) it was called with.
        for causal, saved in states:
            causal.restore(saved)
        if kept is not None:
            args, kwargs = kept
        release_cached()
        out = module._call_impl(*args, **kwargs)  # raises the genuine error if there is one
        self.state.failed = True
        self_checks.fail("compile", device, f"torch.compile ({_describe(self.settings)}) failed: {failure}")
        return out


def _geometry(args: tuple, kwargs: dict) -> tuple:
    """Shape, strides, dtype and device of the tensor arguments: what decides whether a call compiles anew."""
    return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) for a in (*args, *kwargs.values())
                 if isinstance(a, torch.Tensor))


def _with_cloned_tensors(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call's arguments with its tensors copied: what an eager re-run reads if the failed attempt
    wrote into its inputs (in-place residual adds) before failing."""
    def keep(a):
        return a.clone() if isinstance(a, torch.Tensor) else a

    return tuple(keep(a) for a in args), {k: keep(v) for k, v in kwargs.items()}


def _device_of(module: nn.Module, args: tuple) -> torch.device:
    """Where a region runs: its weights' device, else its first tensor argument's (the CPU if neither)."""
    weight = next(module.parameters(), None)
    if weight is not None:
        return weight.device
    return next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))


def _describe(settings: CompileSettings) -> str:
    return f"backend={settings.backend}, mode={settings.mode}, dynamic={settings.dynamic}"


def _root_cause(exc: BaseException) -> str:
    """Innermost cause (dynamo wraps backend errors), as 'Type: first line'."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "inner_exception", None) or exc.__cause__
        if inner is None:
            break
        exc = inner
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


# model -> settings -> (state, {region name: _RegionCall}); weak so unloading a model frees its graphs.
_CACHE: "weakref.WeakKeyDictionary[nn.Module, dict[CompileSettings, tuple[_CompileState, dict[str, _RegionCall]]]]"
_CACHE = weakref.WeakKeyDictionary()


def apply_compile(model: nn.Module, settings: Optional[CompileSettings] = None) -> nn.Module:
    """Compile `model`'s regions in place with `settings` and return `model`.

    Calling it again with the same settings is free; with other settings, the regions switch to
    that variant (variants are cached per model, so switching back does not recompile).
    """
    # graphs and the loader's choice of architectures do not change what compiles
    settings = replace(settings or CompileSettings(), cuda_graphs=False, architectures=COMPILE_MEASURED)
    _raise_recompile_limit(settings.cache_size_limit)
    variants = _CACHE.setdefault(model, {})
    if settings not in variants:
        state = _CompileState()
        calls = {}
        for name, region in find_regions(model):
            compiled = torch.compile(region._call_impl, **settings.torch_compile_kwargs())
            calls[name] = _RegionCall(region, compiled, state, settings)
        variants[settings] = (state, calls)
    _state, calls = variants[settings]
    for name, call in calls.items():
        region = model.get_submodule(name) if name else model
        region._compiled_call_impl = call
    return model


def remove_compile(model: nn.Module) -> nn.Module:
    """Back to eager for every region (the compiled variants stay cached for a later apply_compile)."""
    for name, region in find_regions(model):
        if isinstance(getattr(region, "_compiled_call_impl", None), _RegionCall):
            region._compiled_call_impl = None
    return model


def compile_failed(model: nn.Module) -> bool:
    """True when the active compiled variant of `model` fell back to eager."""
    for _name, region in find_regions(model):
        call = getattr(region, "_compiled_call_impl", None)
        if isinstance(call, _RegionCall):
            return call.state.failed
    return False


def _raise_recompile_limit(limit: int) -> None:
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    if getattr(dynamo_config, name) < limit:
        setattr(dynamo_config, name, limit)
