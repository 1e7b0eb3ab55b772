"""Shared fixtures: deterministic threads/seeds, GPU-marker handling and the two test tiers.

The quick tier is the default (`python -m pytest -q`): tests marked `slow` are deselected. `--full` runs every
test (the full tier; README.md, "The two commands")."""

import gc
import os

import pytest
import torch

# Two threads, shared out between pytest-xdist's workers when the full tier runs two (README): a worker each
# would otherwise oversubscribe this project's 2-core machines.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="the full tier: also run the tests marked slow (real-size runs, exports, engines); "
                          "without it they are deselected (the quick tier)")


def pytest_collection_finish(session):
    """Everything alive once the tests are collected (torch, the package, every test module: ~400k objects) moves
    to the collector's permanent generation. Why: every allocator measurement (vae/memory/allocator.py) and every
    generation-2 collection walks all tracked objects, ~0.2 s each on this VM; the peak-memory tests call it a
    few hundred times. Objects the tests make are still collected as before."""
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config):
    """Back to the collector before the interpreter exits, so its last collection frees them as it would have
    (extension modules report what is never freed)."""
    gc.unfreeze()


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--full"):
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("slow") is None]
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
    """Each test starts with every fast path on and unchecked: the registry (vae/accel/self_checks) and the fused-norm
    dispatcher (vae/norms.py: a test that forces the PyTorch reference must not change what later CUDA plans
    predict) are per process."""
    from turbovae.vae import norms
    from turbovae.vae.accel import self_checks

    self_checks.reset()
    norms.reset_fused_dispatch()
    yield
    self_checks.reset()
    norms.reset_fused_dispatch()
