"""Out-of-memory in every form torch, cuBLAS, cuDNN and the allocators raise it: recognised by one test
(vae/memory/oom.py), retried from where the pass stopped (finished tiles kept), with one warning and a correct image."""

from __future__ import annotations

import logging
from contextlib import contextmanager

import pytest
import torch

from turbovae import TurboVAE, decode_tiled, encode_tiled
from turbovae.vae.memory.oom import ALLOCATION_FAILURE_NAMES, OutOfMemory, attempt, is_out_of_memory
from turbovae.vae.wan.config import TINY_WAN21
from turbovae.vae.wan.model import WanVAE

# Each allocation failure as it reaches Python (messages as torch formats them; cuDNN 8 and 9 spellings).
OOM_KINDS = {
    "torch": lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    "memoryerror": lambda: MemoryError(),
    "cpu": lambda: RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 68719476736 "
                                "bytes. Error code 12 (Cannot allocate memory)"),
    "cublas": lambda: RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    "cudnn8": lambda: RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    "cudnn9": lambda: RuntimeError("cuDNN Frontend error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"),
    "cuda": lambda: RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at "
                                 "some other API call, so the stacktrace below might be incorrect."),
}
NOT_OOM = [RuntimeError("CUDA error: an illegal memory access was encountered"),
           RuntimeError("Expected all tensors to be on the same device"),
           RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED"),
           ValueError("CUBLAS_STATUS_ALLOC_FAILED"),  # a RuntimeError is what carries a status; types first
           KeyboardInterrupt()]


@pytest.mark.parametrize("kind", sorted(OOM_KINDS))
def test_every_allocation_failure_is_out_of_memory(kind):
    err = OOM_KINDS[kind]()
    assert is_out_of_memory(err)
    try:  # wrapped by a layer that raises its own error `from` the allocation failure (engines do)
        raise RuntimeError("engine execution failed") from err
    except RuntimeError as wrapped:
        assert is_out_of_memory(wrapped)


@pytest.mark.parametrize("err", NOT_OOM, ids=lambda e: type(e).__name__)
def test_other_errors_are_not_out_of_memory(err):
    assert not is_out_of_memory(err)
    with pytest.raises(type(err)):
        attempt(lambda: (_ for _ in ()).throw(err))


def test_status_names_are_one_table_of_unique_names():
    assert len(set(ALLOCATION_FAILURE_NAMES)) == len(ALLOCATION_FAILURE_NAMES)


def test_attempt_returns_after_the_except_block_with_the_failed_pass_freed():
    """The failed attempt's tensors must be unreachable when `attempt` returns (no traceback keeps them)."""
    import weakref

    refs = []

    def run():
        big = torch.empty(1024)
        refs.append(weakref.ref(big))
        raise torch.OutOfMemoryError("simulated")

    out = attempt(run)
    assert isinstance(out, OutOfMemory) and out.reason.startswith("OutOfMemoryError: simulated")
    assert refs[0]() is None


# -- through the public API: a fake layer that runs out of memory --------------------------------------
@pytest.fixture(scope="module")
def wan():
    torch.manual_seed(0)
    return TurboVAE(WanVAE(TINY_WAN21))


class FailingLayer:
    """A forward pre-hook on one layer: raises `make()` for inputs wider than `limit_px`, `times` times
    (None: always), and records the widths it saw."""

    def __init__(self, make, limit_px: int, times=None):
        self.make, self.limit, self.times, self.seen, self.raised = make, limit_px, times, [], 0

    def __call__(self, module, args):
        width = args[0].shape[-1]
        self.seen.append(width)
        if width > self.limit and (self.times is None or self.raised < self.times):
            self.raised += 1
            raise self.make()


@contextmanager
def hooked(layer, hook):
    """`hook` as `layer`'s forward pre-hook for the block."""
    handle = layer.register_forward_pre_hook(hook)
    try:
        yield hook
    finally:
        handle.remove()


def _warnings(caplog):
    return [r for r in caplog.records if r.levelno == logging.WARNING and "out of memory" in r.getMessage()]


@pytest.mark.parametrize("kind", sorted(OOM_KINDS))
@pytest.mark.slow
def test_decode_tiled_retries_each_kind_with_smaller_tiles(wan, kind, caplog):
    g = torch.Generator().manual_seed(1)
    z = torch.randn(1, wan.latent_channels, 1, 32, 32, generator=g)
    ref = wan.decode(z)
    hook = FailingLayer(OOM_KINDS[kind], limit_px=128 + 64)  # conv_out sees the tile plus its halo
    with hooked(wan.model.decoder.conv_out, hook):
        with caplog.at_level(logging.WARNING):
            out = decode_tiled(wan, z, tile_px=256, mode="exact")
    assert hook.raised == 1 and max(hook.seen[1:]) <= 128 + 64  # the retry ran smaller tiles
    assert (out - ref).abs().max().item() <= 1e-4
    assert len(_warnings(caplog)) == 1


def test_exact_retry_keeps_finished_tiles(wan, caplog):
    """Out of memory on the third of four tiles: the first two are not run again; the third and fourth run
    as smaller tiles, and the image equals the untiled decode."""
    g = torch.Generator().manual_seed(2)
    z = torch.randn(1, wan.latent_channels, 1, 32, 32, generator=g)
    ref = wan.decode(z)
    calls = []

    class ThirdTile:
        def __call__(self, module, args):
            calls.append(args[0].shape[-2:])
            if len(calls) == 3:
                raise torch.OutOfMemoryError("simulated: third tile")

    steps = []
    with hooked(wan.model.decoder.conv_out, ThirdTile()), caplog.at_level(logging.WARNING):
        out = decode_tiled(wan, z, tile_px=128, mode="exact", progress=lambda d, t: steps.append((d, t)))
    assert (out - ref).abs().max().item() <= 1e-4
    big = [c for c in calls if max(c) > 64 + 64]
    assert len(big) == 3  # tiles 1, 2 once each, tile 3 failed once; never a restart from tile 1
    assert len(calls) == 3 + 2 * 4  # then tiles 3 and 4 as four 64 px pieces each
    assert "finished tiles kept" in caplog.text and len(_warnings(caplog)) == 1
    assert [d for d, _ in steps] == list(range(1, len(steps) + 1)) and steps[-1][0] == steps[-1][1]


def test_fast_retry_keeps_finished_tiles_and_stays_close(wan):
    g = torch.Generator().manual_seed(3)
    z = torch.randn(1, wan.latent_channels, 1, 32, 32, generator=g)
    plain = decode_tiled(wan, z, tile_px=128, overlap_px=32, mode="fast")
    calls = []

    def third(module, args):
        calls.append(args[0].shape[-1])
        if len(calls) == 3:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")

    with hooked(wan.model.decoder.conv_out, third):
        out = decode_tiled(wan, z, tile_px=128, overlap_px=32, mode="fast")
    assert calls[:3] == [128] * 3 and all(c <= 64 for c in calls[3:])  # tiles 1-2 kept; 3 on redone smaller
    assert out.shape == plain.shape and torch.isfinite(out).all()
    # fast tiles are approximate: the redone tiles blend sub-tiles, the others are the same computation
    assert torch.equal(out[..., :64, :64], plain[..., :64, :64])


def test_encode_tiled_retries_a_cudnn_allocation_failure(wan, caplog):
    g = torch.Generator().manual_seed(4)
    x = torch.rand(1, 3, 1, 256, 256, generator=g) * 2 - 1
    ref = wan.encode(x)
    hook = FailingLayer(OOM_KINDS["cudnn9"], limit_px=128 + 64, times=1)
    with hooked(wan.model.encoder.conv_in, hook):
        with caplog.at_level(logging.WARNING):
            out = encode_tiled(wan, x, tile_px=256, mode="exact")
    assert hook.raised == 1 and (out - ref).abs().max().item() <= 1e-4
    assert len(_warnings(caplog)) == 1


def test_at_the_floor_the_temporal_slice_shrinks_then_a_clear_error(wan, caplog):
    g = torch.Generator().manual_seed(5)
    z = torch.randn(1, wan.latent_channels, 3, 8, 8, generator=g)
    ref = wan.decode(z)
    frames = []

    def long_slices(module, args):  # out of memory for slices of more than one latent (4 pixel frames)
        frames.append(args[0].shape[2])
        if args[0].shape[2] > 4 * 1 + 1:
            raise torch.OutOfMemoryError("simulated: slice too long")

    with hooked(wan.model.decoder.conv_out, long_slices):
        with caplog.at_level(logging.WARNING):
            out = decode_tiled(wan, z, tile_px=64, mode="exact", temporal_slice=2)
    assert (out - ref).abs().max().item() <= 1e-4
    assert "latent frames per slice; retrying with 1" in caplog.text

    with hooked(wan.model.decoder.conv_out, FailingLayer(OOM_KINDS["cuda"], limit_px=0)):
        with pytest.raises(MemoryError, match=r"even with 64 px tiles .* 1 latent frame per slice"):
            decode_tiled(wan, z, tile_px=64, mode="exact", temporal_slice=1)
