"""The Qwen-Image / Wan 2.1 VAE at its real config against float64 (tests/fidelity_checks.py says what is held and
why)."""

from __future__ import annotations

from fidelity_checks import real_stats_test
from fidelity_checks import models_of  # noqa: F401  (the module's fixture)

from turbovae.bench.cases import FidelityCase

CASES = [
    FidelityCase("decode", 1, 128, 128, label="qwen", family="qwen_image"),
    FidelityCase("decode", 5, 48, 48, label="qwen", family="qwen_image"),
]

test_fp32_matches_float64_at_real_statistics = real_stats_test(CASES)
