"""The pass budget under ComfyUI's dynamic VRAM (comfy-aimdo; issue 41 item 4), against test doubles that
follow core 0.33.0's code (no CUDA or comfy-aimdo here):

- `comfy.memory_management.aimdo_enabled` is what main.py sets once comfy-aimdo initialised the devices;
- `ModelPatcher.get_free_memory(device)` (comfy/model_patcher.py) is what core's own VAE sizes its batches
  with: `model_management.get_free_memory(device)` plus `comfy_aimdo.model_vbar.vbars_analyze(device.index)`,
  the weights of dynamic models that aimdo can page out on demand;
- `--vram-headroom` (GB, comfy/cli_args.py) is VRAM aimdo keeps free for everything else.

Without dynamic VRAM the budget is what it was (get_free_memory alone)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import node_helpers

node_helpers.use_comfy_stubs()

from turbovae.nodes import device_memory, pass_budget  # noqa: E402
from turbovae.vae.api import TurboVAE  # noqa: E402
from turbovae.vae.wan import TINY_WAN21, WanVAE  # noqa: E402

# the doubles the node module holds (another test module may have imported it first, with its own doubles)
mm = device_memory.mm
core_memory = device_memory.core_memory
cli_args = device_memory.comfy.cli_args.args
node_helpers.hide_comfy_stubs()

GiB = 2**30
CUDA = torch.device("cuda", 1)


@pytest.fixture
def core(monkeypatch):
    """Core with 6 GiB free on the device, 10 GiB of dynamic-model weights aimdo can page out on cuda:1 (none
    elsewhere), --vram-headroom 1.5; dynamic VRAM off until a test turns it on."""
    monkeypatch.setattr(mm, "free_memory_bytes", 6 * GiB)
    asked = []

    def vbars_analyze(device=None):
        asked.append(device)
        return 10 * GiB if device == 1 else 0

    aimdo = types.ModuleType("comfy_aimdo")
    aimdo.model_vbar = types.SimpleNamespace(vbars_analyze=vbars_analyze)
    monkeypatch.setitem(sys.modules, "comfy_aimdo", aimdo)
    monkeypatch.setitem(sys.modules, "comfy_aimdo.model_vbar", aimdo.model_vbar)
    monkeypatch.setattr(cli_args, "vram_headroom", 1.5)
    monkeypatch.setattr(core_memory, "aimdo_enabled", False)
    return asked


def test_without_dynamic_vram_the_budget_is_free_memory(core):
    assert not device_memory.dynamic_vram_enabled()
    assert device_memory.freeable_bytes(CUDA) == 6 * GiB
    assert core == [], "comfy-aimdo is not asked when dynamic VRAM is off"


def test_dynamic_vram_adds_what_aimdo_can_page_out_less_the_headroom(core, monkeypatch):
    monkeypatch.setattr(core_memory, "aimdo_enabled", True)
    assert device_memory.dynamic_vram_enabled()
    assert device_memory.freeable_bytes(CUDA) == 6 * GiB + 10 * GiB - int(1.5 * GiB)
    assert core == [1]
    assert device_memory.freeable_bytes(torch.device("cpu")) == 6 * GiB, "aimdo manages CUDA memory only"


def test_the_headroom_never_makes_the_budget_negative(core, monkeypatch):
    monkeypatch.setattr(core_memory, "aimdo_enabled", True)
    monkeypatch.setattr(cli_args, "vram_headroom", 100.0)
    assert device_memory.freeable_bytes(CUDA) == 0


def test_a_core_without_dynamic_vram_reads_as_off(monkeypatch):
    """0.3.64 and 0.8.0 have no comfy.memory_management, no comfy_aimdo and no --vram-headroom."""
    monkeypatch.setattr(device_memory, "core_memory", None)  # what the module's guarded import gives there
    monkeypatch.setitem(sys.modules, "comfy_aimdo", None)
    monkeypatch.delattr(cli_args, "vram_headroom")
    monkeypatch.setattr(mm, "free_memory_bytes", 3 * GiB)
    assert not device_memory.dynamic_vram_enabled()
    assert device_memory.freeable_bytes(CUDA) == 3 * GiB


def test_the_node_budget_is_taken_from_what_core_can_free(core, monkeypatch):
    turbo = TurboVAE(WanVAE(TINY_WAN21).eval())  # on the CPU: its weights still have to reach the device
    weights = sum(p.numel() * p.element_size() for p in turbo.model.parameters())
    reserve = pass_budget.core_reserve_bytes()
    assert pass_budget.comfy_budget_bytes(turbo, CUDA) == 6 * GiB - reserve - weights
    monkeypatch.setattr(core_memory, "aimdo_enabled", True)
    freeable = 6 * GiB + 10 * GiB - int(1.5 * GiB)
    assert pass_budget.comfy_budget_bytes(turbo, CUDA) == freeable - reserve - weights
    assert "dynamic VRAM" in device_memory.budget_source(CUDA)
    monkeypatch.setattr(core_memory, "aimdo_enabled", False)
    assert device_memory.budget_source(CUDA) == "ComfyUI's free memory on cuda:1"


def test_the_vae_patcher_stays_a_whole_module_patcher_under_dynamic_vram(core, monkeypatch):
    """Core pages out only its cast-weight layers (comfy.ops); ours are plain modules it would load whole, and a
    dynamic patcher would tell model management our weights can be paged out on demand, so it would not unload
    us for other dynamic models. The VAE keeps a legacy ModelPatcher, as core's own VAE does with
    disable_offload."""
    monkeypatch.setattr(core_memory, "aimdo_enabled", True)
    turbo = TurboVAE(WanVAE(TINY_WAN21).eval())
    module = torch.nn.Module()
    module.vae = turbo.model
    patcher, _recount = device_memory.vae_patcher(turbo, module, CUDA, torch.device("cpu"))
    assert patcher.is_dynamic() is False
