"""bench/peak_prediction.py's baseline: the hand-estimate slice rule that chose SeedVR2's public-decode slice on the
first GPU run (before the planner), kept in the bench so that comparison row can be recomputed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from turbovae.bench.peak_prediction import MB, hand_estimate_slice, public_decode_rows, seedvr2_decode_working_set
from turbovae.vae.seedvr2 import SeedVR2Config

ROOT = Path(__file__).resolve().parent.parent


def _per_frame(frames: int) -> int:
    return 1000 * frames


def test_old_rule_takes_the_largest_halving_that_fits():
    assert hand_estimate_slice(_per_frame, 1, 10**12) is None  # images: nothing to slice
    assert hand_estimate_slice(_per_frame, 21, 10**12) is None  # fits: whole clip
    assert hand_estimate_slice(_per_frame, 21, 1000 * (1 + 4 * 5)) == 5  # 20 -> 10 -> 5
    assert hand_estimate_slice(_per_frame, 21, 1000 * (1 + 4 * 1)) == 1
    assert hand_estimate_slice(_per_frame, 21, 1) == 1  # nothing fits: the smallest slice


def test_seedvr2_hand_estimate_per_pixel_and_fixed_bytes():
    cfg = SeedVR2Config()
    fixed = seedvr2_decode_working_set(cfg, 1, 0, torch.bfloat16)
    assert fixed == 256 * 2**20 + 8 * 512 * 2 * (1920 * 1080 // 64)
    assert seedvr2_decode_working_set(cfg, 1000, 1, torch.bfloat16) - fixed == 11 * 128 * 2 * 1000
    assert seedvr2_decode_working_set(cfg, 1000, 1, torch.float32) - fixed == 2 * 11 * 128 * 2 * 1000


def test_public_decode_row_takes_the_committed_slice(tmp_path):
    """720p × 21 with the first run's free memory took a slice of 2 latents, as the committed comparison records."""
    source = tmp_path / "seedvr2-720p21-public-decode.json"
    source.write_text(json.dumps({"shape": [1, 16, 6, 90, 160], "run1_peak_mb": 22579.7}))
    row, = public_decode_rows(source, {}, int(80552 * MB * 0.6))
    committed = json.loads((ROOT / "docs" / "results" / "2026-11-26-peak-memory-prediction.json").read_text())
    old, = [r for r in committed["rows"] if r["source"] == source.name]
    assert row["temporal_slice"] == old["temporal_slice"] == 2
    assert row["case"] == old["case"] and row["measured_mb"] == old["measured_mb"]


def test_plans_rows_name_a_refusal_rather_than_failing(monkeypatch):
    """`plans` records a budget no plan fits as a row that says so (it passed an argument `plan_pass` no longer
    takes, and a refusal would have ended the run)."""
    from turbovae.bench import peak_prediction
    from turbovae.bench.cases import Pass

    case = Pass("", "decode", (1, 16, 1, 8, 12))
    monkeypatch.setattr(peak_prediction, "for_section", lambda section: [replace(case, family="qwen_image")])
    refused, fits = peak_prediction.plans((1, 1024))
    assert refused["fits"] is False and "no plan fits" in refused["refused"], refused
    assert fits["fits"] is True and fits["layout"].startswith("untiled"), fits
