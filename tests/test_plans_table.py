"""docs/memory.md's plans table is the planner's output: one row of the committed results file
(docs/results/*-plans-cuda-bf16.json, written by `python -m turbovae.bench.plans_table`) recomputed from the code
must name the same plan and the same predicted peak, so a planner or prediction change shows up as a stale doc."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from turbovae.bench import plans_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "docs" / "results").glob("*-plans-cuda-bf16.json"))[-1]


def _committed(case: str, variant: str) -> dict:
    rows = json.loads(RESULTS.read_text())["rows"]
    return next(r for r in rows if r["case"] == case and r["variant"] == variant)


def _row_in_a_fresh_process(key: str, decode: bool, target) -> dict:
    """The row as `python -m turbovae.bench.plans_table` computes it: in a process of its own, so nothing an earlier
    test left in this one (fast-path switches, dispatchers, caches) changes the plan."""
    code = ("import json, sys; from turbovae.bench import plans_table as p; "
            f"t = next(t for t in p.TARGETS if t.name == {target.name!r}); "
            f"print(json.dumps(p.row_for({key!r}, {decode!r}, t)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("key,decode,target", [
    ("qwen_image", True, plans_table.TARGETS[0]),  # Wan 2.1 / Qwen-Image 1080p x 81 in 6 GB
    pytest.param("seedvr2", True, plans_table.TARGETS[0], marks=pytest.mark.slow),  # host memory, frame stages
], ids=["wan2.1-decode-1080p81-6gb", "seedvr2-decode-1080p81-6gb"])
def test_a_plans_row_is_what_the_planner_plans_now(key, decode, target):
    committed = _committed(f"{key} {'decode' if decode else 'encode'}", target.name)
    now = _row_in_a_fresh_process(key, decode, target)
    assert now["fits"] and committed["fits"], (now, committed)
    assert now["plan"] == committed["plan"], f"stale {RESULTS.name}: rerun python -m turbovae.bench.plans_table"
    assert now["pass_mb"] == committed["pass_mb"] and now["host_mb"] == committed["host_mb"]
    assert now["pass_mb"] <= target.budget_gb * 1024
    assert plans_table.TABLE in RESULTS.read_text() and RESULTS.name in (ROOT / "docs" / "memory.md").read_text()
