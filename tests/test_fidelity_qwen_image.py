"""The Qwen-Image / Wan 2.1 VAE at its real config against float64 (tests/fidelity_checks.py says what is held and
why)."""

from __future__ import annotations

import pytest
from fidelity_checks import case_id, check_fp32_matches_float64
from fidelity_checks import models_of  # noqa: F401  (the module's fixture)

from turbovae.bench.cases import FidelityCase

CASES = [
    FidelityCase("decode", 1, 256, 256, label="qwen", family="qwen_image"),
    FidelityCase("decode", 5, 64, 64, label="qwen", family="qwen_image"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_fp32_matches_float64_at_real_statistics(case, models_of):
    check_fp32_matches_float64(case, models_of)
