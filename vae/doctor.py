"""The doctor's report, which `python -m turbovae doctor` prints (cli/doctor.py says what it holds): versions,
devices, each fast path with its self-check, the conv3d route and a micro-benchmark per registered family, as a
JSON-ready dict (fields: docs/gpu.md) and as text.

Why in vae/: every probe and the micro-bench run library code only (seeded weights, no checkpoint), and the doctor
must run where the benchmark's optional packages are missing, so it imports nothing from bench/. The package's own
version comes from the caller: vae/ never imports the package above it.
"""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
import importlib.util
import math
import platform
import time
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


def gpu_driver_version() -> Optional[str]:
    """The NVIDIA driver version as nvidia-smi reports it (torch does not expose it); None when unknown."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def versions(turbovae_version: str) -> dict:
    """Each package's version (None: not installed), TurboVAE's first as its caller gives it."""
    from .accel.kernels.conv_guard import cudnn_version_str

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    out = {"turbovae": turbovae_version, "python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": cudnn_version_str(cudnn) if cudnn else None,
           "driver": gpu_driver_version() if torch.cuda.is_available() else None}
    out.update({name: _package_version(name) for name in OPTIONAL})
    out["comfyui"] = comfyui_version()
    return out


def devices() -> list[dict]:
    """Each device with its memory and the default budget of a pass's own tensors there (`turbovae.MemoryBudget`
    outside ComfyUI: what automatic slices and tiles are sized against, docs/memory.md)."""
    from .memory.device import free_memory_bytes, total_memory_bytes
    from .memory.budget import default_budget_bytes

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
        from .norms import group_norm_silu

        return x + self.conv2(group_norm_silu(self.conv1(x), 8, None, None, 1e-6))


def _probe_block(device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    block = nn.ModuleList([_ProbeBlock()]).to(device=device, dtype=dtype).eval()
    x = torch.randn(1, 32, 16, 16, generator=torch.Generator().manual_seed(1)).to(device=device, dtype=dtype)
    return block, x


def _run_norms(device: torch.device, dtype: torch.dtype) -> None:
    from . import norms

    x = torch.randn(1, 64, 2, 16, 16, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)
    gamma = torch.ones(64, 1, 1, 1, device=device, dtype=dtype)
    norms.group_norm_silu(x, 32, None, None, 1e-6)
    norms.rms_norm_silu(x, gamma)


def _run_conv3d(device: torch.device, dtype: torch.dtype) -> None:
    from .accel.kernels import conv_guard

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 32, 3, 12, 12, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(32, 32, 3, 3, 3, generator=g) / math.sqrt(27 * 32)).to(device=device, dtype=dtype)
    conv_guard.conv3d(x, w, None, 1, (0, 1, 1))  # one output frame
    conv_guard.conv3d(x, w, None, 1, 1)


def _run_cuda_graphs(device: torch.device, dtype: torch.dtype) -> None:
    from .accel.cuda_graphs import CudaGraphRunner

    block, x = _probe_block(device, dtype)
    runner = CudaGraphRunner(block[0], max_graphs=1)
    with torch.inference_mode():
        runner(x)
        runner(x)
    runner.invalidate()


def _run_compile(device: torch.device, dtype: torch.dtype) -> None:
    from .accel import self_checks
    from .accel.compile import CompileSettings, apply_compile

    block, x = _probe_block(device, dtype)
    with torch.inference_mode():
        eager = block[0](x)
        apply_compile(block, CompileSettings())
        self_checks.check("compile", device, f"doctor probe block {str(dtype).removeprefix('torch.')}",
                         lambda: block[0](x), lambda: eager)


def _run_channels_last(device: torch.device, dtype: torch.dtype) -> None:
    from .accel.channels_last import channels_last_trusted

    channels_last_trusted(device, dtype)


def _availability(device: torch.device) -> dict[str, tuple[bool, str, Optional[Callable]]]:
    """path -> (available on `device`, why / what, the probe that exercises it here or None)."""
    import torch.distributed as dist

    from .accel import self_checks
    from .accel.kernels import ENV_DISABLE, default_dispatch, triton_available

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
    from .accel import self_checks

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
    from .accel.kernels.conv_guard import current_route

    return [{"dtype": str(dtype).removeprefix("torch."), "route": r.route, "reason": r.reason}
            for dtype in (torch.bfloat16, torch.float16) for r in [current_route(dtype, device.type)]]


# -- micro-benchmark ---------------------------------------------------------------------------------------

def _architectures(real: bool) -> list[tuple[str, Callable[[], nn.Module]]]:
    """(name, builder) of every registered family (vae/registry.py), real or tiny config."""
    from .registry import families

    return [(fam.key, lambda fam=fam: fam.build_model(fam.config(real=real))) for fam in families()]


def _seeded_model(build: Callable[[], nn.Module], device: torch.device) -> nn.Module:
    from .seeded_weights import fan_in_weights

    with torch.device("meta"):
        model = build()
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    model.load_state_dict(fan_in_weights(shapes), assign=True)
    return model.to(device).eval()


def _timed(fn: Callable[[], torch.Tensor], device: torch.device, deadline: float, repeat: int = 3
           ) -> tuple[float, torch.Tensor, int]:
    """Median ms of up to `repeat` runs after one warm-up, stopping early at `deadline`; the last output."""
    from .measuring import sync

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
    from .accel.switches import FastPaths
    from .api import TurboVAE
    from .measuring import max_abs, psnr

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
        model.follow_gpu_defaults = False  # exactly the paths set next (vae/gpu_defaults.py switches none)
        model.fast = FastPaths.plain()
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

def collect(turbovae_version: str, device: Optional[str] = None, *, bench: bool = True,
            budget_s: Optional[float] = None) -> dict:
    """The whole doctor report as a JSON-ready dict (fields: docs/gpu.md); `turbovae_version` is the package's
    `__version__`, which the command line passes in."""
    from .accel import self_checks
    from .loader import resolve_device
    from .dtypes import working_dtype

    t0 = time.perf_counter()
    dev = resolve_device(device)
    dtype = working_dtype(None, dev)
    report = {"schema": SCHEMA, "versions": versions(turbovae_version), "devices": devices(),
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

