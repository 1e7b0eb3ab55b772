"""Multi-GPU Decode / Encode nodes against the ComfyUI test doubles: same result as the exact tiled node,
per-step progress, Cancel stopping every device's band, and the one-device notice."""

from __future__ import annotations

import logging
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import node_helpers  # noqa: E402

node_helpers.use_comfy_stubs()

from turbovae import TurboVAE  # noqa: E402
from turbovae.nodes import all_nodes  # noqa: E402
from turbovae.nodes.comfy_vae import ComfyTurboVAE  # noqa: E402
from turbovae.nodes.parallel_nodes import TurboVAEMultiGPUDecode, TurboVAEMultiGPUEncode  # noqa: E402
from turbovae.nodes.tiled_nodes import TurboVAETiledDecode, TurboVAETiledEncode  # noqa: E402
from turbovae.nodes import comfy_vae as _cv, progress as _progress  # noqa: E402

mm, comfy = _cv.mm, _progress.comfy
node_helpers.hide_comfy_stubs()


@pytest.fixture
def vae():
    torch.manual_seed(0)
    model, _ = node_helpers.TINY_MODELS["seedvr2_tiny.safetensors"]()
    comfy.utils.PROGRESS_BAR_HOOK = None
    mm.interrupt_processing = False
    yield ComfyTurboVAE(TurboVAE(model))
    comfy.utils.PROGRESS_BAR_HOOK = None
    mm.interrupt_processing = False


def test_nodes_are_registered():
    ids = {n.GET_SCHEMA().node_id for n in all_nodes()}
    assert {"TurboVAEMultiGPUDecode", "TurboVAEMultiGPUEncode"} <= ids


def test_decode_and_encode_nodes_equal_the_exact_tiled_nodes_with_progress(vae):
    z = torch.randn(1, vae.latent_channels, 2, 7, 6, generator=torch.Generator().manual_seed(1))
    calls = []
    comfy.utils.PROGRESS_BAR_HOOK = lambda value, total, preview, node_id=None: calls.append((value, total))
    out = TurboVAEMultiGPUDecode.execute(samples={"samples": z}, vae=vae, devices="cpu,cpu", tile_size=64,
                                         temporal_slice=1).args[0]
    assert calls and calls[-1][0] == calls[-1][1]
    ref = TurboVAETiledDecode.execute(samples={"samples": z}, vae=vae, tile_size=64, overlap=0, temporal_slice=1,
                                      mode="exact").args[0]
    assert out.shape == ref.shape == (5, 56, 48, 3)
    assert (out - ref).abs().max().item() <= 1e-5
    lat = TurboVAEMultiGPUEncode.execute(pixels=out, vae=vae, devices="cpu,cpu,cpu", tile_size=64).args[0]
    lref = TurboVAETiledEncode.execute(pixels=out, vae=vae, tile_size=64, overlap=0, mode="exact").args[0]
    assert (lat["samples"] - lref["samples"]).abs().max().item() <= 1e-5


def test_cancel_stops_every_band_and_one_device_is_announced(vae, caplog):
    z = torch.randn(1, vae.latent_channels, 1, 7, 6)

    def hook(value, total, preview, node_id=None):
        mm.interrupt_current_processing(True)  # Cancel pressed after the first step

    comfy.utils.PROGRESS_BAR_HOOK = hook
    with pytest.raises(mm.InterruptProcessingException):
        TurboVAEMultiGPUDecode.execute(samples={"samples": z}, vae=vae, devices="cpu,cpu", tile_size=64)
    comfy.utils.PROGRESS_BAR_HOOK = None
    mm.interrupt_processing = False
    with caplog.at_level(logging.WARNING):
        out = TurboVAEMultiGPUDecode.execute(samples={"samples": z}, vae=vae, devices="cpu", tile_size=64).args[0]
    assert out.shape == (1, 56, 48, 3) and "only one device" in caplog.text


def test_bad_settings_are_clear_errors(vae):
    z = torch.randn(1, vae.latent_channels, 1, 7, 6)
    with pytest.raises(ValueError, match="torch devices|does not exist"):
        TurboVAEMultiGPUDecode.execute(samples={"samples": z}, vae=vae, devices="gpu0,gpu1")
    with pytest.raises(ValueError, match="too small"):
        TurboVAEMultiGPUDecode.execute(samples={"samples": z}, vae=vae, devices="cpu", tile_size=16)
    with pytest.raises(ValueError, match="TurboVAE Loader"):
        TurboVAEMultiGPUDecode.execute(samples={"samples": z}, vae=object(), devices="cpu")
