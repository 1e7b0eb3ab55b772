"""Core's native SeedVR2 nodes fed our VAE and core's VAE, inside a real ComfyUI (run by
tests/test_core_seedvr2_nodes.py with ComfyUI's interpreter; not collected by pytest itself).

    python tests/comfy_seedvr2_nodes_check.py COMFYUI_TREE VAE_FILE  ->  one JSON object on stdout

Both VAEs load the same file through their own loader nodes (core's VAELoader, our TurboVAELoader at fp32),
and the same frames go through the pipeline core's SeedVR2 upscale workflow uses: Pre-Process SeedVR2 Input
-> VAE Encode -> Split SeedVR2 Latent -> Apply SeedVR2 Conditioning -> Merge SeedVR2 Latents -> VAE Decode
-> Post-Process SeedVR2 Output, plus VAE Encode/Decode (Tiled) and core's `seedvr2_tiling` decode option.
The sampler between Split and Merge needs the DiT a user supplies; the latents stand in for its output (the
nodes around it only see a LATENT). The JSON holds, per stage, the max abs difference between the two VAEs
(and the shapes), so the pytest side asserts on numbers the run measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace


def _node_out(result):
    """The first output of a V3 node's execute (NodeOutput) or a V1 node's tuple."""
    values = getattr(result, "result", result)
    return values[0] if len(values) == 1 else values


def main(tree: str, vae_file: str) -> dict:
    sys.argv = [sys.argv[0], "--cpu"]
    sys.path.insert(0, tree)
    import comfy.options
    comfy.options.enable_args_parsing()
    import torch
    import folder_paths
    import nodes
    from comfy_extras import nodes_seedvr as core_seedvr
    from turbovae.nodes.loader_nodes import TurboVAELoader

    vae_path = Path(vae_file)
    folder_paths.add_model_folder_path("vae", str(vae_path.parent), is_default=True)
    core_vae = nodes.VAELoader().load_vae(vae_path.name)[0]
    ours = _node_out(TurboVAELoader.execute(vae_name=vae_path.name, dtype="fp32"))
    report = {"core_vae": f"{type(core_vae.first_stage_model).__module__}.{type(core_vae.first_stage_model).__name__}",
              "core_vae_dtype": str(core_vae.vae_dtype), "ours": type(ours).__name__}

    def diff(a, b):
        return float((a.detach().float() - b.detach().float()).abs().max())

    gen = torch.Generator().manual_seed(0)
    frames = torch.rand(9, 72, 88, 3, generator=gen)  # a 9-frame clip, not a multiple of 16 (Preprocess pads)
    padded = _node_out(core_seedvr.SeedVR2Preprocess.execute(resized_images=frames))
    report["preprocessed_shape"] = list(padded.shape)

    # VAE Encode (core's node) with each VAE
    z_core = nodes.VAEEncode().encode(core_vae, padded)[0]["samples"]
    z_ours = nodes.VAEEncode().encode(ours, padded)[0]["samples"]
    report["encode"] = {"core_shape": list(z_core.shape), "ours_shape": list(z_ours.shape), "max_abs": diff(z_core, z_ours)}

    # Split (manual 5-frame chunks, overlap 1) -> Conditioning per chunk -> Merge
    stand_in_dit = SimpleNamespace(model=SimpleNamespace(diffusion_model=SimpleNamespace(
        positive_conditioning=torch.zeros(4, 8), negative_conditioning=torch.ones(4, 8))))
    mode = {"chunking_mode": "manual", "frames_per_chunk": 5}
    chunks_core, overlap_core = core_seedvr.SeedVR2TemporalChunk.execute(
        latent={"samples": z_core}, temporal_overlap=1, chunking_mode=mode).result
    chunks_ours, overlap_ours = core_seedvr.SeedVR2TemporalChunk.execute(
        latent={"samples": z_ours}, temporal_overlap=1, chunking_mode=mode).result
    conditioning = []
    for a, b in zip(chunks_core, chunks_ours):
        pos_a, _neg_a = core_seedvr.SeedVR2Conditioning.execute(model=stand_in_dit, vae_conditioning=a).result
        pos_b, _neg_b = core_seedvr.SeedVR2Conditioning.execute(model=stand_in_dit, vae_conditioning=b).result
        conditioning.append(diff(pos_a[0][1]["condition"], pos_b[0][1]["condition"]))
    merged_core = _node_out(core_seedvr.SeedVR2TemporalMerge.execute(latents=chunks_core, temporal_overlap=[overlap_core]))
    merged_ours = _node_out(core_seedvr.SeedVR2TemporalMerge.execute(latents=chunks_ours, temporal_overlap=[overlap_ours]))
    report["chunks"] = {"count": len(chunks_ours), "overlap": overlap_ours,
                        "condition_channels": int(pos_b[0][1]["condition"].shape[1]),
                        "condition_max_abs": max(conditioning),
                        "merged_max_abs": diff(merged_core["samples"], merged_ours["samples"])}

    # VAE Decode (core's node): each VAE decodes core's merged latents; ours also decodes its own
    x_core = nodes.VAEDecode().decode(core_vae, merged_core)[0]
    x_ours = nodes.VAEDecode().decode(ours, merged_core)[0]
    x_ours_own = nodes.VAEDecode().decode(ours, merged_ours)[0]
    report["decode"] = {"core_shape": list(x_core.shape), "ours_shape": list(x_ours.shape),
                        "max_abs": diff(x_core, x_ours), "own_latents_max_abs": diff(x_core, x_ours_own)}

    # Post-Process with each decode, every colour correction (against the un-padded frames)
    report["postprocess"] = {}
    for method in ("none", "adain", "wavelet", "lab"):
        post_core = _node_out(core_seedvr.SeedVR2PostProcessing.execute(
            images=x_core, original_resized_images=frames, color_correction_method=method))
        post_ours = _node_out(core_seedvr.SeedVR2PostProcessing.execute(
            images=x_ours, original_resized_images=frames, color_correction_method=method))
        report["postprocess"][method] = {"shape": list(post_ours.shape), "max_abs": diff(post_core, post_ours)}

    # Tiled nodes: ours is exact, so it is held against core's untiled pass; core's own tiled pass blends
    # tiles (not exact) and its distance from its untiled pass is reported alongside.
    sizes = {"tile_size": 64, "overlap": 16, "temporal_size": 8, "temporal_overlap": 4}  # the nodes' minimum tile
    tiled = nodes.VAEDecodeTiled().decode(ours, merged_core, **sizes)[0]
    tiled_core = nodes.VAEDecodeTiled().decode(core_vae, merged_core, **sizes)[0]
    enc_tiled = nodes.VAEEncodeTiled().encode(ours, padded, **sizes)[0]["samples"]
    enc_tiled_core = nodes.VAEEncodeTiled().encode(core_vae, padded, **sizes)[0]["samples"]
    report["tiled"] = {"decode_max_abs": diff(x_core, tiled), "encode_max_abs": diff(z_core, enc_tiled),
                       "core_tiled_decode_vs_untiled": diff(x_core, tiled_core),
                       "core_tiled_encode_vs_untiled": diff(z_core, enc_tiled_core)}

    # core's seedvr2_tiling decode option, forwarded by VAE.decode(vae_options=...)
    option = {"seedvr2_tiling": {"enable_tiling": True, "tile_size": (32, 32), "tile_overlap": (8, 8)}}
    x_option = ours.decode(merged_core["samples"], vae_options=option)
    report["seedvr2_tiling_option_max_abs"] = diff(core_vae.decode(merged_core["samples"]), x_option)
    return report


if __name__ == "__main__":
    import torch

    with torch.inference_mode():  # as ComfyUI's executor runs every node
        print(json.dumps(main(sys.argv[1], sys.argv[2])))
