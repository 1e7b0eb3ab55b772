"""`decode_tiled`/`encode_tiled` with `tile_px=0` (auto) and in exact mode, and core's VAE nodes under ComfyUI's
budget, keep a pass inside its budget in a fresh process (tests/budget_ways.py says how; the API's ways:
tests/test_budget_every_way.py)."""

from __future__ import annotations

import pytest
from budget_ways import case_ids, check_within_budget

CASES = [
    ("tiled_tile0", "seedvr2", "decode", 0.25),
    ("tiled_exact", "qwen_image", "decode", 0.5),
    ("core_vae_node", "qwen_image", "decode", 0.3),
    ("core_vae_node", "seedvr2", "encode", 0.75),
]


@pytest.mark.slow
@pytest.mark.parametrize("way,key,direction,fraction", CASES, ids=case_ids(CASES))
def test_a_budgeted_pass_stays_inside_its_budget_in_a_fresh_process(way, key, direction, fraction):
    check_within_budget(way, key, direction, fraction)
