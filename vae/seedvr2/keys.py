"""The checkpoint's key -> shape table, derived from a config (250 tensors for the shipped one).

Written from the key grammar of the released file rather than read off our module tree, so a test
can compare the two independently.
"""

from __future__ import annotations

from .config import SeedVR2Config

SIGNATURE_KEY = "decoder.up_blocks.2.upsamplers.0.upscale_conv.weight"
# `upscale_conv` (the sub-pixel temporal/spatial upsampler) exists only in SeedVR2's decoder; third-party
# loaders use the up_blocks.2 key to recognise SeedVR2 files.
SIGNATURE_KEYS = (SIGNATURE_KEY, "decoder.up_blocks.0.upsamplers.0.upscale_conv.weight")


def _conv(prefix: str, cout: int, cin: int, k: tuple[int, int, int]) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.weight": (cout, cin, *k), f"{prefix}.bias": (cout,)}


def _norm(prefix: str, c: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.weight": (c,), f"{prefix}.bias": (c,)}


def _resnet(prefix: str, cin: int, cout: int) -> dict[str, tuple[int, ...]]:
    out = {**_norm(f"{prefix}.norm1", cin), **_conv(f"{prefix}.conv1", cout, cin, (3, 3, 3)),
           **_norm(f"{prefix}.norm2", cout), **_conv(f"{prefix}.conv2", cout, cout, (3, 3, 3))}
    if cin != cout:
        out.update(_conv(f"{prefix}.conv_shortcut", cout, cin, (1, 1, 1)))
    return out


def _mid(prefix: str, c: int) -> dict[str, tuple[int, ...]]:
    out = {**_resnet(f"{prefix}.resnets.0", c, c), **_norm(f"{prefix}.attentions.0.group_norm", c)}
    for name in ("to_q", "to_k", "to_v", "to_out.0"):
        out[f"{prefix}.attentions.0.{name}.weight"] = (c, c)
        out[f"{prefix}.attentions.0.{name}.bias"] = (c,)
    out.update(_resnet(f"{prefix}.resnets.1", c, c))
    return out


def expected_shapes(config: SeedVR2Config = SeedVR2Config()) -> dict[str, tuple[int, ...]]:
    """Every tensor of a SeedVR2 VAE state dict and its shape."""
    ch = config.block_out_channels
    n = config.num_blocks
    shapes: dict[str, tuple[int, ...]] = {}
    # encoder
    shapes.update(_conv("encoder.conv_in", ch[0], config.in_channels, (3, 3, 3)))
    cin = ch[0]
    for i, cout in enumerate(ch):
        for j in range(config.layers_per_block):
            shapes.update(_resnet(f"encoder.down_blocks.{i}.resnets.{j}", cin if j == 0 else cout, cout))
        if i < n - 1:
            kt = 3 if config.encoder_temporal_down(i) else 1
            shapes.update(_conv(f"encoder.down_blocks.{i}.downsamplers.0.conv", cout, cout, (kt, 3, 3)))
        cin = cout
    shapes.update(_mid("encoder.mid_block", ch[-1]))
    shapes.update(_norm("encoder.conv_norm_out", ch[-1]))
    shapes.update(_conv("encoder.conv_out", 2 * config.latent_channels, ch[-1], (3, 3, 3)))
    # decoder
    rev = tuple(reversed(ch))
    shapes.update(_conv("decoder.conv_in", rev[0], config.latent_channels, (3, 3, 3)))
    shapes.update(_mid("decoder.mid_block", rev[0]))
    cin = rev[0]
    for i, cout in enumerate(rev):
        for j in range(config.layers_per_block + 1):
            shapes.update(_resnet(f"decoder.up_blocks.{i}.resnets.{j}", cin if j == 0 else cout, cout))
        if i < n - 1:
            ratio = 4 * (2 if config.decoder_temporal_up(i) else 1)
            shapes.update(_conv(f"decoder.up_blocks.{i}.upsamplers.0.upscale_conv", cout * ratio, cout, (1, 1, 1)))
            shapes.update(_conv(f"decoder.up_blocks.{i}.upsamplers.0.conv", cout, cout, (3, 3, 3)))
        cin = cout
    shapes.update(_norm("decoder.conv_norm_out", ch[0]))
    shapes.update(_conv("decoder.conv_out", config.out_channels, ch[0], (3, 3, 3)))
    return shapes
