"""Shared fixtures: deterministic threads/seeds and GPU-marker handling."""

import os

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def seeded():
    torch.manual_seed(0)
    return torch.Generator().manual_seed(0)


@pytest.fixture(autouse=True)
def fresh_fast_paths():
    """Each test starts with every fast path on and unchecked: the registry (vae/accel/self_checks) is per process."""
    from turbovae.vae.accel import self_checks

    self_checks.reset()
    yield
    self_checks.reset()
