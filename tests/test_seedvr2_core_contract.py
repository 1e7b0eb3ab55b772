"""Core's native SeedVR2 pipeline as a test double, fed the VAE from our loader (CI: no ComfyUI).

What the double states, read from core's `comfy/sd.py` (VAE with a SeedVR2 state dict), `comfy/ldm/seedvr/vae.py`
and `comfy_extras/nodes_seedvr.py` (the merged SeedVR2 line, PR #14424):
- an IMAGE batch [N, H, W, C] is one clip, a video IMAGE [B, T, H, W, C] (Pre-Process SeedVR2 Input's output)
  is B clips; pixels go in as x * 2 - 1;
- the LATENT is the encoder's posterior mean times the scaling factor 0.9152, as [B, 16, T', h, w]; decode
  divides by the factor and returns (x + 1) / 2 clamped, as [B, T, H, W, C];
- Apply SeedVR2 Conditioning wants that 5-D channel-first 16-channel latent and appends a ones mask channel;
  Split / Merge SeedVR2 Latents slice and concatenate it along T.
The network under the double is tests/seedvr2_reference.py (written from the spec, no shared code with
ours). The real nodes in a real ComfyUI tree are exercised by tests/test_core_seedvr2_nodes.py.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

import node_helpers  # noqa: E402

node_helpers.use_comfy_stubs()

from turbovae import load_vae  # noqa: E402
from turbovae.nodes import loader_nodes  # noqa: E402
from turbovae.nodes.comfy_vae import ComfyTurboVAE  # noqa: E402
from turbovae.nodes.loader_nodes import TurboVAELoader  # noqa: E402
from turbovae.nodes import paths as _paths  # noqa: E402

folder_paths = _paths.folder_paths
node_helpers.hide_comfy_stubs()

from safetensors.torch import load_file  # noqa: E402
from seedvr2_reference import ReferenceSeedVR2  # noqa: E402

CORE_SEEDVR2_SCALING_FACTOR = 0.9152  # core: BYTEDANCE_VAE_SCALING_FACTOR (comfy/ldm/seedvr/constants.py)
CORE_SEEDVR2_LATENT_CHANNELS = 16
SEEDVR2 = "seedvr2_tiny.safetensors"
QWEN = "qwen_image_tiny.safetensors"


class CoreSeedVR2VAEDouble:
    """What `comfy.sd.VAE` does around core's SeedVR2 model, over the independent reference network."""

    def __init__(self, reference: ReferenceSeedVR2):
        self.reference = reference

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        clips = pixels if pixels.ndim == 5 else pixels.unsqueeze(0)
        moments = self.reference.encode(clips.movedim(-1, 1) * 2.0 - 1.0)
        return moments[:, :CORE_SEEDVR2_LATENT_CHANNELS] * CORE_SEEDVR2_SCALING_FACTOR

    def decode(self, samples: torch.Tensor) -> torch.Tensor:
        pixels = self.reference.decode(samples / CORE_SEEDVR2_SCALING_FACTOR)
        return ((pixels + 1.0) / 2.0).clamp(0.0, 1.0).movedim(1, -1)


def core_seedvr2_condition(samples: torch.Tensor) -> torch.Tensor:
    """Apply SeedVR2 Conditioning's latent handling: refuse anything but [B, 16, T, h, w], add the mask."""
    if samples.ndim != 5 or samples.shape[1] != CORE_SEEDVR2_LATENT_CHANNELS:
        raise ValueError(f"SeedVR2Conditioning refuses latents of shape {tuple(samples.shape)}")
    return torch.cat([samples, samples.new_ones(samples[:, :1].shape)], dim=1)


@pytest.fixture(scope="module")
def model_root(tmp_path_factory):
    base = tmp_path_factory.mktemp("comfy")
    vae_dir = base / "models" / "vae"
    vae_dir.mkdir(parents=True)
    configs, paths = {}, {}
    for name in (SEEDVR2, QWEN):
        paths[name], configs[name] = node_helpers.write_tiny_vae(vae_dir, name)
    return base, configs, paths


@pytest.fixture(autouse=True)
def _registry(model_root, monkeypatch):
    base, configs, _paths_ = model_root
    folder_paths.reset(str(base))

    # The only seam (as in test_nodes.py): the loader is handed the tiny config that matches the file.
    def load_tiny(path, **kw):
        return load_vae(path, config=configs.get(Path(path).name), **kw)

    monkeypatch.setattr(loader_nodes, "load_vae", load_tiny)


@functools.lru_cache(maxsize=None)
def _ours(name: str) -> ComfyTurboVAE:
    return TurboVAELoader.execute(vae_name=name, dtype="fp32").args[0]


@pytest.fixture
def core(model_root) -> CoreSeedVR2VAEDouble:
    _base, configs, paths = model_root
    return CoreSeedVR2VAEDouble(ReferenceSeedVR2(load_file(str(paths[SEEDVR2])), configs[SEEDVR2].norm_groups))


def _video(seed: int = 0, clips: int = 1, frames: int = 5, height: int = 32, width: int = 40) -> torch.Tensor:
    return torch.rand(clips, frames, height, width, 3, generator=torch.Generator().manual_seed(seed))


def test_encode_gives_core_latents_for_a_video_image_and_for_a_frame_batch(core):
    ours, video = _ours(SEEDVR2), _video(clips=2)
    latents = ours.encode(video)  # core VAE Encode after Pre-Process SeedVR2 Input: B clips
    assert latents.shape == (2, CORE_SEEDVR2_LATENT_CHANNELS, 2, 4, 5)
    torch.testing.assert_close(latents, core.encode(video), atol=1e-4, rtol=0)
    frames = video[0]  # an IMAGE batch [N, H, W, C] is one clip
    torch.testing.assert_close(ours.encode(frames), core.encode(frames), atol=1e-4, rtol=0)


def test_decode_of_core_latents_gives_core_frames(core):
    ours = _ours(SEEDVR2)
    latents = core.encode(_video(seed=1))
    frames = ours.decode(latents)  # core VAE Decode then reshapes [B, T, H, W, C] to frames
    assert frames.shape == (1, 5, 32, 40, 3)
    torch.testing.assert_close(frames, core.decode(latents), atol=1e-4, rtol=0)


def test_tiled_contract_and_the_seedvr2_tiling_option_give_the_untiled_result(core):
    """Core's tiled nodes (sizes in latents for decode, pixels for encode) and core's SeedVR2 decode option
    `seedvr2_tiling` (pixels): ours tiles exactly, so each equals core's untiled pass."""
    ours, video = _ours(SEEDVR2), _video(seed=2, height=80, width=136)  # several 64 px tiles (core's minimum)
    latents = core.encode(video)
    want = core.decode(latents)
    torch.testing.assert_close(ours.decode_tiled(latents, tile_x=8, tile_y=8, overlap=2, tile_t=2, overlap_t=1),
                               want, atol=1e-4, rtol=0)
    option = {"seedvr2_tiling": {"enable_tiling": True, "tile_size": (32, 32), "tile_overlap": (8, 8)}}
    torch.testing.assert_close(ours.decode(latents, vae_options=option), want, atol=1e-4, rtol=0)
    torch.testing.assert_close(ours.encode_tiled(video, tile_x=64, tile_y=64, overlap=16, tile_t=8, overlap_t=4),
                               latents, atol=1e-4, rtol=0)


def test_latents_flow_through_the_split_conditioning_and_merge_nodes(core):
    ours = _ours(SEEDVR2)
    latents = ours.encode(_video(seed=3, frames=9))  # 9 frames -> 3 latent frames
    chunks = [latents[:, :, 0:2], latents[:, :, 1:3]]  # Split SeedVR2 Latent: 5-frame chunks, overlap 1
    for chunk in chunks:
        assert core_seedvr2_condition(chunk).shape == (1, CORE_SEEDVR2_LATENT_CHANNELS + 1, 2, 4, 5)
    merged = torch.cat([chunks[0], chunks[1][:, :, 1:]], dim=2)  # Merge with the overlap frame kept once
    torch.testing.assert_close(ours.decode(merged), core.decode(merged), atol=1e-4, rtol=0)


def test_wan_and_qwen_latents_stay_raw_as_cores_are():
    """Core scales only SeedVR2 latents inside its VAE; its Wan/Qwen-Image VAE returns raw latents."""
    ours = _ours(QWEN)
    frames = _video(seed=4)[0]
    raw = ours.turbo.encode(frames.movedim(-1, 0).unsqueeze(0) * 2 - 1)
    torch.testing.assert_close(ours.encode(frames), raw, atol=1e-6, rtol=0)
    assert _ours(SEEDVR2).to_comfy_latents(torch.ones(1)).item() == pytest.approx(CORE_SEEDVR2_SCALING_FACTOR)
