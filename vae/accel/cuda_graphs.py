"""Opt-in CUDA-graph runner for fixed-shape VAE passes.

A VAE decode launches thousands of small kernels; at 1024² the launch gaps are a visible share of
the time. Capturing the pass once per input shape and replaying it removes them. The price is
memory (the graph keeps its intermediates' pool) and rigidity (one graph per shape), so:

- graphs are keyed by the shapes, strides and dtypes of the tensor arguments (plus the values of
  the other arguments); at most `max_graphs` are kept, least recently used evicted first;
- all graphs of a runner share one memory pool (they replay one at a time on one stream);
- inputs are copied into static buffers, outputs are cloned out of the static ones by default;
- warm-up runs on a side stream before capture, as torch.cuda.graph requires;
- anything that is not all-CUDA simply runs eagerly;
- `state_key()` names what else the graphs baked in (where the weights live): when it changes, every
  graph is dropped, since a replay would read freed or moved memory;
- a capture that fails (a host sync in the pass) logs one warning and the runner runs eagerly from then
  on: graphs are an optimisation, never a new way to fail. A capture that runs out of memory is
  transient (other models were resident): its pool is released, that call runs eagerly, and the next
  call captures again; only `OOM_FAILURES_TO_DISABLE` out-of-memory failures in a row switch graphs off
  (the one rule of vae/memory/oom.py `OomStreak`);
- capture and replay run on the inputs' own device (`device_guard.on_device`): a model on a GPU that is not
  the current one captures on its own streams, and the caller's current device is left as it was;
- `pool_bytes` is what the captured graphs' private pool holds (the growth of reserved memory across
  captures), so whoever manages memory (ComfyUI's model management) can count it; `invalidate` frees it.

The captured callable must be capturable: no host synchronisation, no CPU-side data-dependent
control flow, and the same work for the same shapes (true for our decoders at fixed slicing).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Generic, Hashable, Optional, TypeVar

import torch

from .. import device_guard
from . import self_checks
from ..memory.oom import OOM_FAILURES_TO_DISABLE, OomStreak, describe, is_out_of_memory, release_cached

log = logging.getLogger("turbovae")

E = TypeVar("E")


def graph_key(args: tuple, kwargs: Optional[dict] = None) -> tuple:
    """What a captured graph depends on: tensor geometry/dtype/device, and the other arguments' values."""

    def one(a: Any) -> Hashable:
        if isinstance(a, torch.Tensor):
            return ("T", tuple(a.shape), tuple(a.stride()), a.dtype, str(a.device))
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(one(x) for x in a))
        try:
            hash(a)
        except TypeError as exc:
            raise ValueError(f"cannot key a CUDA graph on an unhashable argument of type {type(a).__name__}; "
                             "pass tensors and plain values only") from exc
        return ("V", a)

    kw = tuple(sorted((k, one(v)) for k, v in (kwargs or {}).items()))
    return tuple(one(a) for a in args), kw


class GraphCache(Generic[E]):
    """A bounded LRU map key -> entry that tells the owner which entries to release."""

    def __init__(self, max_entries: int, release: Callable[[E], None] = lambda e: None):
        if max_entries < 1:
            raise ValueError(f"max_graphs must be >= 1 (got {max_entries})")
        self.max_entries = max_entries
        self._release = release
        self._entries: "OrderedDict[Hashable, E]" = OrderedDict()
        self.builds = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list:
        return list(self._entries)

    def get_or_build(self, key: Hashable, build: Callable[[], E]) -> E:
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key]
        while len(self._entries) >= self.max_entries:
            _old_key, old = self._entries.popitem(last=False)
            self.evictions += 1
            self._release(old)
        entry = build()
        self.builds += 1
        self._entries[key] = entry
        return entry

    def clear(self) -> None:
        while self._entries:
            _k, entry = self._entries.popitem(last=False)
            self._release(entry)


@dataclass
class _Captured:
    graph: "torch.cuda.CUDAGraph"
    inputs: list  # static tensors, in the order of the flattened tensor arguments
    output: Any
    reference: Any = None  # the last warm-up's eager output, until the first replay is self-checked


def _flatten_tensors(obj: Any, out: list) -> None:
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _flatten_tensors(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _flatten_tensors(x, out)


def _replace_tensors(obj: Any, it) -> Any:
    if isinstance(obj, torch.Tensor):
        return next(it)
    if isinstance(obj, list):
        return [_replace_tensors(x, it) for x in obj]
    if isinstance(obj, tuple):
        return tuple(_replace_tensors(x, it) for x in obj)
    if isinstance(obj, dict):
        return {k: _replace_tensors(v, it) for k, v in obj.items()}
    return obj


def _map_output(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_output(x, fn) for x in obj)
    if isinstance(obj, dict):
        return {k: _map_output(v, fn) for k, v in obj.items()}
    return obj


class CudaGraphRunner:
    """Wraps `fn(*args, **kwargs)`; on CUDA, captures one graph per argument geometry and replays it.

    `clone_outputs=False` returns the static output tensors themselves: faster, but they are
    overwritten by the next call with the same shapes.
    """

    def __init__(self, fn: Callable, *, max_graphs: int = 4, warmup: int = 2, clone_outputs: bool = True,
                 state_key: Optional[Callable[[], Hashable]] = None):
        self.fn = fn
        self.warmup = warmup
        self.clone_outputs = clone_outputs
        self.cache: GraphCache[_Captured] = GraphCache(max_graphs, release=self._release)
        self._pool = None
        self._state_key = state_key
        self._state: Hashable = None
        self.disabled: Optional[str] = None  # why capture was given up, once it failed
        self._oom = OomStreak(OOM_FAILURES_TO_DISABLE)  # captures that ran out of memory in a row (vae/oom)
        self.pool_bytes = 0  # device memory the graphs' private pool holds

    @property
    def oom_failures(self) -> int:
        """Captures that ran out of memory since the last successful one."""
        return self._oom.count()

    @staticmethod
    def _release(entry: _Captured) -> None:
        entry.graph.reset()
        entry.inputs.clear()
        entry.output = None

    def invalidate(self) -> None:
        """Drop every graph (call after changing weights in a way that reallocates them, or moving the model)
        and give their pool back to the device."""
        held = self._pool is not None or len(self.cache) > 0
        self.cache.clear()
        self._pool = None
        self.pool_bytes = 0
        if held:
            release_cached("cuda")

    def _eligible(self, tensors: list) -> bool:
        """Whether this call may use a graph: all tensor arguments on CUDA, and not inside another capture."""
        return bool(tensors) and all(self_checks.applies_to(t.device) for t in tensors) \
            and self_checks.enabled("cuda_graphs", tensors[0].device) \
            and not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())

    def __call__(self, *args, **kwargs):
        tensors: list = []
        _flatten_tensors((args, kwargs), tensors)
        if self.disabled is not None or not self._eligible(tensors):
            return self.fn(*args, **kwargs)
        if self._state_key is not None:
            state = self._state_key()
            if state != self._state:
                self.invalidate()
                self._state = state
        key = graph_key(args, kwargs)
        failure: Optional[tuple[str, bool]] = None
        try:
            entry = self.cache.get_or_build(key, lambda: self._capture(args, kwargs, tensors))
        except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
            failure = describe(exc), is_out_of_memory(exc)
        if failure is not None:  # outside the except block: the failed capture's memory can be released
            self._capture_failed(*failure, tensors[0].device)
            return self.fn(*args, **kwargs)
        self._oom.succeeded()
        for static, new in zip(entry.inputs, tensors):
            static.copy_(new)
        try:
            with device_guard.on_device(tensors[0].device):
                entry.graph.replay()
        except Exception as exc:  # noqa: BLE001 - a graph that cannot replay: eager from now on
            return self._give_up(f"replay failed: {type(exc).__name__}: {exc}", tensors, args, kwargs)
        if entry.reference is not None:  # first replay of this graph: it must equal the eager warm-up
            reference, entry.reference = entry.reference, None
            what = f"graph for {[tuple(t.shape) for t in tensors]} {tensors[0].dtype}"
            if not self_checks.check("cuda_graphs", tensors[0].device, what, lambda: entry.output, lambda: reference):
                return self._give_up("its first replay differs from the eager pass", tensors, args, kwargs)
        self_checks.used("cuda_graphs")
        return _map_output(entry.output, torch.clone) if self.clone_outputs else entry.output

    def _capture_failed(self, reason: str, out_of_memory: bool, device: torch.device) -> None:
        """Release the pool; switch graphs off for good unless it was a (transient) out-of-memory, and
        after `OOM_FAILURES_TO_DISABLE` of those in a row. One warning either way."""
        self.invalidate()
        if out_of_memory:
            streak = self._oom.failed()
            if not (self._oom.exhausted() and self_checks.oom_may_switch_off("cuda_graphs")):
                if streak == 1:
                    log.warning("turbovae: CUDA graph capture ran out of memory (%s); this pass runs eagerly and "
                                "the next one captures again", reason)
                return
            reason = f"out of memory {streak} times in a row; last: {reason}"
        self._switch_off(reason, device, stage="capture failed: ")

    def _give_up(self, why: str, tensors: list, args: tuple, kwargs: dict):
        """Switch graphs off and run this call eagerly."""
        self._switch_off(why, tensors[0].device)
        return self.fn(*args, **kwargs)

    def _switch_off(self, why: str, device: torch.device, stage: str = "") -> None:
        """Graphs off for good on this runner, and for the device in vae/accel/self_checks (its one warning)."""
        self.disabled = why
        self.invalidate()
        self_checks.fail("cuda_graphs", device, stage + why)

    def _capture(self, args: tuple, kwargs: dict, tensors: list) -> _Captured:
        """Warm up, capture and measure the pool on the inputs' own device: streams, the pool handle and the
        graph belong to the *current* CUDA device, so a model on a GPU that is not the current one captures
        under `on_device` (and replays under it too), and the caller's current device is restored."""
        with device_guard.on_device(tensors[0].device):
            return self._capture_here(args, kwargs, tensors)

    def _capture_here(self, args: tuple, kwargs: dict, tensors: list) -> _Captured:
        reserved = torch.cuda.memory_reserved(tensors[0].device)
        statics = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t) for t in tensors]
        it = iter(statics)
        s_args = _replace_tensors(args, it)
        s_kwargs = _replace_tensors(kwargs, it)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                reference = self.fn(*s_args, **s_kwargs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            output = self.fn(*s_args, **s_kwargs)
        self.pool_bytes += max(0, torch.cuda.memory_reserved(tensors[0].device) - reserved)
        log.info("turbovae: captured a CUDA graph for %s (%d kept, at most %d; pool %.0f MiB)",
                 [tuple(t.shape) for t in tensors], len(self.cache) + 1, self.cache.max_entries,
                 self.pool_bytes / 2**20)
        checked = self_checks.self_check_enabled() and self.warmup > 0
        return _Captured(graph, statics, output, reference if checked else None)
