"""A tiny VAEModel for engine tests: convs, GroupNorm, nearest 2x upsampling and one global attention
at latent resolution (so padded buckets are measurably not exact, as with the real VAEs).

Registered as architecture "toy engine VAE" so engine folders can fall back to its checkpoint.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from turbovae.vae.base import LatentFormat, VAEModel
from turbovae.vae.accel.switches import FastPaths
from turbovae.vae.checkpoint import Architecture, register_architecture
from turbovae.vae.registry import BenchCases, Family, Workload

MARKER = "toy_engine_vae.marker"


class _Attn(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.norm = nn.GroupNorm(2, c)
        self.qkv = nn.Conv2d(c, 3 * c, 1)
        self.proj = nn.Conv2d(c, c, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).flatten(2).transpose(1, 2).chunk(3, dim=-1)
        a = torch.softmax(q @ k.transpose(1, 2) / c**0.5, dim=-1) @ v
        return x + self.proj(a.transpose(1, 2).reshape(b, c, h, w))


class ToyEncoder(nn.Module):
    def __init__(self, c=8, z=4):
        super().__init__()
        self.conv_in = nn.Conv2d(3, c, 3, padding=1)
        self.norm = nn.GroupNorm(2, c)
        self.down = nn.ModuleList(nn.Conv2d(c, c, 3, stride=2, padding=1) for _ in range(3))
        self.attn = _Attn(c)
        self.conv_out = nn.Conv2d(c, 2 * z, 3, padding=1)

    def forward(self, x):
        x = F.silu(self.norm(self.conv_in(x)))
        for d in self.down:
            x = F.silu(d(x))
        return self.conv_out(self.attn(x))


class ToyDecoder(nn.Module):
    def __init__(self, c=8, z=4):
        super().__init__()
        self.conv_in = nn.Conv2d(z, c, 3, padding=1)
        self.attn = _Attn(c)
        self.up = nn.ModuleList(nn.Conv2d(c, c, 3, padding=1) for _ in range(3))
        self.norm = nn.GroupNorm(2, c)
        self.conv_out = nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, z):
        x = self.attn(self.conv_in(z))
        for u in self.up:
            x = F.silu(u(F.interpolate(x, scale_factor=2.0, mode="nearest")))
        return self.conv_out(F.silu(self.norm(x))).clamp(-1, 1)


class ToyVAE(VAEModel):
    """Frames are independent (no causal cache): enough for engine tests, which run T = 1."""

    kind = "toy"
    latent_format = LatentFormat(channels=4, spatial_factor=8, temporal_factor=4)
    fast = FastPaths.plain()  # no switchable paths
    fast_fields = ()

    def __init__(self):
        super().__init__()
        self.encoder = ToyEncoder()
        self.decoder = ToyDecoder()
        self.register_buffer("marker", torch.zeros(1))

    def _per_frame(self, fn, x):
        b, c, t, h, w = x.shape
        y = fn(x.transpose(1, 2).reshape(b * t, c, h, w))
        return y.reshape(b, t, *y.shape[1:]).transpose(1, 2)

    def encode_step(self, pixels, state=None, *, collect=True):
        """Keeps every 4th frame (frame 0 of the clip, then the last of each group of 4); no memory."""
        return self._per_frame(self.encoder, pixels[:, :, ::4] if state is None else pixels[:, :, 3::4]), ()

    def decode_step(self, latents, state=None, *, collect=True, clamp=True):
        """Each latent frame becomes 4 pixel frames, the clip's first one 1; no memory."""
        out = self._per_frame(self.decoder, latents)
        if state is None:
            return torch.cat([out[:, :, :1], out[:, :, 1:].repeat_interleave(4, dim=2)], dim=2), ()
        return out.repeat_interleave(4, dim=2), ()

    def meta_copy(self):
        with torch.device("meta"):
            return ToyVAE()

    def image_encoder(self):
        return self.encoder

    def image_decoder(self):
        return self.decoder


def _build(sd, config=None, source=None):
    m = ToyVAE()
    m.load_state_dict({("marker" if k == MARKER else k): v for k, v in sd.items()}, strict=True)
    return m


# Registered on import (engine tests load toy checkpoints); the family entry below is registered only by the test
# that checks a family is one entry (tests/test_family_registry.py), so the doctor and the benchmark never see it otherwise.
TOY_ARCHITECTURE = Architecture("toy engine VAE", lambda sd: MARKER in sd, _build, 100)
register_architecture(TOY_ARCHITECTURE)

TOY_FAMILY = Family(
    key="toy", title="Toy engine VAE", files="toy.safetensors", build_model=lambda cfg: ToyVAE(),
    real=lambda: None, tiny=lambda: None, architectures=(TOY_ARCHITECTURE,), kinds=("toy",),
    bench=BenchCases(quick=(Workload("Toy image decode 64² (tiny config)", "decode", 1, 64, 64),)),
)


def save_toy_checkpoint(path, seed: int = 0) -> ToyVAE:
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    m = ToyVAE().eval()
    sd = {(MARKER if k == "marker" else k): v.contiguous() for k, v in m.state_dict().items()}
    save_file(sd, str(path))
    return m


def toy_checkpoint(root):
    """A toy checkpoint in `root` and the TurboVAE loaded from it (CPU, fp32): what engine tests build from."""
    import turbovae

    ckpt = root / "toy.safetensors"
    save_toy_checkpoint(ckpt)
    return ckpt, turbovae.load_vae(ckpt, device="cpu")


def edit_manifest(folder, file: str, *, drop: bool = False, **changes) -> dict:
    """Edit (or drop) one engine's identity in a folder's manifest, as a user or an attacker might."""
    import json
    from pathlib import Path

    path = Path(folder) / "manifest.json"
    data = json.loads(path.read_text())
    if drop:
        data["engines"] = [e for e in data["engines"] if e["file"] != file]
    for entry in data["engines"]:
        if entry["file"] == file:
            entry["identity"].update(changes)
    path.write_text(json.dumps(data))
    return data


def manifest_identity(folder, file: str):
    from turbovae.trt.manifest import read_manifest

    manifest, _ = read_manifest(folder)
    return next(e.identity for e in manifest.entries if e.file == file)


def export_only():
    """AOTIBackend with the Inductor compile replaced by a plain ExportedProgram save/load: everything but
    the minutes-long C++ compile is the production path (export, files, manifest, routing, checks)."""
    import contextlib

    import pytest

    from turbovae.trt.aoti import AOTIBackend

    @contextlib.contextmanager
    def patched():
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(AOTIBackend, "compile_package", lambda self, program, f: torch.export.save(program, f))
            mp.setattr(AOTIBackend, "load_runner", lambda self, path: torch.export.load(str(path)).module())
            yield

    return patched()
