"""The GPU proof harness (bench/budget_gpu.py): how a case's budget and process limit follow from what the process
already holds, and one case's steps end to end on CPU (the dry run's tiny config)."""

import pytest

from turbovae.bench import budget_gpu
from turbovae.bench.budget_gpu import CASES, GB, SLACK_GB, budget_and_limit, run_case
from turbovae.bench.cases import BudgetCase


def _case(budget_gb=None, limit_gb=None) -> BudgetCase:
    return BudgetCase("c", True, 9, 64, 96, budget_gb, limit_gb, 10, family="qwen_image")


def test_a_budget_limits_the_process_to_budget_plus_what_it_holds_plus_slack():
    held = 3 * GB // 2
    budget, limit = budget_and_limit(_case(budget_gb=6), held)
    assert budget == 6 * GB
    assert limit == 6 * GB + held + int(SLACK_GB * GB)


def test_a_card_gives_the_pass_what_is_left_after_weights_input_and_slack():
    held = GB // 4
    budget, limit = budget_and_limit(_case(limit_gb=8), held)
    assert limit == 8 * GB
    assert budget == 8 * GB - held - int(SLACK_GB * GB)
    assert budget_and_limit(_case(limit_gb=1), 2 * GB) == (0, GB)  # a card too small: budget 0, the planner says why


def test_unconstrained_and_contradictory_cases():
    assert budget_and_limit(_case(), 123) == (None, None)
    with pytest.raises(ValueError, match="not both"):
        budget_and_limit(_case(budget_gb=6, limit_gb=8), 0)


def test_every_case_is_well_formed():
    keys = [c.key for c in CASES]
    assert len(keys) == len(set(keys))
    for case in CASES:
        assert not (case.budget_gb is not None and case.limit_gb is not None), case.key
        assert case.check in ("budget", "kinds", "diffusers"), case.key


def test_a_card_case_runs_inside_its_budget_on_cpu():
    """The dry run: tiny config, budget scaled by DRY_GB; the allocator's peak is within the plan's budget."""
    case = next(c for c in CASES if c.key == "wan21-dec-720p81-card8g")
    row = run_case(case, dry=True)
    assert row["status"] == "done", row
    assert row["budget_mb"] == pytest.approx(case.limit_gb * budget_gpu.DRY_GB / 2**20)
    assert row["within_budget"] and row["measured_mb"] <= row["budget_mb"]
    assert row["finite"]
