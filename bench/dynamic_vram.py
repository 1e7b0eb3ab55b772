"""The pack's VAE inside ComfyUI core's dynamic VRAM on a CUDA device (issue 41 item 4; docs/memory.md, "Dynamic
VRAM"): the three things the CPU test doubles (tests/test_dynamic_vram.py) cannot show.

1. **The plan line.** The budget a decode plans under names dynamic VRAM and counts the pages comfy-aimdo can move
   out of the device (`nodes/device_memory.freeable_bytes`), here with a dynamic stand-in for a diffusion model
   resident and the rest of the card taken, as after sampling on a full card.
2. **The pass fits once core has paged that model out.** A decode through core's VAE Decode contract
   (`ComfyTurboVAE.decode`, the node path: plan, `load_models_gpu` for the plan's peak, the pass) needs more than
   is free; the allocator's peak (`max_memory_allocated` above what the process held, less the weights loaded for
   the pass) stays within the pass's budget, with no out-of-memory and no tiled retry, and fewer of the stand-in's
   pages are resident after than before. The pass's own peak and its prediction are recorded beside it.
3. **The VAE when the diffusion model runs again.** The stand-in loads and runs again; whether core unloads the
   VAE (our patcher is a legacy one: core may unload it whole) or leaves it, and what either costs, is recorded.

It needs a ComfyUI core with dynamic VRAM (0.33.0 checked) set up first as its main.py sets it up, before torch is
imported: `scripts/dynamic_vram_gpu.py` does that and then calls `run`. `--dry-run` (that script's) runs the same
steps on the CPU with a small clip and a tiny stand-in, where dynamic VRAM is off, so the steps are tested without a
GPU (tests/test_dynamic_vram_gpu.py, against a real core where `TURBOVAE_COMFYUI` names one).

Results: OUT/dynamic-vram.json, rewritten after every step (a call cut short keeps the finished steps).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from .cases import DynamicVramCase, for_section

if TYPE_CHECKING:
    import torch

GB = 2**30
MB = 2**20
RESULTS_NAME = "dynamic-vram.json"


def default_case(dry: bool) -> DynamicVramCase:
    """The case the run measures (bench/cases.py): a Wan 2.1 clip on a full card, or the dry run's small one."""
    (case,) = for_section("dynamic_vram", quick=dry, cuda=True)
    return case


STAND_IN_WIDTH = 8192  # features of each stand-in layer (a 128 MiB bf16 weight)
DRY_STAND_IN_WIDTH = 256  # the dry run's (a 256 KiB fp32 weight)


class LogLines(logging.Handler):
    """Every log record's text while installed (the plan line, core's load/unload lines, out-of-memory retries)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


def build_stand_in(gb: float, dtype: torch.dtype, width: int) -> torch.nn.Sequential:
    """A diffusion model's place on the card: `gb` of core cast-weight Linear layers (`comfy.ops`), the layers core's
    dynamic patcher pages on demand. Its weights are left uninitialised (contents do not matter; core copies them
    into pinned host buffers when it loads them)."""
    import comfy.ops
    import torch

    per_layer = width * width * torch.empty((), dtype=dtype).element_size()
    layers = max(1, round(gb * GB / per_layer))
    module = torch.nn.Sequential(*[comfy.ops.disable_weight_init.Linear(width, width, bias=False, device="cpu",
                                                                          dtype=dtype) for _ in range(layers)])
    # Under dynamic VRAM core's layers get their weights only from a state dict (as from a model file)
    module.load_state_dict({f"{i}.weight": torch.empty(width, width, dtype=dtype) for i in range(layers)})
    return module


def write_seeded_vae(family_name: str, folder: Path) -> str:
    """A seeded VAE of the family `family_name` (its key or an alias, which names the file) at its real config (the
    loader node checks every shape) saved as safetensors in `folder`; its name."""
    from safetensors.torch import save_file

    from ..vae.registry import family
    from .models import seeded_init

    fam = family(family_name)
    model = seeded_init(fam.build_model(fam.config(real=True))).eval()
    name = f"{family_name}-seeded.safetensors"
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(folder / name))
    return name


def _is_loaded(patcher) -> bool:
    import comfy.model_management as mm

    return any(lm.model is patcher for lm in mm.current_loaded_models)


def memory_state(device: torch.device, stand_in, vae=None) -> dict[str, Any]:
    """What core and the device say now: core's free memory, what a pass may count on (ours), the stand-in's
    resident bytes, whether core holds the VAE loaded."""
    import comfy.model_management as mm
    import torch

    from ..nodes import device_memory

    state = {"core_free_mb": mm.get_free_memory(device) / MB,
             "freeable_mb": device_memory.freeable_bytes(device) / MB,
             "stand_in_loaded_mb": stand_in.loaded_size() / MB,
             "stand_in_loaded_by_core": _is_loaded(stand_in)}
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        state.update(device_free_mb=free / MB, device_total_mb=total / MB,
                     torch_allocated_mb=torch.cuda.memory_allocated(device) / MB,
                     torch_reserved_mb=torch.cuda.memory_reserved(device) / MB)
    if vae is not None:
        state.update(vae_loaded_by_core=_is_loaded(vae.patcher), vae_loaded_mb=vae.patcher.loaded_size() / MB)
    return state


def run_stand_in(stand_in, device: torch.device, dtype: torch.dtype) -> float:
    """Core loads the stand-in for a step (as a sampler would) and it runs once; the seconds it took."""
    import comfy.model_management as mm
    import torch

    t = time.perf_counter()
    mm.load_models_gpu([stand_in])
    x = torch.zeros(8, stand_in.model[0].in_features, device=device, dtype=dtype)
    with torch.inference_mode():
        stand_in.model(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t


def measured_decode(vae, latents: torch.Tensor, device: torch.device) -> tuple[dict[str, Any], torch.Tensor]:
    """Core VAE Decode's call (`vae.decode(samples)`), timed and measured by the allocator from the start (the
    weights' load included)."""
    from ..vae.memory.allocator import measure_peak

    t = time.perf_counter()
    peak, out = measure_peak(lambda: vae.decode(latents), device)
    return {"seconds": round(time.perf_counter() - t, 3), "allocator_peak_mb": peak.device_bytes / MB,
            "measured_by": peak.source}, out


class Results:
    """The results file, rewritten after every step."""

    def __init__(self, out_dir: Path, payload: dict[str, Any]):
        self.path = out_dir / RESULTS_NAME
        self.payload = payload
        self.write()

    def step(self, name: str, fn: Callable[[], dict[str, Any]]) -> Optional[dict[str, Any]]:
        """Run one step, record what it returned or how it failed; None when it failed."""
        t = time.perf_counter()
        try:
            row = fn()
        except Exception as e:  # noqa: BLE001 - a failed step is a result; the later steps need it, so they stop
            row, ok = {"error": f"{type(e).__name__}: {str(e)[:600]}", "traceback": traceback.format_exc()[-3000:]}, False
        else:
            ok = True
        row["step_s"] = round(time.perf_counter() - t, 2)
        self.payload["steps"][name] = row
        self.write()
        return row if ok else None

    def write(self) -> None:
        from ..trt.fileio import atomic_write_text

        atomic_write_text(self.path, json.dumps(self.payload, indent=1, default=str) + "\n", overwrite=True)


def core_facts() -> dict[str, Any]:
    """Which core, which comfy-aimdo, and whether dynamic VRAM is on, as the pack reads it."""
    import importlib.metadata
    import os

    import comfy.model_management as mm
    import comfy.model_patcher

    from ..nodes import device_memory

    facts: dict[str, Any] = {"dynamic_vram": device_memory.dynamic_vram_enabled(),
                             "core_model_patcher": comfy.model_patcher.CoreModelPatcher.__name__,
                             "vram_state": str(mm.vram_state), "vram_headroom_mb":
                                 device_memory.vram_headroom_bytes() / MB,
                             "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    try:
        import comfyui_version

        facts["comfyui"] = comfyui_version.__version__
    except ImportError:
        facts["comfyui"] = None
    for package in ("comfy-aimdo", "comfy-kitchen"):
        try:
            facts[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            facts[package] = None
    return facts


def run(out_dir: Path, dry: bool, case: Optional[DynamicVramCase] = None) -> int:
    """The three checks (module docstring), in this process, whose ComfyUI core was set up first, for `case`
    (default: `default_case(dry)`). 0 when every step ran and every check holds, 1 otherwise (the
    JSON says which)."""
    import comfy.model_management as mm
    import comfy.model_patcher
    import folder_paths
    import torch

    from ..nodes.loader_nodes import TurboVAELoader
    from ..nodes.pass_budget import weights_bytes
    from .common import environment

    case = case or default_case(dry)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_lines = LogLines()
    logging.getLogger().addHandler(log_lines)
    if not logging.getLogger().isEnabledFor(logging.INFO):
        logging.getLogger().setLevel(logging.INFO)
    results = Results(out_dir, {"case": asdict(case), "dry_run": dry, "environment": environment(),
                                "core": core_facts(), "steps": {}, "checks": {}})
    device = mm.get_torch_device()
    stand_in_dtype = torch.float32 if dry else torch.bfloat16
    scratch = Path(tempfile.mkdtemp(prefix="turbovae-dynamic-vram-"))
    held: dict[str, Any] = {}

    def load_vae() -> dict[str, Any]:
        (scratch / "vae").mkdir()
        name = write_seeded_vae(case.shown, scratch / "vae")
        folder_paths.add_model_folder_path("vae", str(scratch / "vae"), is_default=True)
        held["vae"] = TurboVAELoader.execute(vae_name=name, dtype=case.dtype).args[0]
        held["weights_mb"] = weights_bytes(held["vae"].turbo) / MB
        return {"device": str(device), "vae_file": name, "weights_mb": held["weights_mb"]}

    def stand_in_resident() -> dict[str, Any]:
        width = DRY_STAND_IN_WIDTH if dry else STAND_IN_WIDTH
        module = build_stand_in(case.stand_in_gb, stand_in_dtype, width)
        held["stand_in"] = comfy.model_patcher.CoreModelPatcher(module, load_device=device,
                                                                 offload_device=mm.unet_offload_device())
        seconds = run_stand_in(held["stand_in"], device, stand_in_dtype)
        return {"patcher": type(held["stand_in"]).__name__, "layers": len(module),
                "size_mb": held["stand_in"].model_size() / MB, "run_s": round(seconds, 3),
                **memory_state(device, held["stand_in"], held["vae"])}

    def fill_the_card() -> dict[str, Any]:
        taken = 0
        if device.type == "cuda":
            free = torch.cuda.mem_get_info(device)[0]
            taken = max(0, free - int(case.free_gb * GB))
            held["blocker"] = torch.empty(taken, dtype=torch.uint8, device=device)
        return {"taken_mb": taken / MB, **memory_state(device, held["stand_in"], held["vae"])}

    def decode() -> dict[str, Any]:
        from ..nodes import device_memory
        from ..nodes.pass_budget import comfy_budget_bytes

        vae = held["vae"]
        fmt = vae.turbo.latent_format
        f = fmt.spatial_factor
        g = torch.Generator().manual_seed(0)
        latents = torch.randn(1, fmt.channels, fmt.latent_frames(case.frames), case.height // f, case.width // f,
                              generator=g)
        before = memory_state(device, held["stand_in"], vae)
        budget_mb = comfy_budget_bytes(vae.turbo, device) / MB  # what the pass's plan is made under (the node's)
        first_line = len(log_lines.lines)
        row, out = measured_decode(vae, latents, device)
        report = vae.last_report  # what the pass planned and did (the nodes show it)
        row.update(
            latents=list(latents.shape), budget_source=device_memory.budget_source(device),
            predicted_mb=report.predicted_mb, pass_peak_mb=report.peak_mb, budget_mb=budget_mb, plan=report.how,
            report=report.line(), weights_mb=held["weights_mb"],
            finite=bool(torch.isfinite(out.float()).all()), output=list(out.shape),
            log=log_lines.lines[first_line:][:40], before=before,
            after=memory_state(device, held["stand_in"], vae))
        return row

    def stand_in_again() -> dict[str, Any]:
        before = memory_state(device, held["stand_in"], held["vae"])
        first_line = len(log_lines.lines)
        seconds = run_stand_in(held["stand_in"], device, stand_in_dtype)
        return {"run_s": round(seconds, 3), "before": before,
                "after": memory_state(device, held["stand_in"], held["vae"]),
                "log": log_lines.lines[first_line:][:40]}

    ok = True
    try:
        for name, fn in (("load_vae", load_vae), ("stand_in_resident", stand_in_resident),
                         ("fill_the_card", fill_the_card), ("decode", decode), ("stand_in_again", stand_in_again)):
            if results.step(name, fn) is None:
                ok = False
                break
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the seeded VAE file (hundreds of MB)
    results.payload["checks"] = checks(results.payload, dry)
    results.write()
    logging.getLogger().removeHandler(log_lines)
    return 0 if ok and all(results.payload["checks"].values()) else 1


def checks(payload: dict[str, Any], dry: bool) -> dict[str, bool]:
    """The checks that decide the exit status, from the recorded steps (docs/memory.md names them). On the CPU
    (the dry run) dynamic VRAM is off: the plan line must say so and nothing is paged."""
    steps = payload["steps"]
    decode = steps.get("decode")
    if decode is None or "error" in decode:
        return {"decode_ran": False}
    dynamic = payload["core"]["dynamic_vram"]
    found = {
        "decode_ran": True,
        "dynamic_vram_as_expected": dynamic is (not dry),
        "plan_line_names_the_budget_source": any("budget: " in line and decode["budget_source"] in line
                                                 for line in decode["log"]),
        "no_tiled_retry": not any("out of memory" in line for line in decode["log"]),
        "finite_output": decode["finite"],
    }
    if not dry:
        found["plan_counts_pages_aimdo_can_move"] = "dynamic VRAM" in decode["budget_source"]
        found["pass_needed_more_than_was_free"] = decode["predicted_mb"] > decode["before"]["device_free_mb"]
        found["peak_within_budget"] = decode["allocator_peak_mb"] - decode["weights_mb"] <= decode["budget_mb"]
        found["stand_in_paged_out_for_the_pass"] = \
            decode["after"]["stand_in_loaded_mb"] < decode["before"]["stand_in_loaded_mb"]
    return found


# -- the docs tables (bench/report.py renders them from a results file) -------------------------------------------
MEMORY_TABLE = "dynamic-vram"
CHECKS_TABLE = "dynamic-vram-checks"
# (step, its "before"/"after" state or None for the step's own, what the row says)
MOMENTS = (("stand_in_resident", None, "the stand-in ran (core loaded it)"),
           ("fill_the_card", None, "the rest of the card taken"),
           ("decode", "before", "before the decode"),
           ("decode", "after", "after the decode"),
           ("stand_in_again", "after", "after the stand-in ran again"))


def is_dynamic_vram_results(data: object) -> bool:
    """A results file of this module: steps and checks, neither rows nor cases."""
    return isinstance(data, dict) and "steps" in data and "checks" in data


def dynamic_vram_environment(data: dict[str, Any]) -> dict[str, Any]:
    """The machine of a results file, with the dtype the VAE ran in."""
    return dict(data.get("environment") or {}, dtype=data.get("case", {}).get("dtype"))


def dynamic_vram_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One `MEMORY_TABLE` row per moment a step recorded (what the device, core and the pack saw), the decode's
    plan and peaks on its "after" row; one `CHECKS_TABLE` row per check as the run computed it."""
    rows: list[dict[str, Any]] = []
    steps = data.get("steps", {})
    for step, when, what in MOMENTS:
        row = steps.get(step)
        if row is None or "error" in row:
            continue
        state = row if when is None else row.get(when, {})
        note = ""
        if step == "decode" and when == "after":
            budget = row.get("budget_mb")
            note = (f"{row.get('report')}; allocator peak from the start {row.get('allocator_peak_mb', 0):.0f} MB, "
                    f"the {row.get('weights_mb', 0):.0f} MB of weights loaded in it"
                    + ("" if budget is None else f"; budget {budget:.0f} MB"))
        rows.append({"table": MEMORY_TABLE, "case": what, "device_free_mb": state.get("device_free_mb"),
                     "core_free_mb": state.get("core_free_mb"), "freeable_mb": state.get("freeable_mb"),
                     "stand_in_loaded_mb": state.get("stand_in_loaded_mb"), "vae_loaded_mb": state.get("vae_loaded_mb"),
                     "note": note})
    for name, holds in data.get("checks", {}).items():
        rows.append({"table": CHECKS_TABLE, "case": name.replace("_", " "), "holds": bool(holds)})
    for step, row in steps.items():
        if "error" in row:
            rows.append({"table": CHECKS_TABLE, "case": f"step {step}", "holds": False, "note": row["error"]})
    return rows

