"""CUDA-graph runner: key and eviction bookkeeping on CPU, capture/replay on a GPU."""

from __future__ import annotations

import pytest
import torch

from turbovae.vae.accel.cuda_graphs import CudaGraphRunner, GraphCache, _Captured, graph_key


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


class _FakeCaptureRunner(CudaGraphRunner):
    """Every call is eligible and a "capture" is a recorded eager call, so the runner's own logic
    (state changes, failed captures) is checked without a GPU."""

    def __init__(self, fn, fail_capture=False, **kw):
        super().__init__(fn, **kw)
        self.captures, self.fail_capture = 0, fail_capture

    def _eligible(self, tensors):
        return bool(tensors)

    def _capture(self, args, kwargs, tensors):
        self.captures += 1
        if self.fail_capture:
            raise RuntimeError("operation not permitted when stream is capturing")
        return _Captured(graph=_NoGraph(), inputs=list(tensors), output=self.fn(*args, **kwargs))


class _NoGraph:
    def replay(self):
        pass

    def reset(self):
        pass


def test_runner_drops_graphs_when_the_state_key_changes(seeded):
    where = ["cuda:0@1000"]
    runner = _FakeCaptureRunner(lambda x: x + 1, state_key=lambda: where[0])
    x = torch.randn(2, 3, generator=seeded)
    runner(x)
    runner(x)
    assert runner.captures == 1 and len(runner.cache) == 1
    where[0] = "cuda:0@2000"  # weights moved (offload + reload): the captured graph is stale
    runner(x)
    assert runner.captures == 2 and len(runner.cache) == 1


def test_failed_capture_warns_once_and_runs_eagerly_from_then_on(seeded, caplog):
    calls = []

    def fn(x):
        calls.append(1)
        return x * 3

    runner = _FakeCaptureRunner(fn, fail_capture=True)
    x = torch.randn(4, generator=seeded)
    with caplog.at_level("WARNING", logger="turbovae"):
        assert torch.equal(runner(x), x * 3)
        assert torch.equal(runner(x), x * 3)
    assert runner.captures == 1 and runner.disabled.startswith("RuntimeError")
    assert caplog.text.count("CUDA graphs switched off") == 1 and "capture failed" in caplog.text and len(calls) == 2


def test_turbovae_opt_in_is_exact_off_cuda_and_opt_out_removes_runners(seeded):
    from turbovae import TurboVAE
    from turbovae.vae.wan import TINY_WAN21, WanVAE

    torch.manual_seed(0)
    vae = TurboVAE(WanVAE(TINY_WAN21))
    z = torch.randn(1, vae.latent_channels, 1, 4, 4, generator=seeded)
    x = torch.rand(1, 3, 1, 32, 32, generator=seeded) * 2 - 1
    want = (vae.decode(z), vae.encode(x))
    vae.use_cuda_graphs(max_graphs=2)
    assert all(r.cache.max_entries == 2 for r in vae._graphs.values())
    assert vae.tile_pass(decode=True) is vae._graphs[True]
    got = (vae.decode(z), vae.encode(x))
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    vae.use_cuda_graphs(0)
    assert vae._graphs == {} and vae.tile_pass(decode=True) == vae.model.decode_slices


@pytest.mark.gpu
def test_turbovae_cuda_graphs_match_eager_and_follow_moved_weights(seeded):
    from turbovae import TurboVAE
    from turbovae.vae.wan import TINY_WAN21, WanVAE

    torch.manual_seed(0)
    vae = TurboVAE(WanVAE(TINY_WAN21)).to("cuda", "bf16")
    z = torch.randn(1, vae.latent_channels, 1, 16, 16, generator=seeded).cuda().bfloat16()
    want = vae.decode(z)
    vae.use_cuda_graphs()
    for _ in range(3):
        assert torch.equal(vae.decode(z), want)
    assert vae._graphs[True].cache.builds == 1 and vae._graphs[True].disabled is None
    keep = vae.model.state_dict()  # hold the old storage so the reload gets new addresses
    vae.model.to("cpu")
    vae.model.to("cuda")  # what ComfyUI's offload/reload does: new weight storage
    del keep
    assert torch.equal(vae.decode(z), want)
    assert vae._graphs[True].cache.builds == 2  # recaptured against the new addresses


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


class _ScriptedCaptureRunner(CudaGraphRunner):
    """Captures fail or succeed in the order `outcomes` gives (an exception factory, or None = succeed);
    a successful "capture" is an eager call that reports `pool` bytes held, as a real capture's pool would."""

    def __init__(self, fn, outcomes=(), pool=0, **kw):
        super().__init__(fn, **kw)
        self.outcomes, self.pool, self.captures = list(outcomes), pool, 0

    def _eligible(self, tensors):
        return bool(tensors)

    def _capture(self, args, kwargs, tensors):
        self.captures += 1
        make = self.outcomes.pop(0) if self.outcomes else None
        if make is not None:
            raise make()
        self.pool_bytes += self.pool
        return _Captured(graph=_NoGraph(), inputs=list(tensors), output=self.fn(*args, **kwargs))


def CUBLAS_OOM():
    return RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")


def test_an_out_of_memory_capture_waits_for_the_next_call(seeded, caplog):
    runner = _ScriptedCaptureRunner(lambda x: x * 2, outcomes=[lambda: torch.OutOfMemoryError("warm-up"), None])
    x = torch.randn(4, generator=seeded)
    with caplog.at_level("WARNING", logger="turbovae"):
        assert torch.equal(runner(x), x * 2)  # eager this time
        assert runner.disabled is None and runner.oom_failures == 1
        assert torch.equal(runner(x), x * 2)  # captured on the next call
    assert runner.captures == 2 and len(runner.cache) == 1 and runner.oom_failures == 0
    assert caplog.text.count("ran out of memory") == 1 and "from now on" not in caplog.text


def test_repeated_out_of_memory_captures_switch_graphs_off(seeded, caplog):
    from turbovae.vae.accel.cuda_graphs import OOM_FAILURES_TO_DISABLE

    runner = _ScriptedCaptureRunner(lambda x: x + 1, outcomes=[CUBLAS_OOM] * 10)
    x = torch.randn(4, generator=seeded)
    with caplog.at_level("WARNING", logger="turbovae"):
        for _ in range(OOM_FAILURES_TO_DISABLE + 2):
            assert torch.equal(runner(x), x + 1)
    assert runner.captures == OOM_FAILURES_TO_DISABLE
    assert runner.disabled.startswith(f"out of memory {OOM_FAILURES_TO_DISABLE} times in a row")
    assert caplog.text.count("ran out of memory") == 1 and caplog.text.count("CUDA graphs switched off") == 1


def test_pool_bytes_are_counted_and_released_by_invalidate(seeded):
    runner = _ScriptedCaptureRunner(lambda x: x + 1, pool=3 << 20)
    runner(torch.randn(4, generator=seeded))
    runner(torch.randn(5, generator=seeded))
    assert runner.pool_bytes == 6 << 20
    runner.invalidate()
    assert runner.pool_bytes == 0 and len(runner.cache) == 0
