"""Multi-GPU Decode / Encode: the exact pass with the frame split into row bands over several GPUs of this
ComfyUI process (turbovae.decode_parallel / encode_parallel, `devices=` mode), with the same per-step
progress bar and Cancel as the tiled nodes. With one GPU it says so and runs on that one."""

from __future__ import annotations

import logging

from comfy_api.latest import io

from ..vae.input_rules import PassShape, TilingArgs
from ..vae.parallel import decode_parallel_checked, encode_parallel_checked, parse_devices
from .comfy_vae import is_turbovae
from .progress import progress_callback, running_node_id
from .schema import node_schema, pass_inputs, pass_output, temporal_slice_input, tile_size_input
from .tiled_nodes import MIN_TILE, node_tiling

log = logging.getLogger(__name__)

DEVICES_HELP = ('"all" = every visible GPU, or a comma list such as "cuda:0,cuda:1". Each device decodes a '
                'band of rows; the result equals the single-GPU exact tiled pass.')
LOADER_VAE_HELP = "A VAE from the TurboVAE Loader."


def _inputs(default_tile: int) -> list:
    return [
        io.String.Input("devices", default="all", tooltip=DEVICES_HELP),
        tile_size_input(default_tile, "Tile side in pixels of the single-GPU exact pass whose memory the GPUs "
                                      "share: each GPU's tiles hold 1/N of its area, so each needs about 1/N of one "
                                      "GPU's memory. 0 = sized from each GPU's budget by its band's predicted peak. "
                                      f"Minimum {MIN_TILE}."),
        temporal_slice_input("choose from free memory"),
    ]


def _prepare(vae, devices: str, tile_size: int, temporal_slice: int) -> tuple[list, TilingArgs]:
    """The devices and the settings as checked tiling arguments (vae/input_rules.py, once, as the tiled nodes check
    theirs)."""
    if not is_turbovae(vae):
        raise ValueError("Multi-GPU decode/encode needs a VAE from the TurboVAE Loader (it splits our exact pass "
                         "across GPUs); use Optimized Tiled Decode/Encode for other VAEs")
    tiling = node_tiling(tile_size, None, temporal_slice, "exact")
    devs = parse_devices(devices)
    if len(devs) == 1:
        log.warning("TurboVAE Multi-GPU: only one device (%s) available or listed; running on it alone", devs[0])
    return devs, tiling


class TurboVAEMultiGPUDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return node_schema("TurboVAEMultiGPUDecode", "Multi-GPU Decode (TurboVAE)",
            pass_inputs(True, "", LOADER_VAE_HELP, _inputs(512)),
            [pass_output(True, "Decoded frames, [frames, height, width, 3] in 0..1.")], reports_progress=True,
            description="Exact decode with the frame split into row bands, one per GPU (halo rows and norm statistics "
                        "exchanged between GPUs). Cancel stops all GPUs at the next step.")

    @classmethod
    def execute(cls, samples: dict, vae, devices: str = "all", tile_size: int = 512,
                temporal_slice: int = 0) -> io.NodeOutput:
        devs, tiling = _prepare(vae, devices, tile_size, temporal_slice)
        z = vae.latents_for_pass(samples["samples"])  # checked once
        vae.load_for_parallel(PassShape.of(z, decode=True), tiling)
        out = decode_parallel_checked(vae.turbo, z, tiling=tiling, devices=devs,
                                      progress=progress_callback(running_node_id(cls)), output_device=vae.output_device)
        images = vae.clip_to_image(out, samples["samples"].ndim == 4)
        if images.ndim == 5:  # [B, T, H, W, C] -> frames as the batch, as core VAEDecode does
            images = images.reshape(-1, *images.shape[-3:])
        return io.NodeOutput(images)


class TurboVAEMultiGPUEncode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return node_schema("TurboVAEMultiGPUEncode", "Multi-GPU Encode (TurboVAE)",
            pass_inputs(False, "Frames to encode, [frames, height, width, 3] in 0..1; height and width are "
                               "centre-cropped to multiples of 8.", LOADER_VAE_HELP, _inputs(1024)),
            [pass_output(False)], reports_progress=True,
            description="Exact encode with the frame split into row bands, one per GPU. For video VAEs the batch is "
                        "one clip (padded to 4n+1 frames by repeating the last frame).")

    @classmethod
    def execute(cls, pixels, vae, devices: str = "all", tile_size: int = 1024,
                temporal_slice: int = 0) -> io.NodeOutput:
        devs, tiling = _prepare(vae, devices, tile_size, temporal_slice)
        x = vae.turbo.pad_frames(vae.turbo.check_pixels(vae.clip_for_pass(pixels)))  # checked once
        vae.load_for_parallel(PassShape.of(x, decode=False), tiling)
        latents = encode_parallel_checked(vae.turbo, x, tiling=tiling, devices=devs,
                                          progress=progress_callback(running_node_id(cls)),
                                          output_device=vae.output_device)
        return io.NodeOutput({"samples": vae.to_comfy_latents(latents.float())})


PARALLEL_NODES = [TurboVAEMultiGPUDecode, TurboVAEMultiGPUEncode]
