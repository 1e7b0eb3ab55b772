"""Registry of the GPU-only fast paths: each one proves itself on the user's device or steps aside.

No TurboVAE GPU path can be tested on every GPU it will meet, so the product tests them where they run:
the first time a path runs on a device with a given dtype (and shape class, where the code specialises on
it), the call site hands `check` a small probe — the fast path and the plain PyTorch path on the same small
input of that call's layout. An exception, a NaN/Inf or an error beyond the path's stated tolerance switches
the path off on that device for the rest of the process, with one warning naming the path, the device, what
failed and the fallback, and the caller runs the fallback, so the pass goes on correctly. A failure a call
site detects on its own (a capture or compile that throws) goes through `fail`, with the same effect.

Under a tracer (torch.export, torch.compile, AOTInductor, an active FakeTensorMode: `vae.tracing`) no probe
runs: its tensors would be fake (a probe that cannot run there says nothing about the path, and the tensors
it makes would be baked into the traced program as constants). A traced call uses the state already decided
for its (device, key), or, while undecided, the plain path for that trace; nothing is recorded, and a failure
reported under a tracer switches nothing off.

An out-of-memory is not a failed check either (`vae.memory.oom.OomStreak`, the rule CUDA graphs and engines follow):
the probe's or the launch's out-of-memory is re-raised so the pass frees and retries by the tiler's rule,
the path is kept and checked again, and only `OOM_FAILURES_TO_DISABLE` in a row on a (path, device) switch
it off — and only a path that costs memory (`FastPath.saves_memory` False: graph pools, compiled buffers,
engines). A path that saves memory is never switched off by an out-of-memory: its fallback needs more memory,
so the next attempt would be more likely to fail, not less (`oom_may_switch_off`).

`TURBOVAE_SELF_CHECK=0` skips the probes (for setups already validated); failures detected at run time
still switch a path off. The registry also counts which paths ran, for the per-pass log line
(`summary_since`). One table, `PATHS`, holds each path's name, fallback and tolerance.

The paths are GPU-only: their call sites ask `applies_to(device)` and keep the plain path elsewhere.
`gpu_paths_on_cpu()` lets them run on CPU tensors too, so that their checks and fallbacks can be driven by
injected failures without a GPU (tests do this).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterator, Optional, Union

import torch

from ..memory.oom import OOM_FAILURES_TO_DISABLE, OomStreak, describe, is_out_of_memory, release_cached
from ..tracing import tracing

log = logging.getLogger("turbovae")

ENV_SELF_CHECK = "TURBOVAE_SELF_CHECK"
HALF_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Tolerance:
    """How far a fast path may be from the plain path on a probe.

    fp32: max abs error over the reference's largest magnitude (at least 1); fp16/bf16: norm-wise relative
    error (a half path rounds differently element by element, so a max-error bound would be noise).
    """

    fp32: float
    half: float

    def limit(self, dtype: torch.dtype) -> float:
        return self.half if dtype in HALF_DTYPES else self.fp32

    def error(self, fast: torch.Tensor, reference: torch.Tensor) -> float:
        f, r = fast.detach().float(), reference.detach().float()
        if fast.dtype in HALF_DTYPES or reference.dtype in HALF_DTYPES:
            return ((f - r).norm() / r.norm().clamp_min(1e-12)).item()
        return ((f - r).abs().max() / r.abs().max().clamp_min(1.0)).item()


@dataclass(frozen=True)
class FastPath:
    """One GPU-only path: what it is, what runs instead once it is off, its probe tolerance (None: the
    path is exact by construction or its own output is the check, so only exceptions count), and whether it
    saves memory against its fallback (then no out-of-memory ever switches it off: `oom_may_switch_off`)."""

    name: str
    what: str
    fallback: str
    tolerance: Optional[Tolerance]
    saves_memory: bool


NORM_TOLERANCE = Tolerance(fp32=1e-4, half=1e-2)  # docs/gpu.md: the kernels' test criteria, with margin
CONV_TOLERANCE = Tolerance(fp32=1e-4, half=2e-2)  # another conv algorithm: another summation order
PASS_TOLERANCE = Tolerance(fp32=1e-4, half=2e-2)  # a whole pass (graph replay, compiled region) vs eager

# saves_memory, per path, from what its fallback holds: the PyTorch norms make fp32 copies and intermediates the
# fused kernels do not; the fp32 conv3d is twice the bytes of the routed half conv; contiguous half convs take
# workspaces of their input and output size that channels-last ones do not (docs/memory.md); the single-device
# pass holds N times a band's memory (docs/multi_gpu.md). Against that, CUDA graphs keep a private pool, compiled
# regions their own buffers (SeedVR2 1080p: +59 % peak, docs/memory.md), and engines their activations and copy of
# the weights.
PATHS: dict[str, FastPath] = {p.name: p for p in (
    FastPath("triton_norms", "Triton GroupNorm/RMS-norm(+SiLU) kernels", "the PyTorch norm ops", NORM_TOLERANCE,
             saves_memory=True),
    FastPath("conv3d_route", "conv3d regression guard route (cuDNN call / conv2d sums)", "fp32 conv3d",
             CONV_TOLERANCE, saves_memory=True),
    FastPath("channels_last", "channels-last activations", "contiguous (NCHW/NCDHW) activations", CONV_TOLERANCE,
             saves_memory=True),
    FastPath("cuda_graphs", "CUDA graphs", "eager passes", PASS_TOLERANCE, saves_memory=False),
    FastPath("compile", "torch.compile regions", "eager regions (the VAE runs eagerly)", PASS_TOLERANCE,
             saves_memory=False),
    FastPath("engines", "TensorRT/AOTInductor engines", "the PyTorch VAE", None, saves_memory=False),
    FastPath("process_group", "the multi-GPU pass's process group (NCCL)",
             "the single-device exact pass on every rank", Tolerance(fp32=0.0, half=0.0), saves_memory=True),
)}


def oom_may_switch_off(path: str) -> bool:
    """Whether out-of-memory failures in a row (`vae.memory.oom.OomStreak`) may switch `path` off: only where the path
    costs memory. A path that saves memory stays on whatever the streak: its fallback would need more.
    KeyError for a name not in `PATHS`."""
    if path not in PATHS:
        raise KeyError(f"no fast path named {path!r}; the paths are {', '.join(PATHS)}")
    return not PATHS[path].saves_memory


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one self-check (or of a failure seen at run time, `key` None)."""

    path: str
    device: str
    key: Optional[Hashable]
    ok: bool
    detail: str  # "error 3.1e-06 <= 1e-04", or what failed

    def as_dict(self) -> dict:
        return {"path": self.path, "device": self.device, "key": None if self.key is None else repr(self.key),
                "ok": self.ok, "detail": self.detail}


class SelfCheckFailed(Exception):
    """A probe whose output is not finite or is beyond the path's tolerance."""


def device_name(device: Union[str, torch.device]) -> str:
    """'cuda:0' for cuda / cuda:0 on a one-GPU machine, 'cpu' for the CPU: the registry's device key."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cuda"
    return str(dev)


def self_check_enabled() -> bool:
    return os.environ.get(ENV_SELF_CHECK, "1").strip().lower() not in ("0", "false", "no", "off")


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def compare(path: FastPath, fast: Any, reference: Any) -> str:
    """'error … <= limit' when `fast` matches `reference` within the path's tolerance; SelfCheckFailed else."""
    fast_t, ref_t = _tensors(fast), _tensors(reference)
    if len(fast_t) != len(ref_t) or any(f.shape != r.shape for f, r in zip(fast_t, ref_t)):
        raise SelfCheckFailed(f"output shapes {[tuple(t.shape) for t in fast_t]} instead of "
                              f"{[tuple(t.shape) for t in ref_t]}")
    worst = 0.0
    for f, r in zip(fast_t, ref_t):
        if not torch.isfinite(f).all():
            raise SelfCheckFailed("the output has NaN/Inf values" + ("" if torch.isfinite(r).all() else
                                                                    " (so has the reference)"))
        if path.tolerance is not None:
            worst = max(worst, path.tolerance.error(f, r))
    if path.tolerance is None:
        return "ran"
    limit = max(path.tolerance.limit(t.dtype) for t in fast_t) if fast_t else 0.0
    if worst > limit:
        raise SelfCheckFailed(f"error {worst:.2e} against the plain path exceeds its tolerance {limit:.0e}")
    return f"error {worst:.2e} <= {limit:.0e}"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SelfCheckFailed):
        return str(exc)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


class FastPathRegistry:
    """Per process: which paths are off on which device and why, the check results, and use counts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: dict[tuple[str, str, Hashable], CheckResult] = {}
        self._off: dict[tuple[str, str], CheckResult] = {}
        self._used: Counter = Counter()
        self._cpu_too = 0
        self._oom = OomStreak(OOM_FAILURES_TO_DISABLE)  # per (path, device)

    # -- where the paths apply -------------------------------------------------------------------
    def applies_to(self, device: Union[str, torch.device]) -> bool:
        """Whether GPU-only paths may run for tensors on `device` (CUDA; the CPU too inside gpu_paths_on_cpu)."""
        kind = torch.device(device).type
        return kind == "cuda" or (kind == "cpu" and self._cpu_too > 0)

    @contextmanager
    def gpu_paths_on_cpu(self) -> Iterator[None]:
        with self._lock:
            self._cpu_too += 1
        try:
            yield
        finally:
            with self._lock:
                self._cpu_too -= 1

    # -- state -----------------------------------------------------------------------------------
    def enabled(self, path: str, device: Union[str, torch.device]) -> bool:
        return (path, device_name(device)) not in self._off

    def off(self) -> list[CheckResult]:
        """The failures that switched a path off, in the order they happened."""
        return list(self._off.values())

    def results(self) -> list[CheckResult]:
        return list(self._results.values())

    def reset(self) -> None:
        """Forget every check, failure and count (tests; a new device setup)."""
        with self._lock:
            self._results.clear()
            self._off.clear()
            self._used.clear()
            self._oom.clear()

    # -- checks and failures ---------------------------------------------------------------------
    def check(self, path: str, device: Union[str, torch.device], key: Hashable, fast: Callable[[], Any],
              reference: Callable[[], Any]) -> bool:
        """Whether `path` may run on `device` for calls of class `key`: runs `fast()` and `reference()` (a
        small probe) the first time (device, key) is seen, and switches the path off if the probe fails.

        Under a tracer the probe never runs: the decided state is returned, False while undecided (the
        trace takes the plain path), and nothing is recorded. A probe that runs out of memory re-raises
        (see `out_of_memory`): the pass retries by the tiler's rule and the check runs again."""
        dev = device_name(device)
        if (path, dev) in self._off:
            return False
        found = self._results.get((path, dev, key))
        if found is not None:
            return found.ok
        if not self_check_enabled():
            return True
        if tracing():
            return False
        spec = PATHS[path]
        try:
            detail = compare(spec, fast(), reference())
        except Exception as exc:  # noqa: BLE001 - a probe that fails for any reason means: do not trust the path
            if is_out_of_memory(exc):
                self.out_of_memory(path, dev, exc)
                raise
            self.fail(path, dev, f"self-check on {key}: {_describe(exc)}", key=key)
            return False
        with self._lock:
            self._results[(path, dev, key)] = CheckResult(path, dev, key, True, detail)
        self._oom.succeeded((path, dev))
        return True

    def decided(self, path: str, device: Union[str, torch.device], key: Hashable) -> Optional[bool]:
        """The recorded outcome for (path, device, key) without running anything: False once the path is off
        on the device, the check's result where it ran, None while undecided."""
        dev = device_name(device)
        if (path, dev) in self._off:
            return False
        found = self._results.get((path, dev, key))
        return None if found is None else found.ok

    def out_of_memory(self, path: str, device: Union[str, torch.device], err: Union[str, BaseException]) -> bool:
        """Note that `path` ran out of memory on `device` (its probe or a launch): the cached blocks are
        released and the path is kept, unless this made `OOM_FAILURES_TO_DISABLE` in a row of a path that costs
        memory (`oom_may_switch_off`), which switches it off. True when the path was switched off. The caller
        re-raises, so the pass retries smaller."""
        dev = device_name(device)
        reason = err if isinstance(err, str) else describe(err)
        if tracing():
            return False
        release_cached(dev)
        with self._lock:
            streak = self._oom.failed((path, dev))
        if streak >= self._oom.limit and oom_may_switch_off(path):
            self.fail(path, dev, f"out of memory {streak} times in a row; last: {reason}")
            return True
        if streak == 1:
            log.warning("turbovae: %s ran out of memory on %s (%s); the path is kept and the pass retries",
                        PATHS[path].what, dev, reason)
        return False

    def fail(self, path: str, device: Union[str, torch.device], what_failed: Union[str, BaseException], *,
             key: Hashable = None) -> None:
        """Switch `path` off on `device` for the process: one warning, whatever the number of calls."""
        dev = device_name(device)
        spec = PATHS[path]
        what = what_failed if isinstance(what_failed, str) else _describe(what_failed)
        if tracing():  # a failure of the trace (fake tensors), not of the path on this device
            log.debug("turbovae: %s not switched off on %s: it failed under a tracer (%s)", spec.what, dev, what)
            return
        result = CheckResult(path, dev, key, False, what)
        with self._lock:
            self._results[(path, dev, key)] = result
            if (path, dev) in self._off:
                return
            self._off[(path, dev)] = result
        log.warning("turbovae: %s switched off on %s for this process (%s); using %s instead",
                    spec.what, dev, what, spec.fallback)

    # -- what ran, for the per-pass log line -------------------------------------------------------
    def used(self, path: str, device: Union[str, torch.device, None] = None) -> None:
        """Count a run of `path`; with `device`, a success there also ends its out-of-memory streak."""
        self._used[path] += 1
        if device is not None:
            self._oom.succeeded((path, device_name(device)))

    def oom_streak(self, path: str, device: Union[str, torch.device]) -> int:
        """Out-of-memory failures in a row of `path` on `device` (tests, the doctor)."""
        return self._oom.count((path, device_name(device)))

    def usage(self) -> Counter:
        return Counter(self._used)

    def summary_since(self, before: Counter) -> str:
        """'fast paths: triton_norms, channels_last; off: cuda_graphs (cuda:0)' for the calls since `before`."""
        ran = [p for p in PATHS if self._used[p] > before.get(p, 0)]
        off = [f"{r.path} ({r.device})" for r in self._off.values()]
        return f"fast paths: {', '.join(ran) or 'none'}" + (f"; off: {', '.join(off)}" if off else "")


REGISTRY = FastPathRegistry()

# The module-level API every call site uses.
applies_to = REGISTRY.applies_to
gpu_paths_on_cpu = REGISTRY.gpu_paths_on_cpu
enabled = REGISTRY.enabled
check = REGISTRY.check
fail = REGISTRY.fail
decided = REGISTRY.decided
out_of_memory = REGISTRY.out_of_memory
oom_streak = REGISTRY.oom_streak
used = REGISTRY.used
usage = REGISTRY.usage
summary_since = REGISTRY.summary_since
off = REGISTRY.off
results = REGISTRY.results
reset = REGISTRY.reset
