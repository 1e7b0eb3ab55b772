"""Placeholder until the tiling engine lands (issue 4)."""


def decode_tiled(vae, latents, **kwargs):
    raise NotImplementedError("tiled decode is not implemented yet")


def encode_tiled(vae, pixels, **kwargs):
    raise NotImplementedError("tiled encode is not implemented yet")
