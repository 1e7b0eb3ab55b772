"""Default temporal slice: the planner's, capped for decode at the device type's measured fastest slice; slice progress.

The old hand-estimate slice rule is a baseline of bench/peak_prediction.py now (tests/test_bench_peak_prediction.py)."""

from __future__ import annotations

import pytest
import torch

from turbovae.bench import slices
from turbovae.bench.common import BenchOptions
from turbovae.vae.api import TurboVAE
from turbovae.vae.memory.device import FASTEST_SLICE
from turbovae.vae.seedvr2 import SeedVR2Config, SeedVR2VAE


def test_default_decode_takes_the_capped_slice_and_equals_the_whole_clip(seeded):
    assert "cuda" not in FASTEST_SLICE  # not measured there yet: the largest slice that fits
    vae = TurboVAE(SeedVR2VAE(SeedVR2Config.tiny()))
    z = torch.randn(1, 16, 5, 2, 2, generator=seeded)
    assert vae.plan(tuple(z.shape), decode=True).temporal_slice == FASTEST_SLICE["cpu"]
    whole = vae.model.decode_latents(z)
    assert (vae.decode(z) - whole).abs().max().item() <= 1e-5


def test_slices_section_reduced_run():
    rows = slices.run(BenchOptions(device="cpu", quick=True, repeat=1))
    by_case: dict = {}
    for r in rows:
        by_case.setdefault(r.case, []).append(r)
        assert r.section == "slices" and r.ms > 0 and r.max_abs_err <= 1e-5
    assert len(by_case) == 2
    for case_rows in by_case.values():
        names = [r.variant for r in case_rows]
        assert names[0] == "whole clip" and names[-1].startswith("auto (slice=")


def test_progress_reports_each_slice_and_a_raise_stops_the_pass():
    """`progress(done, total)` after every temporal slice, for both architectures and both directions; raising
    from it (how ComfyUI cancels) ends the pass there."""
    from turbovae.vae.wan import TINY_WAN21, WanVAE

    torch.manual_seed(0)
    for vae in (TurboVAE(SeedVR2VAE(SeedVR2Config.tiny())), TurboVAE(WanVAE(TINY_WAN21))):
        z = torch.randn(1, vae.latent_channels, 4, 4, 4)
        calls = []
        out = vae.decode(z, temporal_slice=1, progress=lambda d, t: calls.append((d, t)))
        assert calls == [(1, 3), (2, 3), (3, 3)]  # 4 latents in slices of 1+1, 1, 1
        assert (out - vae.decode(z)).abs().max().item() <= 1e-5
        calls.clear()
        vae.encode(torch.rand(1, 3, 9, 32, 32) * 2 - 1, temporal_slice=1, progress=lambda d, t: calls.append((d, t)))
        assert calls == [(1, 2), (2, 2)]

        def cancel(done: int, total: int) -> None:
            raise KeyboardInterrupt(f"cancelled after slice {done}")

        with pytest.raises(KeyboardInterrupt, match="after slice 1"):
            vae.decode(z, temporal_slice=1, progress=cancel)
