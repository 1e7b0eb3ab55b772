"""The ComfyUI budget (issue 49 items 1 and 2), against test doubles that follow core's model management: what a
pass may use is what core can free less core's own reserve (`extra_reserved_memory`), not a flat fraction; a plan
that needs other models unloaded is taken when the time it saves exceeds moving them out and back in at the measured
copy speed, and the log line says which and why; host memory is what core reports free on the CPU less a margin."""

from __future__ import annotations

import logging

import pytest
import torch

import node_helpers

node_helpers.use_comfy_stubs()

from turbovae.bench.models import seeded_init  # noqa: E402
from turbovae.nodes import pass_budget  # noqa: E402
from turbovae.vae.api import TurboVAE  # noqa: E402
from turbovae.vae.input_rules import PassShape  # noqa: E402
from turbovae.vae.memory.budget import BudgetTooSmall, host_margin_bytes  # noqa: E402
from turbovae.vae.planning import PassPlan  # noqa: E402
from turbovae.vae.memory.peak import PeakPrediction  # noqa: E402
from turbovae.vae.registry import family  # noqa: E402

mm = pass_budget.mm  # the double the node module holds
node_helpers.hide_comfy_stubs()

GiB, MB = 2**30, 2**20
CUDA = torch.device("cuda", 0)


def _plan(layout_mode: str, cost_s: float, peak: int, **fields) -> PassPlan:
    return PassPlan(decode=True, shape=(1, 16, 5, 8, 8), dtype=torch.bfloat16, device_type="cuda", mode=layout_mode,
                    cost_s=cost_s, predicted=PeakPrediction(peak, 0, 0, None), **fields)


def test_unloading_is_taken_only_when_it_saves_more_than_the_reload():
    kept = _plan("exact", 3.0, 4 * GiB, tile_latent=60, tiles=4, temporal_slice=1)
    unloading = _plan("untiled", 1.0, 12 * GiB)
    fast_link, slow_link = 25e9, 2e9
    # 8 GiB over what is free now leave the card and come back: 0.69 s at 25 GB/s, 8.6 s at 2 GB/s
    plan, why = pass_budget.unload_decision(kept, unloading, 4 * GiB, fast_link)
    assert plan is unloading and "other models unloaded (8192 MB)" in why and "saves 2.00 s" in why
    plan, why = pass_budget.unload_decision(kept, unloading, 4 * GiB, slow_link)
    assert plan is kept and "kept loaded" in why and "8.59 s" in why
    plan, why = pass_budget.unload_decision(kept, unloading, 4 * GiB, None)  # no copy speed (CPU): keep
    assert plan is kept
    plan, why = pass_budget.unload_decision(None, unloading, 4 * GiB, slow_link)  # nothing fits beside them
    assert plan is unloading and "nothing fits" in why
    plan, why = pass_budget.unload_decision(kept, kept, 4 * GiB, fast_link)  # the same plan either way
    assert plan is kept and why == ""


@pytest.fixture
def seedvr2():
    fam = family("seedvr2")
    torch.manual_seed(0)
    return TurboVAE(seeded_init(fam.build_model(fam.config(real=False))).eval())


@pytest.fixture
def card(monkeypatch):
    """A 24 GiB card with 2 GiB free beside the other models, 64 GiB of RAM free."""
    monkeypatch.setattr(mm, "free_memory_bytes", 2 * GiB)
    monkeypatch.setattr(mm, "total_memory_bytes", 24 * GiB)
    monkeypatch.setattr(mm, "cpu_free_memory_bytes", 64 * GiB)


def test_the_budget_is_what_core_can_free_less_its_reserve(seedvr2, card):
    weights = pass_budget.weights_bytes(seedvr2)
    assert pass_budget.comfy_budget_bytes(seedvr2, CUDA) == 2 * GiB - 400 * MB - weights
    assert pass_budget.comfy_capacity_bytes(seedvr2, CUDA) == 24 * GiB - 400 * MB - weights
    assert pass_budget.comfy_host_budget_bytes() == 64 * GiB - host_margin_bytes()


@pytest.mark.slow  # plans a clip under several budgets: seconds each on two cores
def test_the_node_unloads_other_models_when_the_link_makes_it_worth_it(seedvr2, card, monkeypatch, caplog):
    """A clip whose untiled pass needs more than is free: on a fast link the plan that needs other models unloaded
    is taken (it saves more than the reload costs), on a slow one the plan beside them; the log line says why."""
    untiled = seedvr2.plan((1, 16, 5, 16, 16), decode=True, budget_bytes=2**40, device=CUDA)
    monkeypatch.setattr(mm, "free_memory_bytes", untiled.predicted.pass_bytes // 3 + 400 * MB +
                        pass_budget.weights_bytes(seedvr2))
    for speed, unloads in ((1e15, True), (1.0, False)):
        monkeypatch.setattr(pass_budget, "host_to_device_bytes_per_s", lambda device, s=speed: s)
        with caplog.at_level(logging.INFO, logger="turbovae"):
            caplog.clear()
            plan = pass_budget.plan_in_comfy(seedvr2, PassShape((1, 16, 5, 16, 16), True), CUDA)
        line = caplog.records[-1].getMessage()
        if unloads:
            assert plan.layout() == untiled.layout() and "other models unloaded" in line and "by unloading" in line
        else:
            assert plan.predicted.pass_bytes <= pass_budget.comfy_budget_bytes(seedvr2, CUDA)
            assert "other models kept loaded" in line


@pytest.mark.slow  # plans a clip under several budgets: seconds each on two cores
def test_host_memory_in_comfy_is_what_core_leaves_on_the_cpu(seedvr2, card, monkeypatch):
    """With little RAM free a tight clip plan keeps nothing in host memory (or says host memory is short); with
    plenty it may keep its caches there."""
    monkeypatch.setattr(mm, "free_memory_bytes", 1)  # nothing free on the device beside the other models
    monkeypatch.setattr(mm, "total_memory_bytes", 400 * MB + pass_budget.weights_bytes(seedvr2) + 12 * MB)
    shape = PassShape((1, 16, 9, 16, 16), True)
    roomy = pass_budget.plan_in_comfy(seedvr2, shape, CUDA, log_it=False)
    assert roomy.predicted.host_bytes > 0 and roomy.predicted.pass_bytes <= 12 * MB  # fits only with host memory
    monkeypatch.setattr(mm, "cpu_free_memory_bytes", host_margin_bytes() + 1)  # one byte of host budget
    with pytest.raises(BudgetTooSmall) as err:
        pass_budget.plan_in_comfy(seedvr2, shape, CUDA, log_it=False)
    text = str(err.value)
    assert "12 MB on the device and 0 MB of host memory" in text
    need = int(text.split("the smallest needs ")[1].split(" MB")[0])
    assert 12 < need < 117, "the smallest plan within the host budget is named, not the untiled pass"
