"""Qwen-Image-Layered: the RGBA Qwen-Image VAE (Wan 2.1 layout, 4 image channels in and out) end to end.

Against diffusers `AutoencoderKLQwenImage(input_channels=4)` with seeded weights at fp32: whole passes,
layer batches, exact tiles, both file formats (diffusers folder, ComfyUI single file with Wan keys);
the channel contract of the API, the engine export inputs, and the ComfyUI nodes in the core layered
graph (EmptyQwenImageLayeredLatentImage -> ... -> LatentCutToBatch(dim="t") -> VAE Decode), where
ComfyUI's own VAE returns an RGBA IMAGE and pads an RGB image with an opaque alpha before encoding.
"""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from turbovae import TurboVAE, decode_tiled, encode_tiled
from turbovae.vae import loader
from turbovae.vae.checkpoint import CheckpointError
from turbovae.vae.wan import (QWEN_IMAGE_LAYERED, TINY_WAN21, WAN21, WanVAE, build, diffusers_to_original,
                              expected_shapes)
from turbovae.vae.wan.config import config_from_diffusers, diffusers_kwargs

diffusers = pytest.importorskip("diffusers")

sys.path.insert(0, os.path.dirname(__file__))
import node_helpers  # noqa: E402
from test_wan import max_err, one_thread, reference  # noqa: E402,F401  (seeded diffusers models; one thread)

node_helpers.use_comfy_stubs()
from turbovae.nodes import paths as _paths  # noqa: E402
from turbovae.nodes.comfy_vae import ComfyTurboVAE  # noqa: E402
from turbovae.nodes.loader_nodes import TurboVAELoader  # noqa: E402
from turbovae.nodes.tiled_nodes import TurboVAETiledDecode, TurboVAETiledEncode  # noqa: E402

folder_paths = _paths.folder_paths
node_helpers.hide_comfy_stubs()

TOL = 1e-4
TINY_RGBA = replace(TINY_WAN21, image_channels=4)


def rgba(shape, seed):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1


@pytest.fixture(scope="module")
def tiny():
    ref = reference(TINY_RGBA)
    return ref, TurboVAE(build(ref.state_dict(), config=TINY_RGBA))


# -- architecture and numerics -------------------------------------------------------------------
def test_real_config_is_diffusers_rgba_vae_and_differs_only_in_the_pixel_convs():
    with torch.device("meta"):
        ref = diffusers.AutoencoderKLQwenImage(**diffusers_kwargs(QWEN_IMAGE_LAYERED))
    theirs = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    ours = expected_shapes(QWEN_IMAGE_LAYERED)
    assert ours == theirs and sum(torch.Size(s).numel() for s in ours.values()) == 126_897_716
    rgb = expected_shapes(WAN21)
    assert {k for k in ours if ours[k] != rgb[k]} == {"encoder.conv_in.weight", "decoder.conv_out.weight",
                                                       "decoder.conv_out.bias"}
    assert ours["encoder.conv_in.weight"][1] == 4 and ours["decoder.conv_out.weight"][0] == 4


@pytest.mark.parametrize("frames", [1, 5])
def test_tiny_rgba_encode_decode_equal_diffusers(tiny, frames):
    ref, vae = tiny
    x = rgba((1, 4, frames, 32, 48), frames)
    z = torch.randn(1, 4, (frames - 1) // 4 + 1, 4, 6, generator=torch.Generator().manual_seed(10 + frames))
    with torch.inference_mode():
        want_m, want_px = ref.encode(x).latent_dist.parameters, ref.decode(z).sample
    moments, pixels = vae.encode_moments(x), vae.decode(z)
    assert moments.shape == want_m.shape and pixels.shape == want_px.shape and pixels.shape[1] == 4
    assert max_err(moments, want_m) <= TOL and max_err(pixels, want_px) <= TOL
    assert (want_px.abs() < 0.999).float().mean() > 0.5  # not a comparison of saturated clamps
    # The alpha channel is read: changing it changes the latents.
    x2 = x.clone()
    x2[:, 3] = -x2[:, 3]
    assert max_err(vae.encode_moments(x2), moments) > 1e-3


def test_layer_batch_equals_diffusers_and_each_layer_alone(tiny):
    """Qwen-Image-Layered decodes layers + 1 latents as a batch of single frames ((b f) c 1 h w)."""
    ref, vae = tiny
    z = torch.randn(5, 4, 1, 6, 5, generator=torch.Generator().manual_seed(20))
    with torch.inference_mode():
        want = ref.decode(z).sample
        want_m = ref.encode(want).latent_dist.parameters
    out = vae.decode(z)
    assert out.shape == (5, 4, 1, 48, 40) and max_err(out, want) <= TOL
    assert max_err(vae.decode(z[:, :, 0]), want[:, :, 0]) <= TOL  # 4-D in, 4-D out
    for i in (0, 4):
        assert max_err(vae.decode(z[i:i + 1]), out[i:i + 1]) <= 1e-5
    assert max_err(vae.encode_moments(want), want_m) <= TOL


@pytest.mark.parametrize("decode", [True, False], ids=["decode", "encode"])
def test_exact_tiles_equal_untiled_and_fast_tiles_cover_rgba(tiny, decode):
    _, vae = tiny
    if decode:
        x = torch.randn(5, 4, 1, 20, 16, generator=torch.Generator().manual_seed(30))
        whole = vae.decode(x)
        exact = decode_tiled(vae, x, tile_px=64, overlap_px=0, mode="exact")
        fast = decode_tiled(vae, x, tile_px=96, overlap_px=32, mode="fast")
        one = decode_tiled(vae, x, tile_px=160, overlap_px=0, mode="fast")  # a single tile is the untiled pass
    else:
        x = rgba((2, 4, 1, 160, 128), 31)
        whole = vae.encode(x)
        exact = encode_tiled(vae, x, tile_px=64, overlap_px=0, mode="exact")
        fast = encode_tiled(vae, x, tile_px=96, overlap_px=32, mode="fast")
        one = encode_tiled(vae, x, tile_px=160, overlap_px=0, mode="fast")
    assert exact.shape == whole.shape == fast.shape and whole.shape[1] == (4 if decode else TINY_RGBA.z_dim)
    assert max_err(exact, whole) <= 1e-5 and max_err(one, whole) <= 1e-5
    assert torch.isfinite(fast).all()


# -- loading ---------------------------------------------------------------------------------------
def test_diffusers_folder_loads_as_layered_and_matches(tmp_path):
    ref = reference(TINY_RGBA, seed=1)
    ref.save_pretrained(tmp_path / "Qwen-Image-Layered" / "vae")
    vae = loader.load_checkpoint(tmp_path / "Qwen-Image-Layered", device="cpu")
    assert vae.kind == "qwen_image_layered" and vae.image_channels == 4 and vae.latent_format.image_channels == 4
    x = rgba((1, 4, 32, 48), 2)
    z = torch.randn(5, 4, 1, 4, 6, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        want_lat = ref.encode(x.unsqueeze(2)).latent_dist.mode()[:, :, 0]
        want_px = ref.decode(z).sample
    assert max_err(vae.encode(x), want_lat) <= TOL and max_err(vae.decode(z), want_px) <= TOL


@pytest.fixture(scope="module")
def real_file(tmp_path_factory):
    """The real-size RGBA VAE from diffusers (seeded), saved as ComfyUI's single file with Wan keys."""
    from safetensors.torch import save_file

    ref = reference(QWEN_IMAGE_LAYERED, seed=4)
    folder = tmp_path_factory.mktemp("comfy") / "models" / "vae"
    folder.mkdir(parents=True)
    path = folder / "qwen_image_layered_vae.safetensors"
    sd = ref.state_dict()
    save_file({k: v.contiguous() for k, v in diffusers_to_original(sd, QWEN_IMAGE_LAYERED).items()}, str(path))
    x = rgba((1, 4, 1, 32, 32), 5)
    z = torch.randn(2, 16, 1, 2, 3, generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        want = ref.encode(x).latent_dist.parameters, ref.decode(z).sample
    del ref
    gc.collect()
    yield path, sd, x, z, want
    gc.collect()


@pytest.mark.slow
def test_comfyui_single_file_and_diffusers_state_dict_load_strictly_and_match(real_file):
    path, sd, x, z, (want_m, want_px) = real_file
    for source in (path, sd):  # Wan/ComfyUI keys from a file; diffusers keys, no config
        vae = loader.load_checkpoint(source, device="cpu", dtype="fp32")
        assert vae.kind == "qwen_image_layered" and vae.image_channels == 4 and vae.latent_channels == 16
        assert vae.latent_format.mean == WAN21.latents_mean  # same latent space as Qwen-Image
        with torch.inference_mode():
            assert max_err(vae.encode_moments(x), want_m) <= TOL
            assert max_err(vae.decode(z), want_px) <= TOL
        del vae
        gc.collect()


def test_channel_mismatch_and_unreleased_counts_are_clear_errors():
    cfg = replace(TINY_WAN21, image_channels=4)
    sd = WanVAE(cfg).state_dict()
    bad = dict(sd)
    bad["decoder.conv_out.weight"] = bad["decoder.conv_out.weight"][:3]
    with pytest.raises(CheckpointError, match="encoder reads 4 channels but the decoder writes 3"):
        build(diffusers_to_original(bad, cfg))
    two = WanVAE(replace(TINY_WAN21, image_channels=2)).state_dict()
    with pytest.raises(CheckpointError, match="2 image channels was never released"):
        build(two)
    # Detection reads the weights, then the strict check still applies (a tiny width is not the real one).
    with pytest.raises(CheckpointError, match=r"encoder.conv_in.weight \(8, 4, 3, 3, 3\) \(expected \(96, 4, 3"):
        build(diffusers_to_original(sd, cfg))


def test_kind_rule_and_diffusers_config():
    from turbovae.vae.wan import _kind

    assert _kind("wan2.1", "/m/vae/qwen_image_layered_vae.safetensors", None, 4) == "qwen_image_layered"
    assert _kind("wan2.1", "/m/vae/wan_rgba.safetensors", None, 4) == "qwen_image_layered"
    assert _kind("wan2.1", "x", {"_class_name": "AutoencoderKLQwenImage"}, 4) == "qwen_image_layered"
    assert _kind("wan2.1", "/m/vae/qwen_image_vae.safetensors", None, 3) == "qwen_image"
    diffusers_config = {"_class_name": "AutoencoderKLQwenImage", "input_channels": 4,
                        "latents_mean": list(WAN21.latents_mean), "latents_std": list(WAN21.latents_std)}
    assert config_from_diffusers(diffusers_config) == QWEN_IMAGE_LAYERED
    assert WanVAE(TINY_RGBA).kind == "qwen_image_layered" and WanVAE(TINY_WAN21).kind == "qwen_image"


def test_pixel_channel_errors_name_the_fix(tiny):
    _, vae = tiny
    with pytest.raises(ValueError, match="4 channels for a qwen_image_layered VAE.*opaque alpha"):
        vae.encode(rgba((1, 3, 1, 32, 32), 0))
    rgb = TurboVAE(WanVAE(TINY_WAN21))
    with pytest.raises(ValueError, match=r"3 channels for a qwen_image VAE.*x\[:, :3\]"):
        rgb.encode(rgba((1, 4, 1, 32, 32), 0))


# -- engines: export inputs follow the image channels -------------------------------------------------
def test_engine_profiles_and_export_example_use_image_channels(tiny, tmp_path):
    from turbovae.trt.build import EngineJob, image_plan
    from turbovae.trt.buckets import Bucket, static_table
    from turbovae.trt.engine_set import engine_profiles
    from turbovae.trt.identity import EngineIdentity

    _, vae = tiny
    table = static_table(Bucket(32, 48))
    enc = image_plan(vae, EngineJob("encoder", (0,), tmp_path / "e"), table, torch.float32, torch.device("cpu"), 3)
    dec = image_plan(vae, EngineJob("decoder", (0,), tmp_path / "d"), table, torch.float32, torch.device("cpu"), 3)
    assert enc.example[0].shape == (1, 4, 32, 48) and dec.example[0].shape == (1, 4, 4, 6)
    with torch.inference_mode():
        assert enc.module(enc.example[0]).shape == (1, 8, 4, 6) and dec.module(dec.example[0]).shape == (1, 4, 32, 48)

    def ident(lf):
        return EngineIdentity(model_hash="h", model_kind=vae.kind, component="encoder", dtype="fp32",
                              table=table.to_json(), entries=(0,), input_names=("pixels",),
                              output_names=("moments",), backend="aoti", backend_version="x", device_type="cpu",
                              gpu_name=None, compute_capability=None, torch_version="x", latent_format=lf)

    from dataclasses import asdict

    lf = asdict(vae.latent_format)
    assert engine_profiles(ident(lf), table)[0]["pixels"][1] == (1, 4, 32, 48)
    old = {k: v for k, v in lf.items() if k != "image_channels"}  # identities written before RGBA existed
    assert engine_profiles(ident(old), table)[0]["pixels"][1] == (1, 3, 32, 48)


def test_onnx_export_of_the_rgba_encoder_runs_with_four_channels(tiny, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from turbovae.trt.build import EngineJob, image_plan
    from turbovae.trt.buckets import Bucket, static_table
    from turbovae.trt.export import export_onnx, validate_onnx

    _, vae = tiny
    plan = image_plan(vae, EngineJob("encoder", (0,), tmp_path / "e"), static_table(Bucket(32, 48)),
                      torch.float32, torch.device("cpu"), 3)
    path = tmp_path / "encoder.onnx"
    export_onnx(plan.module, plan.example, plan.spec, path, optimize=False)
    (res,) = validate_onnx(path, vae.model.image_encoder(), {"pixels": rgba((1, 4, 32, 48), 7)})
    assert res["max_abs"] <= 1e-4


# -- ComfyUI: loader, core graph, tiled nodes -------------------------------------------------------------
def latent_cut_to_batch_t(samples: torch.Tensor) -> torch.Tensor:
    """What core LatentCutToBatch(dim="t", slice_size=1) does to [B, C, T, h, w]: [B*T, C, 1, h, w]."""
    b, c, t, h, w = samples.shape
    return samples.movedim(2, 1).reshape(b * t, 1, c, h, w).movedim(1, 2)


def comfy_image(pixels: torch.Tensor) -> torch.Tensor:
    """Our pixels [N, C, T, H, W] in -1..1 as core VAE Decode returns them: [N*T, H, W, C] in 0..1."""
    out = ((pixels.float() + 1) / 2).clamp(0, 1).movedim(1, -1)
    return out.reshape(-1, *out.shape[-3:])


@pytest.fixture
def comfy_tiny(tiny):
    return ComfyTurboVAE(tiny[1])


def test_core_layered_graph_decodes_layers_to_rgba_images(comfy_tiny, tiny):
    ref, vae = tiny
    assert comfy_tiny.output_channels == 4 and comfy_tiny.pad_channel_value == 1.0
    layers = 4
    latent = torch.randn(1, 4, layers + 1, 16, 12, generator=torch.Generator().manual_seed(40))  # Empty...Layered
    batch = latent_cut_to_batch_t(latent)
    assert batch.shape == (layers + 1, 4, 1, 16, 12) and torch.equal(batch[2, :, 0], latent[0, :, 2])
    images = comfy_tiny.decode(batch)  # what core VAE Decode calls
    assert images.shape == (layers + 1, 1, 128, 96, 4)
    images = images.reshape(-1, *images.shape[-3:])  # core VAE Decode folds [B, T, ...] into the batch
    with torch.inference_mode():
        want = comfy_image(ref.decode(batch).sample)
    assert images.shape == (layers + 1, 128, 96, 4) and max_err(images, want) <= TOL
    tiled = TurboVAETiledDecode.execute(samples={"samples": batch}, vae=comfy_tiny, tile_size=64, overlap=0,
                                        temporal_slice=0, mode="exact").args[0]
    assert tiled.shape == images.shape and max_err(tiled, images) <= 1e-5


def test_encode_pads_rgb_with_opaque_alpha_and_keeps_rgba(comfy_tiny, tiny):
    _, vae = tiny
    image = torch.rand(1, 130, 97, 4, generator=torch.Generator().manual_seed(41))  # cropped to 128x96
    cropped = image[:, 1:129, 0:96]
    want_rgba = vae.encode(cropped.movedim(-1, 0).unsqueeze(0) * 2 - 1)
    opaque = torch.cat([cropped[..., :3], torch.ones_like(cropped[..., :1])], dim=-1)
    want_rgb = vae.encode(opaque.movedim(-1, 0).unsqueeze(0) * 2 - 1)
    assert max_err(comfy_tiny.encode(image), want_rgba) <= 1e-6
    assert max_err(comfy_tiny.encode(image[..., :3]), want_rgb) <= 1e-6
    assert max_err(want_rgb, want_rgba) > 1e-3  # the alpha channel mattered
    tiled = TurboVAETiledEncode.execute(pixels=image[..., :3], vae=comfy_tiny, tile_size=64, overlap=0,
                                        temporal_slice=0, mode="exact").args[0]["samples"]
    assert max_err(tiled, want_rgb) <= 1e-5


def test_rgb_vae_in_comfyui_keeps_three_channels():
    vae = ComfyTurboVAE(TurboVAE(WanVAE(TINY_WAN21).eval()))
    assert vae.output_channels == 3 and vae.pad_channel_value is None
    image = torch.rand(1, 32, 32, 4)
    assert torch.equal(vae.vae_encode_crop_pixels(image), image[..., :3])  # core drops the extra channel
    with pytest.raises(ValueError, match="3 channels"):
        vae.encode(image[..., :1])  # too few channels for RGB: named, not padded


@pytest.mark.slow
def test_loader_node_loads_the_comfyui_file_as_rgba(real_file):
    path = real_file[0]
    folder_paths.reset(str(path.parents[2]))
    vae = TurboVAELoader.execute(vae_name=path.name, dtype="fp32").args[0]
    assert isinstance(vae, ComfyTurboVAE) and vae.kind == "qwen_image_layered"
    assert vae.output_channels == 4 and vae.latent_channels == 16 and vae.pad_channel_value == 1.0
    z = latent_cut_to_batch_t(torch.randn(1, 16, 2, 2, 2, generator=torch.Generator().manual_seed(42)))
    assert vae.decode(z).shape == (2, 1, 16, 16, 4)


# -- bench -----------------------------------------------------------------------------------------------
def test_bench_quick_layered_decode_compares_with_diffusers_in_the_same_run():
    from turbovae.bench import qwen_layered
    from turbovae.bench.common import BenchOptions
    from turbovae.bench.runner import SECTIONS

    assert SECTIONS["qwen_layered"] == "qwen_layered"
    rows = qwen_layered.run(BenchOptions(device="cpu", quick=True, repeat=1, warmup=0))
    assert [r.variant for r in rows] == ["diffusers AutoencoderKLQwenImage(input_channels=4), batch",
                                         "turbovae, batch", "turbovae, layer by layer"]
    assert {r.case for r in rows} == {"layered decode 64²×5 (tiny)"}
    assert all(r.baseline_ms == rows[0].ms and r.ms > 0 for r in rows)
    assert all(r.max_abs_err <= TOL for r in rows[1:])
