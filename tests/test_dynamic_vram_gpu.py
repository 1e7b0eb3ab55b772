"""The dynamic VRAM check (bench/dynamic_vram.py, scripts/dynamic_vram_gpu.py; docs/memory.md "Dynamic VRAM"):
what decides its exit status, its docs rows, and its steps end to end on the CPU against a real ComfyUI core.

The end-to-end run is skipped unless TURBOVAE_COMFYUI names a ComfyUI checkout with dynamic VRAM (0.33.0 or newer)
whose Python (TURBOVAE_COMFYUI_PYTHON, else <checkout>/venv, .venv or ../cvenv) has core's requirements and
comfy-aimdo; there dynamic VRAM is off (core's --cpu), so it proves the steps, not the paging (a GPU does that).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest

from node_helpers import comfy_python
from turbovae.bench import dynamic_vram as dv
from turbovae.bench.report import render

ROOT = Path(__file__).resolve().parent.parent
GPU_RESULTS = ROOT / "docs" / "results" / "2026-11-27-h200-dynamic-vram.json"


def _state(device_free, stand_in, vae=0.0):
    return {"device_free_mb": device_free, "core_free_mb": device_free, "freeable_mb": device_free + stand_in,
            "stand_in_loaded_mb": stand_in, "vae_loaded_mb": vae}


def gpu_payload() -> dict:
    """A GPU run as the script records one: dynamic VRAM on, the pass needing more than was free."""
    source = "ComfyUI's free memory plus the weights dynamic VRAM can page out, less the 0 MB VRAM headroom, on cuda:0"
    return {"core": {"dynamic_vram": True}, "steps": {"decode": {
        "budget_source": source, "log": [f"INFO turbovae: TurboVAE: decode ... (budget: {source})"], "finite": True,
        "predicted_mb": 4806.0, "allocator_peak_mb": 5058.0, "weights_mb": 242.0, "budget_mb": 7150.0,
        "before": _state(4113.0, 8192.0), "after": _state(2439.0, 3488.0, 242.0)}}}


def test_a_gpu_run_that_kept_its_budget_passes_every_check():
    found = dv.checks(gpu_payload(), dry=False)
    assert found and all(found.values()), found


@pytest.mark.parametrize("change, failing", [
    (lambda d: d.update(allocator_peak_mb=7150.0 + 242.0 + 1.0), "peak_within_budget"),
    (lambda d: d["after"].update(stand_in_loaded_mb=8192.0), "stand_in_paged_out_for_the_pass"),
    (lambda d: d.update(predicted_mb=4000.0), "pass_needed_more_than_was_free"),
    (lambda d: d["log"].append("WARNING turbovae: TurboVAE: out of memory decoding without tiles"), "no_tiled_retry"),
    (lambda d: d.update(budget_source="ComfyUI's free memory on cuda:0",
                        log=["INFO turbovae: TurboVAE: decode ... (budget: ComfyUI's free memory on cuda:0)"]),
     "plan_counts_pages_aimdo_can_move"),
    (lambda d: d.update(log=[("INFO turbovae: TurboVAE: decode ... (budget: what ComfyUI can free on cuda:0 by "
                              "unloading other models)")]), "plan_line_names_the_budget_source"),
    (lambda d: d.update(finite=False), "finite_output"),
])
def test_each_check_fails_on_what_it_guards(change, failing):
    payload = gpu_payload()
    change(payload["steps"]["decode"])
    found = dv.checks(payload, dry=False)
    assert not found[failing], found
    assert all(v for k, v in found.items() if k != failing), found


def test_a_run_without_a_decode_fails_and_dynamic_vram_must_match_the_machine():
    assert dv.checks({"core": {"dynamic_vram": True}, "steps": {}}, dry=False) == {"decode_ran": False}
    payload = copy.deepcopy(gpu_payload())
    assert not dv.checks(payload, dry=True)["dynamic_vram_as_expected"], "the CPU dry run has dynamic VRAM off"


def test_the_gpu_results_render_every_moment_and_check():
    data = json.loads(GPU_RESULTS.read_text())
    assert dv.is_dynamic_vram_results(data)
    rows = dv.dynamic_vram_rows(data)
    moments = [r["case"] for r in rows if r["table"] == dv.MEMORY_TABLE]
    assert moments == [what for _, _, what in dv.MOMENTS]
    assert {r["case"] for r in rows if r["table"] == dv.CHECKS_TABLE} == {k.replace("_", " ") for k in data["checks"]}
    table = render([f"{GPU_RESULTS}#{dv.MEMORY_TABLE}"])
    assert "NVIDIA H200" in table and "after the stand-in ran again" in table


def test_a_failed_step_is_a_failed_check_row():
    data = {"case": {"dtype": "bf16"}, "environment": {}, "checks": {"decode_ran": False},
            "steps": {"load_vae": {"device": "cuda:0"}, "stand_in_resident": {"error": "MemoryError: VBAR allocation failed"}}}
    rows = [r for r in dv.dynamic_vram_rows(data) if r["table"] == dv.CHECKS_TABLE]
    assert {"table": dv.CHECKS_TABLE, "case": "step stand_in_resident", "holds": False,
            "note": "MemoryError: VBAR allocation failed"} in rows


_CHECKOUT = os.environ.get("TURBOVAE_COMFYUI")


@pytest.mark.slow
@pytest.mark.skipif(not _CHECKOUT, reason="set TURBOVAE_COMFYUI to a ComfyUI checkout with dynamic VRAM (0.33.0+)")
def test_the_steps_run_in_a_real_core_on_the_cpu(tmp_path):
    checkout = Path(_CHECKOUT)
    if not (checkout / "comfy" / "memory_management.py").is_file():
        pytest.skip(f"{checkout} has no dynamic VRAM (comfy/memory_management.py); 0.33.0 or newer is needed")
    site = tmp_path / "site"
    site.mkdir()
    (site / "turbovae").symlink_to(ROOT)
    env = dict(os.environ, PYTHONPATH=str(site))
    done = subprocess.run([comfy_python(checkout), str(ROOT / "scripts" / "dynamic_vram_gpu.py"),
                           "--comfyui", str(checkout), "--out", str(tmp_path / "out"), "--dry-run"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    results = json.loads((tmp_path / "out" / dv.RESULTS_NAME).read_text())
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:], results["checks"])
    assert results["core"]["dynamic_vram"] is False and results["core"]["comfy-aimdo"]
    assert set(results["steps"]) == {"load_vae", "stand_in_resident", "fill_the_card", "decode", "stand_in_again"}
    assert results["steps"]["decode"]["allocator_peak_mb"] > 0
