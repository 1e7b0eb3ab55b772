"""The Wan 2.2 VAE at its real config against float64 (tests/fidelity_checks.py says what is held and why)."""

from __future__ import annotations

import pytest
from fidelity_checks import case_id, check_fast_paths_keep_the_plain_error, check_fp32_matches_float64
from fidelity_checks import models_of  # noqa: F401  (the module's fixture)

from turbovae.bench.cases import FidelityCase

CASES = [
    FidelityCase("decode", 1, 256, 256, family="wan2.2"),
    FidelityCase("decode", 5, 64, 64, family="wan2.2"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_fp32_matches_float64_at_real_statistics(case, models_of):
    check_fp32_matches_float64(case, models_of)


@pytest.mark.slow
def test_fast_paths_keep_the_plain_error_on_reference_weights(models_of):
    """A photo encoded, then decoded, on the reference init (see tests/test_fidelity_seedvr2.py's)."""
    check_fast_paths_keep_the_plain_error(FidelityCase("decode", 1, 96, 96, family="wan2.2"), models_of)
