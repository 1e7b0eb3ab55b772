"""Host-held state (vae/memory/placement.py) as CUDA sees it, on the CPU: writes to host memory land only on the stream,
so nothing may read held memory on the CPU, only fetch it back. The first GPU run caught a layer-wise cache copied
host to host before the copy into it had landed (16.8 dB on CUDA, exact on the CPU, where copies are
synchronous); `StreamHost` below makes the CPU behave like the GPU so such a read fails here."""

from __future__ import annotations

import pytest
import torch
from torch.utils.weak import WeakIdKeyDictionary

from turbovae.bench.models import seeded_init
from turbovae.vae.tiling.frame_stages import run_frame_stages
from turbovae.vae.memory.placement import OnDevice, OnHost, held_in
from turbovae.vae.registry import family
from turbovae.vae.seedvr2.layerwise import SplitPolicy


class StreamHost(OnHost):
    """`OnHost` with CUDA's ordering on the CPU: a write is queued on a "stream" and the CPU's view of the host
    buffer reads NaN until... never (no sync in a pass); `fetch` gives the stream's view: the buffer with every
    queued write applied, as a fetch on the stream would see it (a shadow copy of each host storage holds it);
    `settled` is the stream's view too (what a synchronisation would let the CPU see)."""

    def __init__(self):
        super().__init__(torch.device("cpu"))
        self._shadow = WeakIdKeyDictionary()  # host storage -> the stream's view of it (a flat copy)
        self.writes = 0
        self.fetches = 0

    def _stream_view(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        flat = self._shadow.get(storage)
        if flat is None:
            flat = self._shadow[storage] = torch.empty(0, dtype=torch.uint8).set_(storage.clone())
        return flat.view(t.dtype).as_strided(t.size(), t.stride(), t.storage_offset())

    def write(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.writes += 1
        self._stream_view(dst).copy_(src)
        dst.fill_(float("nan"))  # what the CPU would read before the copy lands

    def fetch(self, t: torch.Tensor) -> torch.Tensor:
        self.fetches += 1
        return self._stream_view(t).clone()  # dense views keep their layout, as a device copy would

    def settled(self, t: torch.Tensor) -> torch.Tensor:
        return self._stream_view(t).clone()


@pytest.fixture(scope="module")
def seedvr2():
    fam = family("seedvr2")
    torch.manual_seed(0)
    return seeded_init(fam.build_model(fam.config(real=False))).eval()


@pytest.mark.parametrize("decode", [True, False])
def test_host_caches_are_only_fetched_never_read_on_the_cpu(seedvr2, decode):
    """Frame stages with layer-wise tiles and plain steps, caches in "stream" host memory: equal to the untiled
    pass (a CPU read of held memory would see NaN)."""
    fmt = seedvr2.latent_format
    g = torch.Generator().manual_seed(2)
    if decode:
        x = torch.randn(1, fmt.channels, 4, 12, 16, generator=g)
        frames = fmt.pixel_frames(4)
    else:
        x = torch.randn(1, 3, 13, 96, 128, generator=g).clamp_(-1, 1)
        frames = fmt.latent_frames(13)
    with torch.inference_mode():
        ref = seedvr2.decode_latents(x) if decode else seedvr2.encode_moments(x)
        for split in (SplitPolicy(8 * 8 * 32), None):
            host = StreamHost()
            with held_in(host):
                out = run_frame_stages(seedvr2.frame_stages(decode=decode), x, out_frames=frames, split=split)
            assert host.writes and host.fetches
            assert torch.isfinite(out).all() and (out - ref).abs().max().item() <= 1e-5, split
        host = StreamHost()
        with held_in(host):
            out = seedvr2.decode_latents(x, temporal_slice=1) if decode else seedvr2.encode_moments(x, temporal_slice=1)
        assert host.writes and (out - ref).abs().max().item() <= 1e-5


def test_wan_caches_are_only_fetched_never_read_on_the_cpu():
    fam = family("qwen_image")
    torch.manual_seed(0)
    model = seeded_init(fam.build_model(fam.config(real=False))).eval()
    z = torch.randn(1, model.latent_format.channels, 5, 8, 8, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        ref = model.decode_latents(z)
        host = StreamHost()
        with held_in(host):
            out = model.decode_latents(z, temporal_slice=1)
    assert host.writes and (out - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("decode", [True, False])
@pytest.mark.parametrize("stages", [False, True])
def test_streamed_frames_are_only_fetched_never_read_on_the_cpu(seedvr2, decode, stages):
    """A streamed layer-wise pass (every whole-frame activation, and the caches, in "stream" host memory; the device
    holds bands): equal to the untiled pass — a CPU read of any held activation, cache or output would see NaN."""
    fmt = seedvr2.latent_format
    g = torch.Generator().manual_seed(5)
    if decode:
        x = torch.randn(1, fmt.channels, 3, 12, 16, generator=g)
    else:
        x = torch.randn(1, 3, 9, 96, 128, generator=g).clamp_(-1, 1)
    plan = seedvr2.exact_plan(decode=decode)
    with torch.inference_mode():
        ref = seedvr2.decode_latents(x) if decode else seedvr2.encode_moments(x)
        for ts in ([None] if stages else [None, 1]):
            frames, caches = StreamHost(), StreamHost()
            with held_in(caches):
                out = plan.run(x, 4, ts, None, stages=stages, canvas=OnDevice(torch.device("cpu")), frames=frames)
            assert frames.writes and frames.fetches and (caches.writes or (ts is None and not stages))
            assert torch.isfinite(out).all() and (out - ref).abs().max().item() <= 1e-5, ts
