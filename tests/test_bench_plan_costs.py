"""The plan-costs section (bench/plan_costs.py): each plan kind timed, on the CPU also on PyTorch's own conv kernels
(the baseline of the package's oneDNN choice), its profile summed by kind, estimate and ranks, and the table."""

from __future__ import annotations

import pytest
import torch

from turbovae import TurboVAE
from turbovae.bench import plan_costs, report
from turbovae.bench.cases import family_cases
from turbovae.bench.common import BenchOptions, row_dict
from turbovae.bench.models import build_model


@pytest.fixture(scope="module")
def rows():
    model = build_model("seedvr2", BenchOptions(quick=True), True)
    kinds = [k for k in family_cases("seedvr2").plan_kinds
             if k.name in ("untiled, slice 1", "layer-wise bands, slice 1", "streamed bands, slice 1")]
    return plan_costs._case(TurboVAE(model), "seedvr2 decode (tiny)", True, (1, 16, 3, 8, 12), kinds,  # noqa: SLF001
                            torch.device("cpu"), torch.float32, BenchOptions(quick=True, repeat=1))


def test_every_kind_is_timed_on_both_kernel_choices_and_ranked(rows):
    assert [r.variant for r in rows] == ["untiled, slice 1", "layer-wise bands, slice 1", "streamed bands, slice 1"]
    for r in rows:
        assert r.ms > 0 and r.pytorch_kernels_ms > 0 and r.estimated_ms > 0
        assert sorted(r.measured_parts) == sorted(plan_costs.KINDS) and r.measured_parts["convolutions"] > 0
        assert r.max_abs_err <= 1e-4  # every kind is the same exact pass
    assert sorted(r.measured_rank for r in rows) == sorted(r.estimated_rank for r in rows) == [1, 2, 3]
    assert rows[2].host_mb > 0 and rows[1].host_mb == 0  # streamed: the activations in host memory


def test_the_rows_render_as_the_plan_costs_table(rows):
    dicts = [row_dict(r) for r in rows]
    table = report.format_markdown(dicts)
    assert table.splitlines()[0] == "| " + " | ".join(report.PLAN_COSTS_HEADER) + " |"
    cells = table.splitlines()[3].split(" | ")
    assert cells[3] == f"{rows[1].pytorch_kernels_ms / 1e3:.2f} s"  # the baseline column beside the measured one
    assert plan_costs.rank_agreement(dicts) is not None


@pytest.mark.parametrize("family", ["seedvr2", "qwen_image"])
@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_every_plan_kind_of_a_case_is_a_plan_of_its_own(family, device_type):
    """Each kind of a case's table picks a different plan (two tile sizes are two tile sizes: a kind asking for a
    tile below the planner's smallest would measure its neighbour's plan twice)."""
    from turbovae.bench.cases import for_section
    from turbovae.vae.planning import PlanRequest
    from turbovae.vae.planning.search import candidates

    cases = [c for c in for_section("plan_costs", quick=False, cuda=device_type == "cuda") if c.family == family]
    assert cases
    model = build_model(family, BenchOptions(quick=True), True)
    dtype = torch.bfloat16 if device_type == "cuda" else torch.float32
    for case in cases:
        cands = candidates(model, case.shape, decode=case.decode, dtype=dtype, device_type=device_type,
                           request=PlanRequest(host_is_separate=True, tile_px=0), host_is_separate=True)
        picked = [plan_costs.pick(cands, k) for k in family_cases(family).plan_kinds]
        assert all(p is not None for p in picked)
        layouts = [p.layout() for p in picked]
        assert len(set(layouts)) == len(layouts), layouts
