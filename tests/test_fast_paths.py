"""Self-check before trust (vae/accel/self_checks): a failure injected into each GPU-only path through its public
switch point gives the correct result, exactly one warning naming the path, the device and the fallback, and
the path off for the rest of the process. The paths run on CPU tensors inside `gpu_paths_on_cpu()`."""

from __future__ import annotations

import datetime
import logging

import pytest
import torch
import torch.nn.functional as F

from turbovae.vae.accel import self_checks
from turbovae.vae import norms
from turbovae.vae.accel.cuda_graphs import CudaGraphRunner, _Captured
from turbovae.vae.accel.kernels import conv_guard as G


@pytest.fixture
def on_cpu():
    with self_checks.gpu_paths_on_cpu():
        yield


def _warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "turbovae"]


def _one_warning(caplog, what: str, fallback: str) -> str:
    records = _warnings(caplog)
    assert len(records) == 1, [r.getMessage() for r in records]
    message = records[0].getMessage()
    assert what in message and "on cpu" in message and fallback in message, message
    return message


# -- the registry itself ----------------------------------------------------------------------------------

def test_check_runs_once_per_device_and_class_and_records_the_error():
    calls = []

    def fast():
        calls.append(1)
        return torch.ones(3) + 1e-6

    assert self_checks.check("compile", "cpu", "class A", fast, lambda: torch.ones(3))
    assert self_checks.check("compile", "cpu", "class A", fast, lambda: torch.ones(3))
    assert self_checks.check("compile", "cpu", "class B", fast, lambda: torch.ones(3))
    assert len(calls) == 2
    (a, _b) = self_checks.results()
    assert a.ok and a.key == "class A" and a.detail.startswith("error ") and "<= 1e-04" in a.detail


@pytest.mark.parametrize("fast, why", [
    (lambda: torch.tensor([1.0, float("nan")]), "NaN/Inf"),
    (lambda: torch.tensor([1.0, 2.5]), "exceeds its tolerance"),
    (lambda: torch.ones(3), "output shapes"),
])
def test_a_failed_probe_switches_the_path_off_with_one_warning(fast, why, caplog):
    with caplog.at_level(logging.WARNING, logger="turbovae"):
        assert not self_checks.check("compile", "cpu", "k", fast, lambda: torch.tensor([1.0, 2.0]))
        assert not self_checks.check("compile", "cpu", "other class", lambda: torch.ones(2), lambda: torch.ones(2))
        self_checks.fail("compile", "cpu", "and a failure seen later")
    assert why in _one_warning(caplog, "torch.compile regions", "eager")
    assert not self_checks.enabled("compile", "cpu") and self_checks.enabled("compile", "cuda:1")
    assert [r.path for r in self_checks.off()] == ["compile"]


def test_self_check_env_zero_skips_the_probes(monkeypatch):
    monkeypatch.setenv(self_checks.ENV_SELF_CHECK, "0")
    assert self_checks.check("compile", "cpu", "k", lambda: torch.tensor([9.0]), lambda: torch.tensor([1.0]))
    assert self_checks.results() == [] and self_checks.enabled("compile", "cpu")


def test_gpu_paths_apply_to_cuda_only_unless_asked():
    assert self_checks.applies_to("cuda:0") and not self_checks.applies_to("cpu")
    with self_checks.gpu_paths_on_cpu():
        assert self_checks.applies_to("cpu")
    assert not self_checks.applies_to("cpu")


def test_summary_names_what_ran_and_what_is_off():
    before = self_checks.usage()
    self_checks.used("triton_norms")
    self_checks.fail("cuda_graphs", "cpu", "capture failed")
    assert self_checks.summary_since(before) == "fast paths: triton_norms; off: cuda_graphs (cpu)"
    assert self_checks.summary_since(self_checks.usage()) == "fast paths: none; off: cuda_graphs (cpu)"


# -- Triton norm kernels: the dispatcher (vae.norms.set_fused_dispatch) ----------------------------------------

class _Dispatch:
    """A fused dispatcher that is right, wrong (+0.5) or raises; counts its calls."""

    def __init__(self, mode: str):
        self.mode, self.calls = mode, 0

    def _run(self, out):
        self.calls += 1
        if self.mode == "raise":
            raise RuntimeError("simulated: Triton compile error on this GPU")
        return out + 0.5 if self.mode == "wrong" else out

    def group_norm_silu(self, x, num_groups, weight, bias, eps, silu):
        return self._run(norms.group_norm_silu_reference(x, num_groups, weight, bias, eps, silu=silu))

    def rms_norm_silu(self, x, gamma, bias, silu, eps, out=None):
        return self._run(norms.rms_norm_silu_reference(x, gamma, bias, silu=silu, eps=eps))


@pytest.fixture
def dispatch_slot():
    yield
    norms.reset_fused_dispatch()


def _norms(x):
    gamma = torch.linspace(0.5, 1.5, x.shape[1]).view(-1, 1, 1, 1)
    return norms.group_norm_silu(x, 4, None, None, 1e-6), norms.rms_norm_silu(x, gamma)


@pytest.mark.parametrize("mode", ["wrong", "raise"])
def test_triton_norms_failure_falls_back_to_pytorch(mode, on_cpu, dispatch_slot, seeded, caplog):
    x = torch.randn(2, 8, 3, 12, 10, generator=seeded)
    want = (norms.group_norm_silu_reference(x, 4, None, None, 1e-6),
            norms.rms_norm_silu_reference(x, torch.linspace(0.5, 1.5, 8).view(-1, 1, 1, 1)))
    dispatch = _Dispatch(mode)
    norms.set_fused_dispatch(dispatch)
    with caplog.at_level(logging.WARNING, logger="turbovae"):
        got = _norms(x) + _norms(x)
    assert all(torch.equal(g, w) for g, w in zip(got, want + want))
    message = _one_warning(caplog, "Triton GroupNorm/RMS-norm(+SiLU) kernels", "the PyTorch norm ops")
    assert ("exceeds its tolerance" if mode == "wrong" else "simulated: Triton compile error") in message
    assert not self_checks.enabled("triton_norms", "cpu") and dispatch.calls == 1  # the probe only


def test_triton_norms_raising_at_run_time_is_caught_without_self_check(on_cpu, dispatch_slot, seeded, caplog,
                                                                      monkeypatch):
    monkeypatch.setenv(self_checks.ENV_SELF_CHECK, "0")
    x = torch.randn(1, 8, 2, 6, 6, generator=seeded)
    norms.set_fused_dispatch(_Dispatch("raise"))
    with caplog.at_level(logging.WARNING, logger="turbovae"):
        got = _norms(x)
    assert torch.equal(got[0], norms.group_norm_silu_reference(x, 4, None, None, 1e-6))
    _one_warning(caplog, "Triton", "the PyTorch norm ops")
    assert not self_checks.enabled("triton_norms", "cpu")


def test_triton_norms_that_pass_are_checked_once_per_class_and_used(on_cpu, dispatch_slot, seeded, caplog):
    x = torch.randn(1, 8, 2, 6, 6, generator=seeded)
    dispatch = _Dispatch("right")
    norms.set_fused_dispatch(dispatch)
    before = self_checks.usage()
    with caplog.at_level(logging.WARNING, logger="turbovae"):
        _norms(x)
        _norms(x)
        _norms(x.contiguous(memory_format=torch.channels_last_3d))  # another layout: another check
    assert _warnings(caplog) == [] and self_checks.enabled("triton_norms", "cpu")
    assert len(self_checks.results()) == 4 and dispatch.calls == 4 + 6  # 4 probes, 6 real calls
    assert "triton_norms" in self_checks.summary_since(before)


# -- conv3d route guard: the `route=` argument, and the routes' implementations --------------------------------

def test_conv3d_route_that_raises_falls_back_to_fp32(seeded, caplog):
    x, w, b = torch.randn(1, 4, 3, 8, 8, generator=seeded), torch.randn(6, 4, 3, 3, 3, generator=seeded), None
    want = F.conv3d(x, w, b, 1, 1)
    with caplog.at_level(logging.WARNING, logger="turbovae"):
        got = [G.conv3d(x, w, b, 1, 1, route=G.Conv3dRoute("cudnn", "test")) for _ in range(2)]
    assert all((g - want).abs().max().item() <= 1e-5 * want.abs().max().item() for g in got)
    assert "NotImplementedError" in _one_warning(caplog, "conv3d regression guard", "fp32 conv3d")
    assert not self_checks.enabled("conv3d_route", "cpu")


def test_conv3d_route_with_wrong_values_falls_back_to_fp32(seeded, caplog, monkeypatch):
    calls = []

    def wrong_sum(*args, **kwargs):
        calls.append(1)
        return torch.zeros(1)  # neither the values nor the shape of the conv

    monkeypatch.setattr(G, "conv3d_as_conv2d", wrong_sum)
    x, w = torch.randn(1, 4, 3, 8, 8, generator=seeded), torch.randn(6, 4, 3, 3, 3, generator=seeded)
    want = F.conv3d(x, w, None, 1, (0, 1, 1))  # one output frame: the conv2d route's case
    with caplog.at_level(logging.WARNING, logger="turbovae"):
        got = [G.conv3d(x, w, None, 1, (0, 1, 1), route=G.Conv3dRoute("conv2d", "test")) for _ in range(2)]
    assert all((g - want).abs().max().item() <= 1e-5 * want.abs().max().item() for g in got) and len(calls) == 1
    _one_warning(caplog, "conv3d regression guard", "fp32 conv3d")


def test_conv3d_route_that_passes_is_used(seeded, caplog):
    x, w = torch.randn(1, 4, 3, 8, 8, generator=seeded), torch.randn(6, 4, 3, 3, 3, generator=seeded)
    before = self_checks.usage()
    with caplog.at_level(logging.WARNING, logger="turbovae"):
        got = G.conv3d(x, w, None, 1, (0, 1, 1), route=G.Conv3dRoute("conv2d", "test"))
    want = F.conv3d(x, w, None, 1, (0, 1, 1))
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item() and _warnings(caplog) == []
    assert "conv3d_route" in self_checks.summary_since(before) and self_checks.results()[0].ok


# -- channels-last: the conv the architectures and the probe call (conv_guard.conv3d) -------------------------

@pytest.mark.parametrize("arch", ["seedvr2", "wan2.1"])
@pytest.mark.parametrize("mode", ["wrong", "raise"])
def test_channels_last_failure_runs_the_pass_contiguous(arch, mode, on_cpu, seeded, caplog, monkeypatch):
    from dataclasses import replace

    from turbovae import TurboVAE
    from turbovae.vae.seedvr2 import SeedVR2Config, SeedVR2VAE
    from turbovae.vae.wan import TINY_WAN21, WanVAE

    torch.manual_seed(0)
    model = SeedVR2VAE(SeedVR2Config.tiny()) if arch == "seedvr2" else WanVAE(TINY_WAN21)
    assert model.fast.channels_last  # on by default in both architectures
    vae = TurboVAE(model)
    z = torch.randn(1, vae.latent_channels, 2, 4, 4, generator=seeded)
    fast_off = replace(model.fast, channels_last=False)
    plain = TurboVAE(SeedVR2VAE(SeedVR2Config.tiny(), fast_off) if arch == "seedvr2"
                     else WanVAE(TINY_WAN21, fast=fast_off))
    plain.model.load_state_dict(model.state_dict())
    want = plain.decode(z)  # the fallback: contiguous activations
    real = G.conv3d

    def broken_on_channels_last(x, *args, **kwargs):
        if x.is_contiguous():
            return real(x, *args, **kwargs)
        if mode == "raise":
            raise RuntimeError("simulated: no channels-last conv kernel for this dtype")
        return real(x, *args, **kwargs) * 1.5

    monkeypatch.setattr(G, "conv3d", broken_on_channels_last)
    with caplog.at_level(logging.WARNING, logger="turbovae"):
        got = [vae.decode(z), vae.decode(z)]
    assert all((g - want).abs().max().item() <= 1e-5 for g in got)
    _one_warning(caplog, "channels-last activations", "contiguous")
    assert not self_checks.enabled("channels_last", "cpu")
    assert model.active_fast().channels_last is False
    convs = [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv3d)]
    assert convs and all(w.is_contiguous() for w in convs)  # a failed device runs no channels-last conv at all


def test_channels_last_that_passes_stays_on(on_cpu):
    from turbovae.vae.accel.channels_last import channels_last_trusted

    assert channels_last_trusted("cpu", torch.float32) and self_checks.results()[0].ok


# -- CUDA graphs: the runner's capture (`_capture`) and the graph it returns ------------------------------------

def test_cuda_graph_capture_that_throws_runs_eagerly(on_cpu, seeded, caplog):
    """The real runner on CPU tensors: its capture needs CUDA streams and throws."""
    x = torch.randn(3, 4, generator=seeded)
    runner = CudaGraphRunner(lambda t: t * 2 + 1)
    with caplog.at_level(logging.WARNING, logger="turbovae"):
        got = [runner(x), runner(x)]
    assert all(torch.equal(g, x * 2 + 1) for g in got)
    assert "capture failed" in _one_warning(caplog, "CUDA graphs", "eager passes")
    assert not self_checks.enabled("cuda_graphs", "cpu")
    other = _ScriptedRunner(lambda t: t - 1, output=None)  # a later runner on the same device does not capture
    assert torch.equal(other(x), x - 1) and other.captures == 0


class _NoGraph:
    def __init__(self, fail: bool = False):
        self.fail = fail

    def replay(self):
        if self.fail:
            raise RuntimeError("simulated: CUDA error: an illegal memory access was encountered")

    def reset(self):
        pass


class _ScriptedRunner(CudaGraphRunner):
    """A "capture" returns a graph whose replay leaves `output` (else fn's result) as the graph's output and
    keeps the eager result as the self-check reference, as the real capture keeps its last warm-up."""

    def __init__(self, fn, output, replay_fails=False):
        super().__init__(fn)
        self.output, self.replay_fails, self.captures = output, replay_fails, 0

    def _capture(self, args, kwargs, tensors):
        self.captures += 1
        eager = self.fn(*args, **kwargs)
        out = eager if self.output is None else self.output
        return _Captured(_NoGraph(self.replay_fails), list(tensors), out, reference=eager)


@pytest.mark.parametrize("failure", ["wrong replay", "replay throws"])
def test_cuda_graph_replay_failure_runs_eagerly(failure, on_cpu, seeded, caplog):
    x = torch.randn(3, 4, generator=seeded)
    runner = _ScriptedRunner(lambda t: t * 2 + 1, output=torch.zeros(3, 4) if failure == "wrong replay" else None,
                             replay_fails=failure == "replay throws")
    with caplog.at_level(logging.WARNING, logger="turbovae"):
        got = [runner(x), runner(x)]
    assert all(torch.equal(g, x * 2 + 1) for g in got) and runner.captures == 1
    message = _one_warning(caplog, "CUDA graphs", "eager passes")
    assert ("exceeds its tolerance" if failure == "wrong replay" else "illegal memory access") in message
    assert not self_checks.enabled("cuda_graphs", "cpu")


def test_cuda_graph_that_replays_right_is_checked_once_and_used(on_cpu, seeded, caplog):
    x = torch.randn(3, 4, generator=seeded)
    runner = _ScriptedRunner(lambda t: t * 2 + 1, output=None)
    before = self_checks.usage()
    with caplog.at_level(logging.WARNING, logger="turbovae"):
        assert all(torch.equal(runner(x), x * 2 + 1) for _ in range(3))
    assert _warnings(caplog) == [] and runner.captures == 1 and len(self_checks.results()) == 1
    assert "cuda_graphs" in self_checks.summary_since(before)


# -- compiled regions: the compile backend (CompileSettings.backend) ------------------------------------------

class _Block(torch.nn.Module):
    """A region with a forward of its own (dynamo does not trace torch.nn's built-in modules' frames)."""

    def __init__(self, c: int):
        super().__init__()
        self.conv = torch.nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return x + F.silu(self.conv(x))


def test_compile_failure_runs_eagerly_and_switches_compile_off(seeded, caplog):
    import torch._dynamo
    from torch import nn
    from torch._dynamo.backends.registry import register_backend

    from turbovae.vae.accel import compile as C

    def broken_backend(gm, example_inputs):
        raise RuntimeError("simulated: inductor cannot compile for this GPU")

    register_backend(compiler_fn=broken_backend, name="turbovae_test_fast_paths_broken")
    torch._dynamo.reset()
    model = nn.Sequential(_Block(3), _Block(3)).eval()
    x = torch.randn(1, 3, 8, 8, generator=seeded)
    with torch.no_grad():
        want = model(x)
        C.apply_compile(model, C.CompileSettings(backend="turbovae_test_fast_paths_broken"))
        with caplog.at_level(logging.WARNING, logger="turbovae"):
            got = [model(x), model(x)]
        assert all(torch.equal(g, want) for g in got)
        message = _one_warning(caplog, "torch.compile regions", "eager")
        assert "simulated: inductor cannot compile" in message and not self_checks.enabled("compile", "cpu")
        other = nn.Sequential(_Block(3)).eval()  # compile is off for the device: runs eagerly
        before = self_checks.usage()
        C.apply_compile(other, C.CompileSettings(backend="eager"))
        other(x)
    assert "compile" not in self_checks.summary_since(before).split(";")[0]


# -- the multi-GPU pass's process group: its collectives (DistCollective) -----------------------------------

@pytest.fixture
def gloo_group(tmp_path):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("mode", ["wrong", "raise"])
def test_process_group_failure_runs_the_single_device_pass(mode, on_cpu, gloo_group, seeded, caplog, monkeypatch):
    from turbovae import decode_parallel, decode_tiled
    from turbovae.vae.parallel import collectives

    from parallel_worker import build

    vae = build("wan2.1")
    z = torch.randn(1, vae.latent_channels, 2, 7, 5, generator=seeded)
    want = decode_tiled(vae, z, tile_px=64, mode="exact")
    real = collectives.DistCollective.all_reduce_sum

    def broken(self, t):
        if mode == "raise":
            raise collectives.ParallelPassError("simulated: NCCL error: unhandled system error")
        return real(self, t) * 2

    monkeypatch.setattr(collectives.DistCollective, "all_reduce_sum", broken)
    with caplog.at_level(logging.WARNING, logger="turbovae"):
        got = [decode_parallel(vae, z, group=gloo_group, tile_px=64) for _ in range(2)]
    assert all((g - want).abs().max().item() <= 1e-5 for g in got)
    _one_warning(caplog, "process group", "single-device exact pass")
    assert not self_checks.enabled("process_group", "cpu")


def test_process_group_that_passes_is_used(on_cpu, gloo_group, seeded):
    from turbovae import decode_parallel

    from parallel_worker import build

    vae = build("wan2.1")
    before = self_checks.usage()
    decode_parallel(vae, torch.randn(1, vae.latent_channels, 1, 7, 5, generator=seeded), group=gloo_group, tile_px=64)
    assert "process_group" in self_checks.summary_since(before) and self_checks.results()[0].ok
