"""Optimized Tiled Decode / Encode: our tiling engine with UI progress and cancel between tiles.

Any VAE works: a TurboVAE VAE uses our tiler; a core VAE falls back to its own `decode_tiled` /
`encode_tiled` with the settings converted the way core VAEDecodeTiled / VAEEncodeTiled convert them.
"""

from __future__ import annotations

from typing import Optional

from comfy_api.latest import io

from ..vae.input_rules import MIN_TILE_LATENT, TilingArgs, tiling_args
from ..vae.input_rules import MODES as TILE_MODES
from .choices import TILE_MODE_HELP, choice_error, first_error
from .comfy_vae import is_turbovae
from .progress import running_node_id
from .schema import combo, node_schema, pass_inputs, pass_output, temporal_slice_input, tile_size_input

MIN_TILE = 64  # pixels: the tiling engine's floor of 8 latents at 8x (128 px for Wan 2.2's 16x)


def _tile_inputs(what: str, default_tile: int) -> list:
    return [
        tile_size_input(default_tile, f"Tile side in pixels for {what}; 0 = the largest whose predicted peak fits "
                                      f"ComfyUI's free memory. Smaller tiles use less memory and run slower. "
                                      f"Minimum {MIN_TILE} px ({2 * MIN_TILE} px for Wan 2.2)."),
        io.Int.Input("overlap", default=64, min=0, max=1024, step=8,
                     tooltip="Overlap between neighbouring tiles in pixels (fast mode blends across it; "
                             "exact mode uses it as extra context)."),
        temporal_slice_input("the largest whose predicted peak fits"),
        combo("mode", TILE_MODES, TILE_MODE_HELP, default="auto"),
    ]


def _vae_help(what: str) -> str:
    return f"Any VAE; TurboVAE VAEs use the optimized tiler, others their own tiled {what}."


def _validate_mode(cls, mode: str = "auto") -> bool | str:
    return first_error(choice_error("mode", mode, TILE_MODES))


def _min_tile(vae) -> int:
    """The tiler's floor for this VAE in pixels (8 latents × its spatial factor); core VAEs: MIN_TILE."""
    return MIN_TILE_LATENT * vae.turbo.spatial_factor if is_turbovae(vae) else MIN_TILE


def node_tiling(tile_size: int, overlap: Optional[int], temporal_slice: int, mode: str,
                min_tile: int = MIN_TILE) -> TilingArgs:
    """A node's settings as checked tiling arguments (vae/input_rules.py, once; named as the widgets are): tile_size
    0 = sized from the memory budget, overlap None = the default, temporal_slice 0 = chosen (the tiled and the
    multi-GPU nodes)."""
    if temporal_slice < 0:
        raise ValueError(f"temporal_slice={temporal_slice} must be 0 (automatic) or more")
    return tiling_args(mode, tile_size, overlap, temporal_slice or None, spatial_factor=min_tile // MIN_TILE_LATENT,
                       min_tile_px=min_tile, names=("tile_size", "overlap"))


class TurboVAETiledDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return node_schema("TurboVAETiledDecode", "Optimized Tiled Decode (TurboVAE)",
            pass_inputs(True, "", _vae_help("decode"),
                        _tile_inputs("decoding (decode needs far more memory than encode)", 512)),
            [pass_output(True, "Decoded frames, [frames, height, width, channels] in 0..1 (RGB; RGBA from the "
                               "Qwen-Image-Layered VAE).")],
            reports_progress=True,
            description="Decodes latents tile by tile with per-tile progress; Cancel stops between tiles. Video "
                        "latents give all frames as an IMAGE batch.")

    validate_inputs = classmethod(_validate_mode)

    @classmethod
    def execute(cls, samples: dict, vae, tile_size: int = 512, overlap: int = 64, temporal_slice: int = 0,
                mode: str = "auto") -> io.NodeOutput:
        tiling = node_tiling(tile_size, overlap, temporal_slice, mode, _min_tile(vae))
        z = samples["samples"]
        if is_turbovae(vae):
            images = vae.decode_tiled_px(z, tiling, node_id=running_node_id(cls))
        else:
            images = _core_decode_tiled(vae, z, tiling.tile_px or 512, tiling.overlap_px, tiling.temporal_slice)
        if images.ndim == 5:  # [B, T, H, W, C] -> frames as the batch, as core VAEDecode does
            images = images.reshape(-1, *images.shape[-3:])
        return io.NodeOutput(images, ui=_report_text(vae))


class TurboVAETiledEncode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return node_schema("TurboVAETiledEncode", "Optimized Tiled Encode (TurboVAE)",
            pass_inputs(False, "Frames to encode, [frames, height, width, channels] in 0..1; height and width are "
                               "centre-cropped to multiples of 8, channels fitted to the VAE's (an RGBA VAE given "
                               "RGB gets an opaque alpha).", _vae_help("encode"), _tile_inputs("encoding", 1024)),
            [pass_output(False)], reports_progress=True,
            description="Encodes an IMAGE batch tile by tile with per-tile progress; Cancel stops between tiles. For "
                        "video VAEs the batch is one clip (padded to 4n+1 frames by repeating the last frame; no "
                        "frame is dropped).")

    validate_inputs = classmethod(_validate_mode)

    @classmethod
    def execute(cls, pixels, vae, tile_size: int = 1024, overlap: int = 64, temporal_slice: int = 0,
                mode: str = "auto") -> io.NodeOutput:
        tiling = node_tiling(tile_size, overlap, temporal_slice, mode, _min_tile(vae))
        tile_px, overlap, slice_ = tiling.tile_px, tiling.overlap_px, tiling.temporal_slice
        if is_turbovae(vae):
            latents = vae.encode_tiled_px(pixels, tiling, node_id=running_node_id(cls))
        else:
            frames = slice_ * 4 if slice_ else None
            channels = getattr(vae, "output_channels", 3)  # core's name for a VAE's image channels
            latents = vae.encode_tiled(pixels[..., :channels], tile_x=tile_px or 512, tile_y=tile_px or 512,
                                       overlap=overlap,
                                       tile_t=frames, overlap_t=8 if frames else None)
        return io.NodeOutput({"samples": latents}, ui=_report_text(vae))


def _report_text(vae) -> Optional[dict]:
    """The pass's report line as the node's UI text output (in the prompt history and the executed
    message; the log has it too)."""
    report = getattr(vae, "last_report", None) if is_turbovae(vae) else None
    return {"text": [report.line()]} if report is not None else None


def _core_decode_tiled(vae, z, tile_px: int, overlap_px: int, slice_: Optional[int]):
    """Core VAEDecodeTiled's unit conversion (pixels -> latent units) for a VAE that is not ours."""
    f = vae.spacial_compression_decode()
    tc = vae.temporal_compression_decode()
    tile_t = overlap_t = None
    if tc is not None:
        tile_t = max(2, slice_) if slice_ else max(2, 64 // tc)
        overlap_t = max(1, min(tile_t // 2, 8 // tc))
    return vae.decode_tiled(z, tile_x=tile_px // f, tile_y=tile_px // f, overlap=overlap_px // f,
                            tile_t=tile_t, overlap_t=overlap_t)


TILED_NODES = [TurboVAETiledDecode, TurboVAETiledEncode]
