"""The API's ways of giving a budget — `decode`/`encode(budget_bytes=)` and `vae.budget` — keep a pass inside it in
a fresh process (tests/budget_ways.py says how; the tiled API and core's nodes: tests/test_budget_tiled_and_nodes.py)."""

from __future__ import annotations

from budget_ways import API_WAYS, budget_test

test_a_budgeted_pass_stays_inside_its_budget_in_a_fresh_process = budget_test(API_WAYS)
