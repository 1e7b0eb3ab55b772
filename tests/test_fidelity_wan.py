"""The Wan 2.2 VAE at its real config against float64 (tests/fidelity_checks.py says what is held and why)."""

from __future__ import annotations

from fidelity_checks import real_stats_test, reference_weights_test
from fidelity_checks import models_of  # noqa: F401  (the module's fixture)

from turbovae.bench.cases import FidelityCase

CASES = [
    FidelityCase("decode", 1, 128, 128, family="wan2.2"),
    FidelityCase("decode", 5, 48, 48, family="wan2.2"),
]

test_fp32_matches_float64_at_real_statistics = real_stats_test(CASES)

# a photo encoded, then decoded, on the reference init (tests/test_fidelity_seedvr2.py says why this size)
test_fast_paths_keep_the_plain_error_on_reference_weights = reference_weights_test(
    FidelityCase("decode", 1, 96, 96, family="wan2.2"))
