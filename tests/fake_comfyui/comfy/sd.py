"""Stand-in for core's `comfy.sd.VAE` (see ../README.md): core's interface, TurboVAE's model behind it."""

import torch

import comfy.cli_args
import comfy.features
import utils  # noqa: F401  (a real tree's modules import their siblings by top-level name too)

CPU_FLAG_AT_IMPORT = comfy.cli_args.args.cpu


def _wan(sd):
    from turbovae.vae.wan import TINY_WAN21, TINY_WAN22, WAN21, WAN22, build, expected_shapes
    from turbovae.vae.wan.keys import original_to_diffusers

    for cfg in (WAN21, WAN22) + ((TINY_WAN21, TINY_WAN22) if comfy.features.TINY_CONFIGS else ()):
        converted = original_to_diffusers(sd, cfg)
        if {k: tuple(v.shape) for k, v in converted.items()} == expected_shapes(cfg):
            return build(converted, config=cfg, source="fake core"), 1.0
    raise RuntimeError("Error(s) in loading state_dict for WanVAE: size mismatch (fake core)")


def _is_seedvr2(sd):
    from turbovae.vae.seedvr2 import detect

    return detect(sd)


def _seedvr2(sd):
    from turbovae.vae.seedvr2 import SeedVR2Config, build, expected_shapes

    for cfg in (SeedVR2Config(),) + ((SeedVR2Config.tiny(),) if comfy.features.TINY_CONFIGS else ()):
        if {k: tuple(v.shape) for k, v in sd.items()} == expected_shapes(cfg):
            return build(sd, config=cfg, source="fake core"), cfg.scaling_factor
    raise RuntimeError("Error(s) in loading state_dict for VideoAutoencoderKL: size mismatch (fake core)")


class VAE:
    def __init__(self, sd=None, device=None, config=None, dtype=None, metadata=None):
        if "decoder.middle.0.residual.0.gamma" in sd:
            model, self.scale = _wan(sd)
        elif comfy.features.KNOWS_SEEDVR2 and _is_seedvr2(sd):
            model, self.scale = _seedvr2(sd)
        else:
            model, self.scale = None, 1.0
        self.first_stage_model = None if model is None else model.to(device=device, dtype=dtype)
        self.latent_channels = None if model is None else model.latent_format.channels

    def decode(self, samples_in):
        out = self.first_stage_model.decode_latents(samples_in / self.scale).clamp(-1, 1)
        return ((out + 1) / 2).movedim(1, -1)

    def encode(self, pixel_samples):
        x = (pixel_samples * 2 - 1).movedim(-1, 0).unsqueeze(0)
        return self.first_stage_model.encode_moments(x)[:, :self.latent_channels] * self.scale
