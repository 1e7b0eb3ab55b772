"""Self-checks and tracers (issue 33, item 2): under torch.export / torch.compile / FakeTensorMode no probe
runs (its tensors would be fake and baked into the program as constants), a traced call uses the decided
state or the plain path while undecided, and nothing a tracer raises switches a path off for the process.

The GPU-only paths run on CPU tensors inside `gpu_paths_on_cpu()`, with the conditions of the CUDA engine
build: channels-last on and its self-check pending, bf16."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from turbovae.vae.accel import channels_last, self_checks
from turbovae.vae.tracing import tracing

sys.path.insert(0, str(Path(__file__).parent))
from engines_toy import export_only  # noqa: E402


class _Recorder:
    """A probe pair that records every call (and how many ran under a tracer)."""

    def __init__(self):
        self.calls = 0
        self.traced_calls = 0
        self.taken: list[bool] = []  # what each forward decided (kept outside the module: export restores it)

    def probe(self):
        self.calls += 1
        self.traced_calls += tracing()
        return torch.ones(3)


class _Checked(nn.Module):
    """A module whose forward asks the registry, as the call sites do (channels-last, fused norms)."""

    def __init__(self, recorder: _Recorder):
        super().__init__()
        self.recorder = recorder
        self.conv = nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x):
        fast = self_checks.check("channels_last", x.device, "probe class", self.recorder.probe, self.recorder.probe)
        self.recorder.taken.append(fast)
        return self.conv(x) * 2 if fast else self.conv(x)


def test_tracing_sees_fake_mode_export_and_eager():
    assert not tracing()
    with FakeTensorMode():
        assert tracing()
    seen = []

    class M(nn.Module):
        def forward(self, x):
            seen.append(tracing())
            return x + 1

    torch.export.export(M(), (torch.ones(2),))
    assert seen and all(seen)


def test_export_with_a_pending_check_runs_no_probe_and_switches_nothing_off():
    rec = _Recorder()
    m = _Checked(rec).eval()
    x = torch.randn(1, 2, 4, 4)
    with self_checks.gpu_paths_on_cpu():
        ep = torch.export.export(m, (x,))
    assert rec.calls == 0 and rec.traced_calls == 0
    assert rec.taken == [False]  # undecided: the trace took the plain path
    assert self_checks.off() == [] and self_checks.results() == []
    assert torch.equal(ep.module()(x), m.conv(x))
    # eagerly the check runs once and its decision is then what a later trace uses
    with self_checks.gpu_paths_on_cpu():
        m(x)
        assert rec.calls == 2 and rec.traced_calls == 0
        ep = torch.export.export(m, (x,))
    assert rec.calls == 2 and rec.taken[-1] is True
    assert torch.allclose(ep.module()(x), m.conv(x) * 2)


def test_compile_with_a_pending_check_runs_no_probe():
    rec = _Recorder()
    m = _Checked(rec).eval()
    x = torch.randn(1, 2, 4, 4)
    with self_checks.gpu_paths_on_cpu():
        out = torch.compile(m, backend="eager", fullgraph=False)(x)
    assert rec.traced_calls == 0 and self_checks.off() == []
    # dynamo traces the registry call: no probe, the plain path for this trace
    assert rec.calls == 0 and rec.taken == [False] and torch.equal(out, m.conv(x))


def test_a_failure_raised_under_a_tracer_does_not_switch_the_path_off():
    with self_checks.gpu_paths_on_cpu():
        with FakeTensorMode():
            self_checks.fail("channels_last", "cpu", NotImplementedError("argument of type: <class 'torch._C.Generator'>"))
            self_checks.fail("triton_norms", "cpu", "a launch under the tracer failed")
            assert not self_checks.check("conv3d_route", "cpu", "k", lambda: 1 / 0, lambda: 1 / 0)
        assert self_checks.off() == [] and self_checks.results() == []
        assert self_checks.enabled("channels_last", "cpu") and self_checks.enabled("triton_norms", "cpu")
        # outside the tracer the same failure still switches the path off
        self_checks.fail("channels_last", "cpu", "eager failure")
        assert not self_checks.enabled("channels_last", "cpu")


def test_decided_state_is_used_under_a_tracer():
    with self_checks.gpu_paths_on_cpu():
        assert self_checks.decided("channels_last", "cpu", "k") is None
        assert self_checks.check("channels_last", "cpu", "k", lambda: torch.ones(2), lambda: torch.ones(2))
        with FakeTensorMode():
            assert self_checks.check("channels_last", "cpu", "k", lambda: 1 / 0, lambda: 1 / 0)
            assert not self_checks.check("channels_last", "cpu", "other", lambda: 1 / 0, lambda: 1 / 0)
        assert self_checks.decided("channels_last", "cpu", "k") is True
        assert self_checks.decided("channels_last", "cpu", "other") is None


def _seedvr2():
    from turbovae.vae.seedvr2.config import SeedVR2Config
    from turbovae.vae.seedvr2.model import SeedVR2VAE

    torch.manual_seed(0)
    return SeedVR2VAE(SeedVR2Config.tiny()).eval()


@pytest.mark.parametrize("settled", [False, True], ids=["check-pending", "settled-before-export"])
@pytest.mark.slow
def test_bf16_slice_engine_export_holds_no_fake_constant(tmp_path, monkeypatch, settled):
    """The CUDA failure of 2026-11-26 ("fake tensor in the exported program constant's list … lifted_tensor_0")
    on CPU: the slice engines exported in bf16 with the GPU-only paths live (channels-last on, its self-check
    pending, as on a fresh CUDA process). The probe must not run inside the trace, nothing may be switched
    off, and the exported programs hold no fake tensor constant."""
    from turbovae.trt import build as build_mod
    from turbovae.trt.aoti import AOTIBackend
    from turbovae.trt.buckets import Bucket, static_table
    from turbovae.vae.api import TurboVAE

    probes = {"eager": 0, "traced": 0}
    real_probe = channels_last.layout_probe

    def recording_probe(*a, **k):
        probes["traced" if tracing() else "eager"] += 1
        return real_probe(*a, **k)

    monkeypatch.setattr(channels_last, "layout_probe", recording_probe)
    if not settled:
        monkeypatch.setattr(build_mod, "settle_for_trace", lambda device, dtype: None)
    programs = []
    with export_only(), self_checks.gpu_paths_on_cpu():
        saved = AOTIBackend.compile_package

        def keep(self, program, f):
            programs.append(program)
            return saved(self, program, f)

        monkeypatch.setattr(AOTIBackend, "compile_package", keep)
        build_mod.build_engine_set(TurboVAE(_seedvr2()), tmp_path / "set", static_table(Bucket(32, 48)),
                                   backend="aoti", dtype=torch.bfloat16, device=torch.device("cpu"),
                                   components=(), video=True)
    assert len(programs) == 2  # decode_slice_first, decode_slice_next
    for ep in programs:
        fake = [name for name, value in ep.constants.items() if isinstance(value, FakeTensor)]
        assert fake == [], fake
    assert probes["traced"] == 0
    assert probes["eager"] == (2 if settled else 0)  # fast and reference layouts, once, before the export
    assert self_checks.off() == []
    assert self_checks.decided("channels_last", "cpu", "bfloat16 conv2d/conv3d 3x3") is (True if settled else None)


def test_conv3d_route_under_export_uses_the_decided_state(monkeypatch):
    """The conv3d guard route (vae/accel/kernels/conv_guard.py) inside torch.export: while its check is undecided the
    trace takes fp32 conv3d without probing; once an eager call checked it on the device, the trace takes it."""
    from turbovae.vae.accel.kernels import conv_guard as G

    calls = {"eager": 0, "traced": 0}
    real = G.conv3d_as_conv2d

    def recording(*a, **k):
        calls["traced" if tracing() else "eager"] += 1
        return real(*a, **k)

    monkeypatch.setattr(G, "conv3d_as_conv2d", recording)
    route = G.Conv3dRoute("conv2d", "test")
    w = torch.randn(6, 4, 3, 3, 3, generator=torch.Generator().manual_seed(0))

    class Conv(nn.Module):
        def forward(self, x):
            return G.conv3d(x, w, None, 1, (0, 1, 1), route=route)

    x = torch.randn(1, 4, 3, 8, 8, generator=torch.Generator().manual_seed(1))  # one output frame
    want = torch.nn.functional.conv3d(x, w, None, 1, (0, 1, 1))
    with self_checks.gpu_paths_on_cpu():
        ep = torch.export.export(Conv(), (x,))
        assert calls == {"eager": 0, "traced": 0} and self_checks.results() == [] and self_checks.off() == []
        assert torch.allclose(ep.module()(x), want, atol=1e-5)
        Conv()(x)  # eager: probe + routed call
        assert calls["eager"] == 2 and self_checks.results()[0].ok
        torch.export.export(Conv(), (x,))
    assert calls["traced"] == 1 and calls["eager"] == 2 and self_checks.off() == []


@pytest.mark.skipif(__import__("os").environ.get("TURBOVAE_COMPILE_TESTS") != "1",
                    reason="the real AOTInductor compile of both bf16 slice graphs takes minutes on CPU; set "
                           "TURBOVAE_COMPILE_TESTS=1")
def test_real_bf16_slice_engines_compile_and_serve_with_gpu_paths_live(tmp_path):
    """The CUDA test's chain (tests/test_engines_video.py `_real_compile_chain`, bf16) on CPU with the GPU-only
    paths live: export, AOTInductor compile, load and the clip served by the engines within the bf16 bar."""
    from turbovae.vae.measuring import psnr

    import test_engines_video as video

    with self_checks.gpu_paths_on_cpu():
        out, ref, calls = video._real_compile_chain(tmp_path, "cpu", torch.bfloat16)
    assert calls == 1 and psnr(out, ref) >= 40 and self_checks.off() == []
