"""CUDA-graph runner: key and eviction bookkeeping on CPU, capture/replay on a GPU."""

from __future__ import annotations

import pytest
import torch

from turbovae.vae.cuda_graphs import CudaGraphRunner, GraphCache, graph_key


def test_graph_key_separates_geometry_dtype_and_values():
    a = torch.zeros(1, 4, 8, 8)
    assert graph_key((a,)) == graph_key((torch.ones(1, 4, 8, 8),))  # values do not matter
    assert graph_key((a,)) != graph_key((torch.zeros(1, 4, 8, 16),))
    assert graph_key((a,)) != graph_key((a.half(),))
    assert graph_key((a,)) != graph_key((a.to(memory_format=torch.channels_last),))  # strides matter
    assert graph_key((a, 2)) != graph_key((a, 3))
    assert graph_key((a,), {"temporal_slice": 4}) != graph_key((a,), {"temporal_slice": 8})
    assert graph_key(([a, a],)) != graph_key(([a],))
    with pytest.raises(ValueError, match="unhashable argument"):
        graph_key(({1: 2},))


def test_graph_cache_is_bounded_lru_and_releases_evicted_entries():
    released = []
    cache = GraphCache(2, release=released.append)
    cache.get_or_build("a", lambda: "A")
    cache.get_or_build("b", lambda: "B")
    assert cache.get_or_build("a", lambda: "A2") == "A"  # hit refreshes "a"
    cache.get_or_build("c", lambda: "C")                  # evicts the least recently used: "b"
    assert released == ["B"] and cache.keys() == ["a", "c"]
    assert (cache.builds, cache.evictions) == (3, 1)
    cache.clear()
    assert released == ["B", "A", "C"] and len(cache) == 0
    with pytest.raises(ValueError, match="max_graphs must be"):
        GraphCache(0)


def test_runner_is_a_passthrough_off_cuda(seeded):
    calls = []

    def fn(x, scale=1.0):
        calls.append(x.shape)
        return x * scale

    runner = CudaGraphRunner(fn, max_graphs=1)
    x = torch.randn(2, 3, generator=seeded)
    assert torch.equal(runner(x, scale=2.0), x * 2)
    assert len(calls) == 1 and len(runner.cache) == 0


@pytest.mark.gpu
def test_capture_replay_matches_eager_and_evicts_on_shape_change(seeded):
    conv = torch.nn.Conv2d(4, 4, 3, padding=1).cuda().eval()

    def fn(x):
        return torch.nn.functional.silu(conv(x)) + 1

    runner = CudaGraphRunner(fn, max_graphs=1)
    with torch.no_grad():
        for shape in [(1, 4, 16, 16), (1, 4, 16, 16), (2, 4, 8, 8), (1, 4, 16, 16)]:
            x = torch.randn(shape, generator=seeded).cuda()
            out = runner(x)
            assert torch.allclose(out, fn(x), atol=1e-6, rtol=0)
    assert runner.cache.builds == 3 and runner.cache.evictions == 2 and len(runner.cache) == 1
    first = runner(x)
    second = runner(x + 1)
    assert not torch.equal(first, second), "cloned outputs must survive the next replay"
