"""The API's ways of giving a budget — `decode`/`encode(budget_bytes=)` and `vae.budget` — keep a pass inside it in
a fresh process (tests/budget_ways.py says how; the tiled API and core's nodes: tests/test_budget_tiled_and_nodes.py)."""

from __future__ import annotations

import pytest
from budget_ways import case_ids, check_within_budget

CASES = [
    ("budget_bytes", "qwen_image", "decode", 0.3),
    ("budget_bytes", "seedvr2", "encode", 0.75),
    ("vae.budget", "wan2.2", "decode", 0.5),
    ("vae.budget", "qwen_image", "encode", 0.5),
]


@pytest.mark.slow
@pytest.mark.parametrize("way,key,direction,fraction", CASES, ids=case_ids(CASES))
def test_a_budgeted_pass_stays_inside_its_budget_in_a_fresh_process(way, key, direction, fraction):
    check_within_budget(way, key, direction, fraction)
