"""`decode_tiled`/`encode_tiled` with `tile_px=0` (auto) and in exact mode, and core's VAE nodes under ComfyUI's
budget, keep a pass inside its budget in a fresh process (tests/budget_ways.py says how; the API's ways:
tests/test_budget_every_way.py)."""

from __future__ import annotations

from budget_ways import TILED_AND_NODE_WAYS, budget_test

test_a_budgeted_pass_stays_inside_its_budget_in_a_fresh_process = budget_test(TILED_AND_NODE_WAYS)
