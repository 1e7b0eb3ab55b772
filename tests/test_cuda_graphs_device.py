"""CUDA-graph capture and replay run on the model's own GPU (issue 33 item 7b), proven without a GPU.

Streams, the graph pool and the graph itself belong to the *current* CUDA device. A model on `cuda:1`
while `cuda:0` is current must warm up, capture and replay under a guard for `cuda:1`, and leave `cuda:0`
current afterwards. Here the torch.cuda API the runner calls is replaced by a recording fake that notes
the current device at every call, the device guard (`vae.device_guard.cuda_device`) by a fake that keeps
the "current device", and the inputs are fake tensors on `cuda:1` (FakeTensorMode needs no GPU)."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from turbovae.vae import device_guard
from turbovae.vae.accel.cuda_graphs import CudaGraphRunner


class _FakeCuda:
    """The torch.cuda calls the runner makes, each recording the current device when it ran."""

    def __init__(self):
        self.current = 0
        self.calls: list[tuple[str, int]] = []

    def record(self, name: str) -> None:
        self.calls.append((name, self.current))

    @contextmanager
    def device(self, index: int):
        previous, self.current = self.current, index
        self.record(f"enter device {index}")
        try:
            yield
        finally:
            self.current = previous

    def install(self, monkeypatch) -> None:
        fake = self

        class Stream:
            def __init__(self, *a, **k):
                fake.record("Stream")

            def wait_stream(self, other):
                fake.record("wait_stream")

        class CUDAGraph:
            def __init__(self):
                fake.record("CUDAGraph")

            def replay(self):
                fake.record("replay")

            def reset(self):
                fake.record("reset")

        @contextmanager
        def graph(g, pool=None, **k):
            fake.record("graph")
            yield

        def stream(s):
            fake.record("stream")
            return nullcontext()

        def recorder(name, value):
            def call(*a, **k):
                fake.record(name)
                return value
            return call

        monkeypatch.setattr(device_guard, "cuda_device", self.device)
        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", CUDAGraph)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "stream", stream)
        monkeypatch.setattr(torch.cuda, "current_stream", recorder("current_stream", Stream()))
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", recorder("graph_pool_handle", object()))
        monkeypatch.setattr(torch.cuda, "memory_reserved", recorder("memory_reserved", 0))
        # A CPU-only torch cannot run `copy_` between fake CUDA tensors (its device guard needs CUDA); the
        # copies into the static buffers carry no device decision, so here they only check the devices.
        def copy_(dst, src, non_blocking=False):
            assert dst.device == src.device, (dst.device, src.device)
            return dst

        monkeypatch.setattr(torch.Tensor, "copy_", copy_)
        self.calls.clear()


def test_capture_and_replay_run_under_a_guard_for_the_inputs_gpu(monkeypatch):
    monkeypatch.setenv("TURBOVAE_SELF_CHECK", "0")  # the replay's self-check needs real values
    cuda = _FakeCuda()
    cuda.install(monkeypatch)
    runner = CudaGraphRunner(lambda x: x * 2 + 1, warmup=1)
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(2, 3, device="cuda:1")
        assert cuda.current == 0
        out = runner(x)  # capture, then replay
        assert cuda.current == 0  # the caller's current device is restored
        runner(x)  # replay only
        assert cuda.current == 0
    assert out.shape == x.shape and out.device == x.device
    assert runner.disabled is None and len(runner.cache) == 1
    names = [name for name, _ in cuda.calls]
    for needed in ("Stream", "stream", "graph_pool_handle", "CUDAGraph", "graph", "memory_reserved"):
        assert needed in names, (needed, names)
    assert names.count("replay") == 2
    wrong = [(name, dev) for name, dev in cuda.calls if dev != 1]
    assert wrong == [], f"CUDA calls made on another device than the inputs' cuda:1: {wrong}"


def test_inputs_on_the_current_gpu_capture_there(monkeypatch):
    monkeypatch.setenv("TURBOVAE_SELF_CHECK", "0")
    cuda = _FakeCuda()
    cuda.install(monkeypatch)
    runner = CudaGraphRunner(lambda x: x + 1, warmup=1)
    with FakeTensorMode(allow_non_fake_inputs=True):
        runner(torch.empty(4, device="cuda:0"))
    assert cuda.calls and all(dev == 0 for _name, dev in cuda.calls)
