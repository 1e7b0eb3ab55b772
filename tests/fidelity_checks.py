"""The checks of the per-architecture fidelity files (tests/test_fidelity_seedvr2.py, test_fidelity_qwen_image.py,
test_fidelity_wan.py): every architecture at its real config and realistic sizes, with activations that have a real
mean, against float64 (bench/fidelity.py runs the same cases at larger sizes into docs/results). One file per
architecture so that the full tier's workers share them (they were one file: 12 minutes on one worker).

Sizes. SeedVR2's image is 160² (a 20² latent): each group norm of its full-resolution stages still reduces over
tens of thousands of values, what a cancelling norm needs to show (PyTorch's one-pass channels-last statistics,
forced on, miss the bar by 4.4x at 160², 2.2x at 128², and pass it at 96²; 256² took a third of the full tier's 15
minutes). Qwen-Image's and Wan 2.2's images are 128² (a 16² latent, 8² for Wan 2.2) and every 5-frame clip is 48²:
frame size buys these cases nothing — Wan's RMS norms reduce over the channels, not the frame (nothing cancels:
docs/seedvr2.md), and SeedVR2's clip misses the cancelling statistics at any size that fits here (1.7e-5 at 64²,
1.6e-5 at 48²) — and each one's errors (plain, default, every path alone) stayed 1e-6 to 8e-6 from 160² / 64² to
these sizes (measured 2026-11-29).

The convolution biases are shifted so norm inputs carry |mean| ≥ 10·std (asserted: the check is void without it).
fp32 default and plain paths are held to 3e-5 of the output range against float64 (the project's fp32 bar is 1e-4;
the plain path reaches ~1e-6 here, so 3e-5 still leaves room for fp32 rounding while catching a cancelling norm,
which was 4e-4). Every fast path alone is held to the same bar against the plain path.

On the weights the reference code's own initialisation makes (bench/reference_init.py, biases as they are), the
standard is relative to the plain path: every fast path alone and the default within 2x the plain path's error
against float64, and SeedVR2's default no worse than plain (issue 51: channels-last on the CPU, oneDNN's NHWC fp32
convolutions, missed both; vae/accel/channels_last.py).
"""

from __future__ import annotations

from typing import Callable

import pytest

from turbovae.bench.cases import FidelityCase
from turbovae.bench.fidelity import build_models, run_case

BAR = 3e-5
PATH_BAR = 2.0  # any fast path alone, and the default, against the plain path's error


def case_id(case: FidelityCase) -> str:
    return case.name.replace(" ", "-")


@pytest.fixture(scope="module")
def models_of():
    """The fp32/float64 pair of a family (and weights: `init`, `bias_shift`), built once for that family's cases
    (a file keeps them together): the pair last asked for is kept, and freed with the module."""
    kept: dict = {}

    def get(family: str, init: str = "fan_in", bias_shift: float = 20.0):
        key = (family, init, bias_shift)
        if key not in kept:
            kept.clear()
            kept[key] = build_models(family, bias_shift, init=init)
        return kept[key]

    yield get
    kept.clear()


def check_fp32_matches_float64(case: FidelityCase, models_of: Callable) -> None:
    """Shifted biases (real statistics): default and plain fp32 within `BAR` of float64, each fast path alone
    within `BAR` of the plain path."""
    r = run_case(case, models=models_of(case.family))
    assert r.max_norm_mean_over_std >= 10, f"norm inputs too tame to test anything: {r.max_norm_mean_over_std:.1f}"
    assert r.plain_vs_fp64 <= BAR, f"plain path {r.plain_vs_fp64:.2e}"
    assert r.default_vs_fp64 <= BAR, f"default paths {r.default_vs_fp64:.2e}"
    assert r.alone_vs_plain, "no fast path was run"
    for name, err in r.alone_vs_plain.items():
        assert err <= BAR, f"{name} alone vs plain {err:.2e}"


def check_fast_paths_keep_the_plain_error(case: FidelityCase, models_of: Callable, *,
                                          default_no_worse: bool = False) -> None:
    """The reference code's own weights: every fast path alone and the default within `PATH_BAR` times the plain
    path's error against float64; `default_no_worse`: the default's error at most the plain path's."""
    r = run_case(case, bias_shift=0, init="reference", models=models_of(case.family, "reference", 0))
    assert r.alone_vs_fp64, "no fast path was run"
    ratios = {name: err / r.plain_vs_fp64 for name, err in r.alone_vs_fp64.items()}
    worst = max(ratios, key=ratios.get)
    assert ratios[worst] <= PATH_BAR, f"{worst} alone: {ratios[worst]:.2f}x the plain path's {r.plain_vs_fp64:.2e}"
    errors = f"default {r.default_vs_fp64:.2e}, plain {r.plain_vs_fp64:.2e}"
    assert r.default_vs_fp64 <= PATH_BAR * r.plain_vs_fp64, errors
    if default_no_worse:
        assert r.default_vs_fp64 <= r.plain_vs_fp64, errors


def real_stats_test(cases: list[FidelityCase]) -> Callable:
    """The full tier's `check_fp32_matches_float64` over `cases` (a module binds it to a name starting with test_)."""
    @pytest.mark.slow
    @pytest.mark.parametrize("case", cases, ids=case_id)
    def test(case, models_of):
        check_fp32_matches_float64(case, models_of)

    return test


def reference_weights_test(case: FidelityCase, *, default_no_worse: bool = False) -> Callable:
    """The full tier's `check_fast_paths_keep_the_plain_error` on `case` (bound to a test_ name by the module)."""
    @pytest.mark.slow
    def test(models_of):
        check_fast_paths_keep_the_plain_error(case, models_of, default_no_worse=default_no_worse)

    return test
