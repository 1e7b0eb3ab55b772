"""Key names: original Wan / ComfyUI checkpoints <-> diffusers (our module layout), both directions.

The table of prefix pairs is generated from the config's block structure (not from regexes), so
the same code covers Wan 2.1/Qwen-Image (flat `downsamples.N`) and Wan 2.2 (nested
`downsamples.i.downsamples.j`). Keys that match no prefix pass through unchanged, so the strict
check reports them as unexpected instead of silently dropping them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable, Mapping, Optional, TypeVar

from .config import WanConfig

# ResBlock internals: original nn.Sequential indices <-> diffusers names.
RESBLOCK_SUFFIXES = (
    ("residual.0.", "norm1."),
    ("residual.2.", "conv1."),
    ("residual.3.", "norm2."),
    ("residual.6.", "conv2."),
    ("shortcut.", "conv_shortcut."),
)

# Signature keys used for detection.
ORIGINAL_SIGNATURE = "decoder.middle.0.residual.0.gamma"
DIFFUSERS_SIGNATURE = "decoder.mid_block.resnets.0.norm1.gamma"
ORIGINAL_WAN22_SIGNATURE = "decoder.upsamples.0.upsamples.0.residual.2.weight"
DIFFUSERS_WAN22_SIGNATURE = "decoder.up_blocks.0.upsampler.resample.1.weight"

# The convs that read and write pixels (encoder input, decoder output) in each key format: their
# channel counts are the image channels after patchify (RGB 3, RGBA 4; times patch² for Wan 2.2).
PIXEL_CONVS = {
    "original": ("encoder.conv1.weight", "decoder.head.2.weight"),
    "diffusers": ("encoder.conv_in.weight", "decoder.conv_out.weight"),
}


@lru_cache(maxsize=8)
def prefix_table(cfg: WanConfig) -> tuple[tuple[str, str, bool], ...]:
    """(original prefix, diffusers prefix, is_resblock) for every block of `cfg`."""
    rows: list[tuple[str, str, bool]] = [("conv1.", "quant_conv.", False), ("conv2.", "post_quant_conv.", False)]
    for part in ("encoder", "decoder"):
        rows += [
            (f"{part}.conv1.", f"{part}.conv_in.", False),
            (f"{part}.head.0.", f"{part}.norm_out.", False),
            (f"{part}.head.2.", f"{part}.conv_out.", False),
            (f"{part}.middle.0.", f"{part}.mid_block.resnets.0.", True),
            (f"{part}.middle.1.", f"{part}.mid_block.attentions.0.", False),
            (f"{part}.middle.2.", f"{part}.mid_block.resnets.1.", True),
        ]
    levels = len(cfg.dim_mult)
    nres = cfg.num_res_blocks
    if cfg.is_residual:
        for i in range(levels):
            for j in range(nres):
                rows.append((f"encoder.downsamples.{i}.downsamples.{j}.", f"encoder.down_blocks.{i}.resnets.{j}.", True))
            if i < levels - 1:
                rows.append((f"encoder.downsamples.{i}.downsamples.{nres}.", f"encoder.down_blocks.{i}.downsampler.",
                             False))
            for j in range(nres + 1):
                rows.append((f"decoder.upsamples.{i}.upsamples.{j}.", f"decoder.up_blocks.{i}.resnets.{j}.", True))
            if i < levels - 1:
                rows.append((f"decoder.upsamples.{i}.upsamples.{nres + 1}.", f"decoder.up_blocks.{i}.upsampler.",
                             False))
    else:
        n = 0
        for i in range(levels):
            for _ in range(nres):
                rows.append((f"encoder.downsamples.{n}.", f"encoder.down_blocks.{n}.", True))
                n += 1
            if i < levels - 1:
                rows.append((f"encoder.downsamples.{n}.", f"encoder.down_blocks.{n}.", False))
                n += 1
        n = 0
        for i in range(levels):
            for j in range(nres + 1):
                rows.append((f"decoder.upsamples.{n}.", f"decoder.up_blocks.{i}.resnets.{j}.", True))
                n += 1
            if i < levels - 1:
                rows.append((f"decoder.upsamples.{n}.", f"decoder.up_blocks.{i}.upsamplers.0.", False))
                n += 1
    # Longest prefix first so "x.1." never shadows "x.10.".
    return tuple(sorted(rows, key=lambda r: -len(r[0])))


def _convert_key(key: str, cfg: WanConfig, to_diffusers: bool) -> str:
    src, dst = (0, 1) if to_diffusers else (1, 0)
    rows = prefix_table(cfg)
    for row in sorted(rows, key=lambda r: -len(r[src])):
        prefix = row[src]
        if key.startswith(prefix):
            rest = key[len(prefix):]
            if row[2]:
                for pair in RESBLOCK_SUFFIXES:
                    if rest.startswith(pair[src]):
                        rest = pair[dst] + rest[len(pair[src]):]
                        break
            return row[dst] + rest
    return key


T = TypeVar("T")


def original_to_diffusers(sd: Mapping[str, T], cfg: WanConfig) -> dict[str, T]:
    """Original Wan / ComfyUI names -> diffusers names (values untouched)."""
    return {_convert_key(k, cfg, True): v for k, v in sd.items()}


def diffusers_to_original(sd: Mapping[str, T], cfg: WanConfig) -> dict[str, T]:
    """diffusers names -> original Wan / ComfyUI names (values untouched)."""
    return {_convert_key(k, cfg, False): v for k, v in sd.items()}


def key_format(keys: Iterable[str]) -> str:
    """'original', 'diffusers' or 'unknown' for a Wan-family key set."""
    ks = set(keys)
    if ORIGINAL_SIGNATURE in ks:
        return "original"
    if DIFFUSERS_SIGNATURE in ks:
        return "diffusers"
    return "unknown"


def is_wan22(keys: Iterable[str]) -> bool:
    """Wan 2.2 layout (nested residual-of-residual blocks) in either key format."""
    ks = set(keys)
    return ORIGINAL_WAN22_SIGNATURE in ks or DIFFUSERS_WAN22_SIGNATURE in ks


def pixel_conv_channels(sd: Mapping[str, object]) -> tuple[Optional[int], Optional[int]]:
    """(channels the encoder reads, channels the decoder writes) off the pixel convs' weights.

    None where the key is absent or its value is not a conv weight (the strict check then names it).
    """
    fmt = key_format(sd)
    if fmt == "unknown":
        return None, None
    enc_key, dec_key = PIXEL_CONVS[fmt]
    return _dim(sd.get(enc_key), 1), _dim(sd.get(dec_key), 0)


def _dim(weight: object, axis: int) -> Optional[int]:
    shape = getattr(weight, "shape", None)
    return int(shape[axis]) if shape is not None and len(shape) >= 2 else None
