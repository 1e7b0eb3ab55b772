"""Every way a budget can be given keeps the pass inside it (issue 49 item 7): the check that
tests/test_budget_every_way.py (the API's ways) and tests/test_budget_tiled_and_nodes.py (the tiled API's and core's
VAE nodes') make, split in two files so the full tier's two workers share the probes.

Each case runs in a fresh process (the planner starts cold there and, on the CPU, shares the budgeted memory), real
configs with seeded weights, small non-square clips at a fraction of the untiled pass's predicted peak, or just above
the smallest budget that works where that is more (a plan always runs; refusals are tested in tests/test_planner.py),
measured by the allocator in that process (tests/budget_probe.py). The probes run with `MALLOC_ARENA_MAX=1` (glibc's
per-thread arenas otherwise keep what a pass freed: docs/memory.md, "The budget"); the resident memory they add is
recorded beside the allocator's peak."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

PROBE = Path(__file__).parent / "budget_probe.py"

# (how the budget is given, family, direction, the budget as a share of the untiled pass's predicted peak)
# (every way once, every family, decode and encode: a way's second family cost the full tier a minute)
API_WAYS = [
    ("budget_bytes", "seedvr2", "encode", 0.75),
    ("vae.budget", "wan2.2", "decode", 0.5),
    ("vae.budget", "qwen_image", "encode", 0.5),
]
TILED_AND_NODE_WAYS = [
    ("tiled_tile0", "seedvr2", "decode", 0.25),
    ("tiled_exact", "qwen_image", "decode", 0.5),
    ("core_vae_node", "qwen_image", "decode", 0.3),
]


def case_ids(cases: list[tuple[str, str, str, float]]) -> list[str]:
    return [f"{w}-{k}-{d}-{f}" for w, k, d, f in cases]


def probe(way: str, key: str, direction: str, fraction: float) -> dict:
    """tests/budget_probe.py's JSON line for the case."""
    env = dict(os.environ, MALLOC_ARENA_MAX="1")
    done = subprocess.run([sys.executable, str(PROBE), way, key, direction, str(fraction)], capture_output=True,
                          text=True, timeout=900, cwd=Path(__file__).parent.parent, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_within_budget(way: str, key: str, direction: str, fraction: float) -> None:
    r = probe(way, key, direction, fraction)
    assert not r["refused"], r  # the budget is above the smallest that works: a plan runs
    assert r["finite"]
    assert r["allocator_peak"] <= r["budget"], r


def budget_test(cases: list[tuple[str, str, str, float]]) -> Callable:
    """The full tier's test of `cases` (a module binds it to a name starting with test_)."""
    @pytest.mark.slow
    @pytest.mark.parametrize("way,key,direction,fraction", cases, ids=case_ids(cases))
    def test(way, key, direction, fraction):
        check_within_budget(way, key, direction, fraction)

    return test
