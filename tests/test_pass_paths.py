"""Issue 50, item 4: choosing a pass's paths has no side effect (`VAEModel.active_fast` leaves the weights as they
are), and a pass re-lays the weights at most once, where it starts (`VAEModel.start_pass`), none when their layout
already matches; each step chooses its paths once."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from turbovae.vae import base
from turbovae.vae.accel.switches import FastPaths
from turbovae.vae.accel.weight_layout import conv_modules, is_channels_last
from turbovae.vae.seedvr2 import SeedVR2Config
from turbovae.vae.seedvr2.model import SeedVR2VAE
from turbovae.vae.wan import TINY_WAN21, WanVAE

ARCHS = {
    "wan": (lambda: WanVAE(TINY_WAN21).eval(), TINY_WAN21.z_dim),
    "seedvr2": (lambda: SeedVR2VAE(SeedVR2Config.tiny(), FastPaths()).eval(), SeedVR2Config.tiny().latent_channels),
}


def _layout(model: nn.Module) -> list[tuple[int, tuple[int, ...]]]:
    """Where each conv weight's bytes are and how they are laid out."""
    return [(m.weight.data_ptr(), m.weight.stride()) for m in conv_modules(model)]


@pytest.fixture
def relayouts(monkeypatch):
    """The re-layouts the model makes, one entry per call that moved any weight: how many it moved."""
    moved: list[int] = []
    real = base.hold_layout

    def counting(modules, channels_last: bool) -> None:
        modules = [m for m in modules if isinstance(getattr(m, "weight", None), nn.Parameter)]
        before = [m.weight.data_ptr() for m in modules]
        real(modules, channels_last)
        n = sum(m.weight.data_ptr() != p for m, p in zip(modules, before))
        if n:
            moved.append(n)

    monkeypatch.setattr(base, "hold_layout", counting)
    return moved


@pytest.fixture
def choices(monkeypatch):
    """How often the paths are chosen (`active_fast`) and a pass is started (`start_pass`)."""
    calls = {"active_fast": 0, "start_pass": 0}
    for name in calls:
        real = getattr(base.VAEModel, name)

        def counted(self, _real=real, _name=name):
            calls[_name] += 1
            return _real(self)

        monkeypatch.setattr(base.VAEModel, name, counted)
    return calls


@pytest.mark.parametrize("arch", list(ARCHS))
def test_choosing_the_paths_leaves_the_weights_as_they_are(arch):
    make, _ = ARCHS[arch]
    model = make()
    model.hold_weights(True)  # held channels-last, though an fp32 CPU pass runs contiguous
    held = _layout(model)
    fast = model.active_fast()
    assert model.fast.channels_last and not fast.channels_last
    assert _layout(model) == held
    assert all(is_channels_last(m.weight) for m in conv_modules(model))


@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_pass_relays_the_weights_once_where_it_starts(arch, relayouts, choices):
    make, channels = ARCHS[arch]
    model = make()
    z = torch.randn(1, channels, 4, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model.decode_latents(z, temporal_slice=1)  # the weights laid out as the pass reads them already
    assert relayouts == []  # none to move: the layout matched
    model.hold_weights(True)  # held channels-last, though an fp32 CPU pass runs contiguous
    moving = sum(not m.weight.is_contiguous() for m in conv_modules(model))  # a 1x1 conv's is both layouts
    assert moving
    relayouts.clear()
    choices.update(active_fast=0, start_pass=0)
    with torch.no_grad():
        got = model.decode_latents(z, temporal_slice=1)  # three slices
    assert relayouts == [moving]  # every channels-last weight moved, once, at the first slice
    assert choices == {"start_pass": 1, "active_fast": 3}  # the paths chosen once per step
    assert all(m.weight.is_contiguous() for m in conv_modules(model))
    assert torch.equal(got, want)
    with torch.no_grad():
        model.decode_latents(z, temporal_slice=1)
    assert relayouts == [moving]  # the next pass finds them laid out: nothing moves
