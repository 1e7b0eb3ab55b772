"""An out-of-memory is not a failed check (issue 33 item 7a): a fast path whose self-check probe, Triton
norm launch or conv3d route launch runs out of memory is kept (the pass frees and retries by the tiler's
rule); only `OOM_FAILURES_TO_DISABLE` out-of-memory failures in a row switch it off — the one rule
(`vae.memory.oom.OomStreak`) that CUDA graphs and engines follow too. Injected failures on CPU tensors inside
`gpu_paths_on_cpu()`."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from turbovae.vae.accel import cuda_graphs, self_checks
from turbovae.vae import norms
from turbovae.vae.accel.kernels import conv_guard as G
from turbovae.vae.memory.oom import OOM_FAILURES_TO_DISABLE, OomStreak


def _oom():
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")


@pytest.fixture
def on_cpu():
    with self_checks.gpu_paths_on_cpu():
        yield


def test_one_rule_for_every_optional_path():
    from turbovae.trt.engine_vae import ENGINE_OOM_FAILURES_TO_DISABLE

    assert cuda_graphs.OOM_FAILURES_TO_DISABLE == ENGINE_OOM_FAILURES_TO_DISABLE == OOM_FAILURES_TO_DISABLE == 3
    streak = OomStreak()
    assert [streak.failed("a") for _ in range(2)] == [1, 2] and not streak.exhausted("a")
    streak.succeeded("a")  # a success between them ends the streak
    assert streak.count("a") == 0
    assert [streak.failed("a") for _ in range(3)] == [1, 2, 3] and streak.exhausted("a")
    assert not streak.exhausted("b")  # per key
    with pytest.raises(ValueError, match=">= 1"):
        OomStreak(0)


def test_probe_out_of_memory_keeps_the_path_and_checks_again(on_cpu, caplog):
    outcomes = [_oom, _oom, None]  # two probes out of memory, then one that passes

    def fast():
        make = outcomes.pop(0)
        if make is not None:
            raise make()
        return torch.ones(3)

    with caplog.at_level(logging.WARNING, logger="turbovae"):
        for _ in range(2):
            with pytest.raises(torch.OutOfMemoryError):
                self_checks.check("channels_last", "cpu", "k", fast, lambda: torch.ones(3))
            assert self_checks.enabled("channels_last", "cpu") and self_checks.results() == []
        assert self_checks.oom_streak("channels_last", "cpu") == 2
        assert self_checks.check("channels_last", "cpu", "k", fast, lambda: torch.ones(3))
    assert self_checks.oom_streak("channels_last", "cpu") == 0 and self_checks.off() == []
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(messages) == 1 and "ran out of memory" in messages[0] and "kept" in messages[0]


def test_every_path_declares_whether_it_saves_memory():
    """One table: the paths whose fallback needs more memory (fused norms: no fp32 copies; the conv3d route: the
    fp32 conv is twice the bytes; channels-last: contiguous convs take extra workspaces; the multi-GPU bands:
    1/N of the pass per device) against those that cost memory (graph pools, compiled buffers, engines)."""
    saving = {name for name, path in self_checks.PATHS.items() if path.saves_memory}
    assert saving == {"triton_norms", "conv3d_route", "channels_last", "process_group"}
    assert [self_checks.oom_may_switch_off(p) for p in ("cuda_graphs", "compile", "engines")] == [True] * 3
    with pytest.raises(KeyError, match="no_such_path"):
        self_checks.oom_may_switch_off("no_such_path")


def test_out_of_memory_three_times_in_a_row_switches_a_memory_costing_path_off(on_cpu, caplog):
    def fast():
        raise _oom()

    with caplog.at_level(logging.WARNING, logger="turbovae"):
        for _ in range(OOM_FAILURES_TO_DISABLE):
            with pytest.raises(torch.OutOfMemoryError):
                self_checks.check("cuda_graphs", "cpu", "k", fast, lambda: torch.ones(3))
    assert not self_checks.enabled("cuda_graphs", "cpu")
    assert self_checks.off()[0].detail.startswith(f"out of memory {OOM_FAILURES_TO_DISABLE} times in a row")
    # off now: the next call takes the plain path without probing
    assert not self_checks.check("cuda_graphs", "cpu", "k", fast, lambda: torch.ones(3))


@pytest.mark.parametrize("path", ["triton_norms", "conv3d_route", "channels_last", "process_group"])
@pytest.mark.slow
def test_out_of_memory_never_switches_off_a_path_that_saves_memory(on_cpu, caplog, path):
    """Its fallback needs more memory, so switching it off would make the next attempt more likely to fail."""
    def fast():
        raise _oom()

    with caplog.at_level(logging.WARNING, logger="turbovae"):
        for _ in range(3 * OOM_FAILURES_TO_DISABLE):
            with pytest.raises(torch.OutOfMemoryError):
                self_checks.check(path, "cpu", "k", fast, lambda: torch.ones(3))
    assert self_checks.enabled(path, "cpu") and self_checks.off() == []
    assert self_checks.oom_streak(path, "cpu") == 3 * OOM_FAILURES_TO_DISABLE
    assert self_checks.check(path, "cpu", "k", lambda: torch.ones(3), lambda: torch.ones(3))  # still probed, runs
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(messages) == 1 and "kept" in messages[0]


class _Dispatch:
    """Fused norms that are right, but whose real launches (not the small probes) run out of memory `ooms`
    times first."""

    def __init__(self, ooms: int):
        self.ooms, self.launches = ooms, 0

    def _run(self, x, out):
        if x.shape[-1] > 8:  # a real launch (the probe is at most 8×8 px)
            self.launches += 1
            if self.ooms > 0:
                self.ooms -= 1
                raise _oom()
        return out

    def group_norm_silu(self, x, num_groups, weight, bias, eps, silu):
        return self._run(x, norms.group_norm_silu_reference(x, num_groups, weight, bias, eps, silu=silu))

    def rms_norm_silu(self, x, gamma, bias, silu, eps, out=None):
        return self._run(x, norms.rms_norm_silu_reference(x, gamma, bias, silu=silu, eps=eps, out=out))


@pytest.fixture
def dispatch_slot():
    yield
    norms.reset_fused_dispatch()


def test_triton_norm_launch_out_of_memory_keeps_the_kernels(on_cpu, dispatch_slot, seeded):
    x = torch.randn(1, 8, 2, 12, 12, generator=seeded)
    want = norms.group_norm_silu_reference(x, 4, None, None, 1e-6)
    dispatch = _Dispatch(ooms=1)
    norms.set_fused_dispatch(dispatch)
    with pytest.raises(torch.OutOfMemoryError):  # the pass's retry (the tiler) sees it
        norms.group_norm_silu(x, 4, None, None, 1e-6)
    assert self_checks.enabled("triton_norms", "cpu") and self_checks.oom_streak("triton_norms", "cpu") == 1
    before = self_checks.usage()
    assert torch.equal(norms.group_norm_silu(x, 4, None, None, 1e-6), want)  # the retry: fused again
    assert "triton_norms" in self_checks.summary_since(before) and dispatch.launches == 2
    assert self_checks.oom_streak("triton_norms", "cpu") == 0


@pytest.mark.slow
def test_triton_norm_launch_out_of_memory_inside_a_tiled_pass_is_retried(on_cpu, dispatch_slot, seeded):
    """Through the public tiled decode: the out-of-memory reaches the tiler, which frees and retries, and the
    result equals the plain pass while the kernels stay on."""
    from turbovae.vae.api import TurboVAE
    from turbovae.vae.tiled import decode_tiled
    from turbovae.vae.wan import TINY_WAN21, WanVAE

    torch.manual_seed(0)
    vae = TurboVAE(WanVAE(TINY_WAN21).eval())
    z = torch.randn(1, vae.latent_channels, 2, 16, 16, generator=seeded)
    with torch.inference_mode():
        want = vae.decode(z)
        dispatch = _Dispatch(ooms=2)
        norms.set_fused_dispatch(dispatch)
        got = decode_tiled(vae, z, tile_px=128, overlap_px=32, mode="exact")
    assert dispatch.ooms == 0 and dispatch.launches > 2  # both injected failures hit, later launches ran
    assert (got - want).abs().max().item() <= 1e-5
    assert self_checks.enabled("triton_norms", "cpu") and self_checks.off() == []


def test_conv3d_route_launch_out_of_memory_keeps_the_route(on_cpu, seeded, monkeypatch):
    x, w = torch.randn(1, 4, 3, 12, 12, generator=seeded), torch.randn(6, 4, 3, 3, 3, generator=seeded)
    want = F.conv3d(x, w, None, 1, (0, 1, 1))
    real, failures = G._routed, [1]

    def routed(route, xx, *args):
        if xx.shape[-1] == x.shape[-1] and failures[0] > 0:  # the real launch, not the probe
            failures[0] -= 1
            raise _oom()
        return real(route, xx, *args)

    monkeypatch.setattr(G, "_routed", routed)
    route = G.Conv3dRoute("conv2d", "test")
    with pytest.raises(torch.OutOfMemoryError):
        G.conv3d(x, w, None, 1, (0, 1, 1), route=route)
    assert self_checks.enabled("conv3d_route", "cpu") and self_checks.oom_streak("conv3d_route", "cpu") == 1
    got = G.conv3d(x, w, None, 1, (0, 1, 1), route=route)
    assert (got - want).abs().max().item() <= 1e-5 * want.abs().max().item()
    assert self_checks.off() == [] and self_checks.oom_streak("conv3d_route", "cpu") == 0


def test_a_non_memory_launch_failure_still_switches_the_route_off(on_cpu, seeded, monkeypatch):
    x, w = torch.randn(1, 4, 3, 12, 12, generator=seeded), torch.randn(6, 4, 3, 3, 3, generator=seeded)
    real = G._routed

    def routed(route, xx, *args):
        if xx.shape[-1] == x.shape[-1]:
            raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED")
        return real(route, xx, *args)

    monkeypatch.setattr(G, "_routed", routed)
    got = G.conv3d(x, w, None, 1, (0, 1, 1), route=G.Conv3dRoute("conv2d", "test"))
    assert (got - F.conv3d(x, w, None, 1, (0, 1, 1))).abs().max().item() <= 1e-5 * 10
    assert not self_checks.enabled("conv3d_route", "cpu")


@pytest.mark.slow
def test_many_triton_norm_launch_out_of_memory_failures_keep_the_kernels(on_cpu, dispatch_slot, seeded):
    x = torch.randn(1, 8, 2, 12, 12, generator=seeded)
    want = norms.group_norm_silu_reference(x, 4, None, None, 1e-6)
    dispatch = _Dispatch(ooms=2 * OOM_FAILURES_TO_DISABLE)
    norms.set_fused_dispatch(dispatch)
    for _ in range(2 * OOM_FAILURES_TO_DISABLE):
        with pytest.raises(torch.OutOfMemoryError):
            norms.group_norm_silu(x, 4, None, None, 1e-6)
    assert self_checks.enabled("triton_norms", "cpu")
    assert torch.equal(norms.group_norm_silu(x, 4, None, None, 1e-6), want)
    assert dispatch.launches == 2 * OOM_FAILURES_TO_DISABLE + 1  # the last call ran the kernels, not the reference


@pytest.mark.slow
def test_many_conv3d_route_launch_out_of_memory_failures_keep_the_route(on_cpu, seeded, monkeypatch):
    x, w = torch.randn(1, 4, 3, 12, 12, generator=seeded), torch.randn(6, 4, 3, 3, 3, generator=seeded)
    real, failures, launches = G._routed, [2 * OOM_FAILURES_TO_DISABLE], []

    def routed(route, xx, *args):
        if xx.shape[-1] == x.shape[-1]:  # the real launch, not the probe
            launches.append(1)
            if failures[0] > 0:
                failures[0] -= 1
                raise _oom()
        return real(route, xx, *args)

    monkeypatch.setattr(G, "_routed", routed)
    route = G.Conv3dRoute("conv2d", "test")
    for _ in range(2 * OOM_FAILURES_TO_DISABLE):
        with pytest.raises(torch.OutOfMemoryError):
            G.conv3d(x, w, None, 1, (0, 1, 1), route=route)
    assert self_checks.enabled("conv3d_route", "cpu")
    G.conv3d(x, w, None, 1, (0, 1, 1), route=route)
    assert len(launches) == 2 * OOM_FAILURES_TO_DISABLE + 1 and self_checks.off() == []
