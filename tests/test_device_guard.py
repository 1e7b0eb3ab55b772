"""Every launch, load and multi-device pass runs on the tensor's or the requested device and leaves the
current device as it found it (vae/device_guard.py). On CPU a recording fake stands in for the CUDA device
context: it records the index each guard is entered with, and what ran while it was current. The Triton
launch sites are checked in test_kernels_norms.py (which imports Triton in interpreter mode)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from turbovae.vae import device_guard


class RecordingDevice:
    """Fake `torch.cuda.device`: a stack of current indices (None = as found), a log of entries and exits."""

    def __init__(self):
        self.current, self.entered, self.exited = [None], [], 0

    @contextmanager
    def __call__(self, index: int):
        self.entered.append(index)
        self.current.append(index)
        try:
            yield
        finally:
            self.current.pop()
            self.exited += 1

    @property
    def now(self):
        return self.current[-1]


@pytest.fixture
def recording(monkeypatch):
    fake = RecordingDevice()
    monkeypatch.setattr(device_guard, "cuda_device", fake)
    return fake


def test_on_device_enters_the_index_and_leaves_other_devices_alone(recording):
    with device_guard.on_device("cuda:1"):
        assert recording.now == 1
    with device_guard.on_device(torch.device("cuda", 0)):
        assert recording.now == 0
    for plain in ("cpu", "cuda", torch.device("cpu")):  # a bare "cuda" already means the current device
        with device_guard.on_device(plain):
            assert recording.now is None
    assert recording.entered == [1, 0] and recording.exited == 2 and recording.now is None


def test_multi_device_pass_runs_each_band_on_its_device_and_restores_the_callers(recording):
    """The old pass called torch.cuda.set_device on the calling thread (rank 0) and never restored it."""
    import threading

    from turbovae.vae.parallel.collectives import run_on_devices

    seen = {}
    lock = threading.Lock()

    def band(comm):
        with lock:
            seen[comm.rank] = (threading.current_thread() is threading.main_thread(), recording.entered[-1])
        return comm.rank

    devices = [torch.device("cuda:1"), torch.device("cuda:0")]
    assert run_on_devices(devices, band) == 0
    assert seen[0] == (True, 1)  # rank 0 on the caller's thread, under cuda:1
    assert sorted(recording.entered) == [0, 1] and recording.exited == 2 and recording.now is None


def test_multi_device_pass_restores_the_device_when_a_band_fails(recording):
    from turbovae.vae.parallel.collectives import run_on_devices

    def band(comm):
        raise ValueError(f"band {comm.rank} failed")

    with pytest.raises(ValueError, match="band"):
        run_on_devices([torch.device("cuda:1"), torch.device("cuda:0")], band)
    assert recording.exited == 2 and recording.now is None


def test_aoti_package_loads_and_runs_on_the_requested_device(recording, tmp_path):
    from turbovae.trt.aoti import AOTIBackend

    loaded_on, ran_on = [], []

    class Backend(AOTIBackend):
        def check_available(self, device):
            pass

        def load_runner(self, path):
            loaded_on.append(recording.now)

            def runner(x):
                ran_on.append(recording.now)
                return x * 2
            return runner

    pkg = tmp_path / "decoder.pt2"
    pkg.write_bytes(b"x")
    prof = {"latents": ((1, 4, 8, 8), (1, 4, 8, 8), (1, 4, 8, 8))}
    engine = Backend().load(pkg, [prof], torch.device("cuda:1"), ["latents"], ["pixels"])
    out = engine.run({"latents": torch.ones(1, 4, 8, 8)})["pixels"]
    assert torch.equal(out, torch.full((1, 4, 8, 8), 2.0))
    assert loaded_on == [1] and ran_on == [1] and recording.now is None


def test_tensorrt_deserialises_on_the_requested_device(recording, monkeypatch, tmp_path):
    import sys

    from test_engines_logic import _mock_trt

    from turbovae.trt import tensorrt_backend as TB
    from turbovae.trt.interface import EngineLoadError

    trt = _mock_trt()
    deserialised_on = []

    class Runtime:
        def __init__(self, logger):
            pass

        def deserialize_cuda_engine(self, data):
            deserialised_on.append(recording.now)
            return None  # "could not deserialise": stops before a CUDA stream is made (none on this machine)

    class Logger:
        WARNING = 2

        def __init__(self, level):
            pass

    trt.Runtime, trt.Logger = Runtime, Logger
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    plan = tmp_path / "decoder.engine"
    plan.write_bytes(b"x")
    with pytest.raises(EngineLoadError, match="could not deserialise"):
        TB.TensorRTBackend(cache_dir=tmp_path).load(plan, [], torch.device("cuda:1"), ["latents"], ["pixels"])
    assert deserialised_on == [1] and recording.now is None and recording.exited == 1


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_gpus_model_on_the_second_and_a_two_device_pass_leave_the_current_device():
    """On a two-GPU machine (the GPU run): a model on cuda:1 decodes there (fused kernels included) while
    cuda:0 is current, equal to the CPU decode; a two-device pass leaves the current device as it was."""
    from turbovae import TurboVAE, decode_parallel, decode_tiled
    from turbovae.vae.wan import TINY_WAN21, WanVAE

    torch.manual_seed(0)
    cpu = TurboVAE(WanVAE(TINY_WAN21))
    z = torch.randn(1, cpu.latent_channels, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    want = cpu.decode(z)
    torch.cuda.set_device(0)
    gpu = TurboVAE(WanVAE(TINY_WAN21)).to("cuda:1")
    gpu.model.load_state_dict(cpu.model.state_dict())
    for out in (gpu.decode(z.to("cuda:1")), decode_tiled(gpu, z.to("cuda:1"), tile_px=64, mode="exact")):
        assert out.device == torch.device("cuda:1") and torch.cuda.current_device() == 0
        assert (out.cpu() - want).abs().max().item() <= 1e-4
    torch.cuda.set_device(1)
    out = decode_parallel(gpu, z, devices=["cuda:0", "cuda:1"])
    assert torch.cuda.current_device() == 1
    assert (out.cpu() - want).abs().max().item() <= 1e-4
    torch.cuda.set_device(0)
