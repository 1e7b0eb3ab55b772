"""`python -m turbovae doctor [--json]`: what this install has, and whether its fast paths run right here.

What a user pastes into a bug report, and the first step of the GPU lease run (scripts/gpu_run.sh): the
versions of everything TurboVAE may use, the devices with their free memory, each GPU fast path — available
or why not, and its self-check result on the default device (vae/accel/self_checks runs the checks by calling each
path the way a pass does) —, the conv3d route chosen for half precision, and a micro-benchmark per
architecture (decode and encode on the default device and dtype, with the error against fp32). Seeded
random weights: no checkpoint is needed. The JSON fields are documented in docs/gpu.md.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.metadata
import importlib.util
import json
import math
import platform
import time
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

SCHEMA = 1
BENCH_SECONDS = {"cuda": 20.0, "cpu": 4.0}  # the micro-bench's time budget on each device type
GPU_IMAGE_PX = 512  # micro-bench image side on a GPU (real configs); the CPU runs tiny configs at TINY_IMAGE_PX
TINY_IMAGE_PX = 64
OPTIONAL = ("triton", "tensorrt", "onnx", "onnxruntime", "diffusers")


# -- versions and devices ------------------------------------------------------------------------------------

def _package_version(name: str) -> Optional[str]:
    """The installed distribution's version without importing it (None: not installed)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def comfyui_version() -> Optional[str]:
    """ComfyUI's version when it is importable here (its `comfyui_version` module; never imports `comfy`)."""
    if importlib.util.find_spec("comfy") is None:
        return None
    try:
        return str(importlib.import_module("comfyui_version").__version__)
    except (ImportError, AttributeError):
        return "importable (version unknown)"


def versions() -> dict:
    from . import __version__
    from .bench.common import gpu_driver_version
    from .vae.accel.kernels.conv_guard import cudnn_version_str

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    out = {"turbovae": __version__, "python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": cudnn_version_str(cudnn) if cudnn else None,
           "driver": gpu_driver_version() if torch.cuda.is_available() else None}
    out.update({name: _package_version(name) for name in OPTIONAL})
    out["comfyui"] = comfyui_version()
    return out


def devices() -> list[dict]:
    """Each device with its memory and the default budget of a pass's own tensors there (`turbovae.MemoryBudget`
    outside ComfyUI: what automatic slices and tiles are sized against, docs/memory.md)."""
    from .vae.free_memory import free_memory_bytes, total_memory_bytes
    from .vae.memory_budget import default_budget_bytes

    def memory(dev: torch.device) -> dict:
        return {"total_mb": round(total_memory_bytes(dev) / 2**20), "free_mb": round(free_memory_bytes(dev) / 2**20),
                "pass_budget_mb": round(default_budget_bytes(dev) / 2**20)}

    cpu = torch.device("cpu")
    found = [{"name": "cpu", "model": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
              **memory(cpu)}]
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        dev = torch.device("cuda", i)
        props = torch.cuda.get_device_properties(dev)
        found.append({"name": str(dev), "model": props.name, "capability": f"{props.major}.{props.minor}",
                      **memory(dev)})
    return found


# -- fast paths ------------------------------------------------------------------------------------------------

class _ProbeBlock(nn.Module):
    """A VAE-like region for the compile and CUDA-graph probes: conv, GroupNorm+SiLU, conv, residual."""

    def __init__(self, channels: int = 32):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .vae.norms import group_norm_silu

        return x + self.conv2(group_norm_silu(self.conv1(x), 8, None, None, 1e-6))


def _probe_block(device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    block = nn.ModuleList([_ProbeBlock()]).to(device=device, dtype=dtype).eval()
    x = torch.randn(1, 32, 16, 16, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)
    return block, x


def _run_norms(device: torch.device, dtype: torch.dtype) -> None:
    from .vae import norms

    x = torch.randn(1, 64, 2, 16, 16, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)
    gamma = torch.ones(64, 1, 1, 1, device=device, dtype=dtype)
    norms.group_norm_silu(x, 32, None, None, 1e-6)
    norms.rms_norm_silu(x, gamma)


def _run_conv3d(device: torch.device, dtype: torch.dtype) -> None:
    from .vae.accel.kernels import conv_guard

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 32, 3, 12, 12, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(32, 32, 3, 3, 3, generator=g) / math.sqrt(27 * 32)).to(device=device, dtype=dtype)
    conv_guard.conv3d(x, w, None, 1, (0, 1, 1))  # one output frame
    conv_guard.conv3d(x, w, None, 1, 1)


def _run_cuda_graphs(device: torch.device, dtype: torch.dtype) -> None:
    from .vae.accel.cuda_graphs import CudaGraphRunner

    block, x = _probe_block(device, dtype)
    runner = CudaGraphRunner(block[0], max_graphs=1)
    with torch.inference_mode():
        runner(x)
        runner(x)
    runner.invalidate()


def _run_compile(device: torch.device, dtype: torch.dtype) -> None:
    from .vae.accel import self_checks
    from .vae.accel.compile import CompileSettings, apply_compile

    block, x = _probe_block(device, dtype)
    with torch.inference_mode():
        eager = block[0](x)
        apply_compile(block, CompileSettings())
        self_checks.check("compile", device, f"doctor probe block {str(dtype).removeprefix('torch.')}",
                         lambda: block[0](x), lambda: eager)


def _run_channels_last(device: torch.device, dtype: torch.dtype) -> None:
    from .vae.accel.channels_last import channels_last_trusted

    channels_last_trusted(device, dtype)


def _availability(device: torch.device) -> dict[str, tuple[bool, str, Optional[Callable]]]:
    """path -> (available on `device`, why / what, the probe that exercises it here or None)."""
    import torch.distributed as dist

    from .vae.accel import self_checks
    from .vae.accel.kernels import ENV_DISABLE, default_dispatch, triton_available

    gpu = self_checks.applies_to(device)
    not_gpu = f"GPU-only; the device is {device}"
    if not gpu:
        triton = (False, not_gpu, None)
    elif not triton_available():
        triton = (False, "Triton is not installed", None)
    elif default_dispatch() is None:
        triton = (False, f"Triton unusable or disabled ({ENV_DISABLE})", None)
    else:
        triton = (True, "fused Triton kernels", _run_norms)
    engines = [name for name, ok in (("aoti", importlib.util.find_spec("torch._inductor") is not None),
                                     ("tensorrt", _package_version("tensorrt") is not None)) if ok]
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = dist.is_available() and dist.is_nccl_available() and n_gpus >= 1
    return {
        "triton_norms": triton,
        "conv3d_route": (gpu, "see conv3d_route" if gpu else not_gpu, _run_conv3d if gpu else None),
        "channels_last": (gpu, "channels-last convs" if gpu else not_gpu, _run_channels_last if gpu else None),
        "cuda_graphs": (gpu, "opt-in (use_cuda_graphs / the Compile Settings node)" if gpu else not_gpu,
                        _run_cuda_graphs if gpu else None),
        "compile": (True, "opt-in (the Compile Settings node); checked here on GPUs only (a CPU compile takes "
                          "minutes)" if not gpu else "opt-in (the Compile Settings node)",
                    _run_compile if gpu else None),
        "engines": (bool(engines), f"backends: {', '.join(engines)}; engines fall back to PyTorch by themselves"
                    if engines else "no engine backend", None),
        "process_group": (nccl, f"NCCL with {n_gpus} GPU(s); checked by the first multi-GPU pass (needs a "
                                "process group)" if nccl else "no NCCL (needs CUDA and torch.distributed)", None),
    }


def fast_path_report(device: torch.device, dtype: torch.dtype) -> list[dict]:
    """Each path: available, why, and its self-check on (device, dtype): passed / failed / skipped / not run."""
    from .vae.accel import self_checks

    rows = []
    for name, (available, why, probe) in _availability(device).items():
        if available and probe is not None:
            try:
                probe(device, dtype)
            except Exception as exc:  # noqa: BLE001 - a probe outside the guarded calls: report it as failed
                self_checks.fail(name, device, exc)
        dev = self_checks.device_name(device)
        mine = [r for r in self_checks.results() if r.path == name and r.device == dev]
        failed = [r for r in mine if not r.ok]
        if failed:
            check, detail = "failed", failed[0].detail
        elif mine:
            check, detail = "passed", "; ".join(f"{r.key}: {r.detail}" for r in mine)
        elif available and probe is not None and not self_checks.self_check_enabled():
            check, detail = "skipped", f"{self_checks.ENV_SELF_CHECK}=0"
        else:
            check, detail = "not run", why if not available or probe is None else "the path declined the probe"
        rows.append({"path": name, "what": self_checks.PATHS[name].what, "available": available, "why": why,
                     "self_check": check, "detail": detail, "fallback": self_checks.PATHS[name].fallback,
                     "enabled": self_checks.enabled(name, device)})
    return rows


def conv3d_routes(device: torch.device) -> list[dict]:
    from .vae.accel.kernels.conv_guard import current_route

    return [{"dtype": str(dtype).removeprefix("torch."), "route": r.route, "reason": r.reason}
            for dtype in (torch.bfloat16, torch.float16) for r in [current_route(dtype, device.type)]]


# -- micro-benchmark ---------------------------------------------------------------------------------------

def _architectures(real: bool) -> list[tuple[str, Callable[[], nn.Module]]]:
    """(name, builder) of every registered family (vae/registry.py), real or tiny config."""
    from .vae.registry import families

    return [(fam.key, lambda fam=fam: fam.build_model(fam.config(real=real))) for fam in families()]


def _seeded_model(build: Callable[[], nn.Module], device: torch.device) -> nn.Module:
    from .bench.common import fan_in_weights

    with torch.device("meta"):
        model = build()
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    model.load_state_dict(fan_in_weights(shapes), assign=True)
    return model.to(device).eval()


def _timed(fn: Callable[[], torch.Tensor], device: torch.device, deadline: float, repeat: int = 3
           ) -> tuple[float, torch.Tensor, int]:
    """Median ms of up to `repeat` runs after one warm-up, stopping early at `deadline`; the last output."""
    from .bench.common import sync

    out = fn()
    sync(device)
    times = []
    while len(times) < repeat and (not times or time.perf_counter() < deadline):
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2], out, len(times)


def micro_bench(device: torch.device, dtype: torch.dtype, budget_s: float) -> list[dict]:
    """Decode and encode of one image per architecture (real configs at 512² on a GPU, tiny configs at 64² on
    the CPU), as `load_vae` would run it (`dtype`, default paths), against the same weights in fp32 on the
    architecture's plain path, same input; an architecture that would start after the budget is skipped."""
    from .bench.common import max_abs, psnr
    from .bench.gpu import set_arch_paths
    from .vae.api import TurboVAE

    real = device.type == "cuda"
    px = GPU_IMAGE_PX if real else TINY_IMAGE_PX
    start = time.perf_counter()
    rows = []
    for arch, build in _architectures(real):
        base = {"architecture": arch, "config": "real" if real else "tiny", "image_px": px,
                "dtype": str(dtype).removeprefix("torch.")}
        if time.perf_counter() - start > budget_s:
            rows += [dict(base, direction=d, status="skipped: over the time budget") for d in ("decode", "encode")]
            continue
        model = _seeded_model(build, device)
        fast = TurboVAE(copy.deepcopy(model).to(dtype))  # as loaded: the default dtype and paths
        set_arch_paths(model, fast=False, channels_last=False)
        reference = TurboVAE(model)  # the same weights in fp32 on the architecture's plain path
        f = reference.spatial_factor
        g = torch.Generator().manual_seed(0)
        inputs = {"decode": torch.randn(1, reference.latent_channels, 1, px // f, px // f, generator=g),
                  "encode": torch.rand(1, reference.image_channels, 1, px, px, generator=g) * 2 - 1}
        for direction, x in inputs.items():
            run = (lambda vae, x=x: vae.decode(x)) if direction == "decode" else (lambda vae, x=x: vae.encode(x))
            deadline = start + budget_s
            try:
                with torch.inference_mode():
                    ms, out, runs = _timed(lambda: run(fast), device, deadline)
                    want = run(reference)
            except Exception as exc:  # noqa: BLE001 - reported, never fatal: the doctor must finish
                rows.append(dict(base, direction=direction, status=f"failed: {type(exc).__name__}: {exc}"[:300]))
                continue
            rows.append(dict(base, direction=direction, status="ok", ms=round(ms, 3), runs=runs,
                             max_abs_err_vs_fp32=max_abs(out, want), psnr_db_vs_fp32=_finite(psnr(out, want))))
        del reference, fast
        if real:
            torch.cuda.empty_cache()
    return rows


def _finite(value: float) -> Optional[float]:
    return round(value, 2) if math.isfinite(value) else None  # identical outputs: no finite PSNR


# -- the report --------------------------------------------------------------------------------------------

def collect(device: Optional[str] = None, *, bench: bool = True, budget_s: Optional[float] = None) -> dict:
    """The whole doctor report as a JSON-ready dict (fields: docs/gpu.md)."""
    from .vae.accel import self_checks
    from .vae.api import resolve_device
    from .vae.dtypes import working_dtype

    t0 = time.perf_counter()
    dev = resolve_device(device)
    dtype = working_dtype(None, dev)
    report = {"schema": SCHEMA, "versions": versions(), "devices": devices(),
              "default_device": self_checks.device_name(dev), "dtype": str(dtype).removeprefix("torch."),
              "self_check_enabled": self_checks.self_check_enabled(),
              "fast_paths": fast_path_report(dev, dtype), "conv3d_route": conv3d_routes(dev)}
    budget = BENCH_SECONDS.get(dev.type, BENCH_SECONDS["cpu"]) if budget_s is None else budget_s
    report["bench"] = micro_bench(dev, dtype, budget) if bench else []
    report["fast_paths_off"] = [r.as_dict() for r in self_checks.off()]  # including any the bench switched off
    report["seconds"] = round(time.perf_counter() - t0, 2)
    return report


def format_text(report: dict) -> str:
    v = report["versions"]
    lines = ["TurboVAE doctor", "versions: " + ", ".join(f"{k} {v[k] or '-'}" for k in v), "devices:"]
    for d in report["devices"]:
        lines.append(f"  {d['name']}: {d['model']}, {d['free_mb']} MB free of {d['total_mb']} MB; a pass's default "
                     f"budget {d['pass_budget_mb']} MB")
    lines.append(f"default device {report['default_device']} ({report['dtype']}); self-checks "
                 + ("on" if report["self_check_enabled"] else "off (TURBOVAE_SELF_CHECK=0)"))
    lines.append("fast paths:")
    for p in report["fast_paths"]:
        state = p["self_check"] if p["available"] else "unavailable"
        lines.append(f"  {p['path']:<14} {state:<11} {p['detail'] if p['self_check'] != 'not run' else p['why']}")
    lines.append("conv3d route: " + "; ".join(f"{r['dtype']} {r['route']} ({r['reason']})"
                                               for r in report["conv3d_route"]))
    if report["bench"]:
        lines.append("micro-bench (one image; error against the fp32 plain path on the same weights):")
    for b in report["bench"]:
        if b["status"] != "ok":
            lines.append(f"  {b['architecture']:<10} {b['direction']:<6} {b['status']}")
            continue
        db = "identical" if b["psnr_db_vs_fp32"] is None else f"{b['psnr_db_vs_fp32']:.1f} dB"
        lines.append(f"  {b['architecture']:<10} {b['direction']:<6} {b['config']} {b['image_px']}² {b['dtype']}: "
                     f"{b['ms']:.1f} ms, max err {b['max_abs_err_vs_fp32']:.2e}, {db}")
    lines.append(f"({report['seconds']:.1f} s)")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON (fields: docs/gpu.md)")
    parser.add_argument("--out", help="also write the JSON report to this file, which must not exist (default: none)")
    parser.add_argument("--device", help="the device to check and bench (default: cuda when available, else cpu)")
    parser.add_argument("--no-bench", action="store_true", help="skip the micro-benchmark")
    parser.add_argument("--bench-seconds", type=float, help="the micro-benchmark's time budget (default: "
                        f"{BENCH_SECONDS['cuda']:.0f} s on a GPU, {BENCH_SECONDS['cpu']:.0f} s on the CPU)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .trt.fileio import atomic_write_text

    report = collect(args.device, bench=not args.no_bench, budget_s=args.bench_seconds)
    text = json.dumps(report, indent=2)
    if args.out:
        atomic_write_text(Path(args.out), text + "\n")
    print(text if args.json else format_text(report), flush=True)
    return 0
