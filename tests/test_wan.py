"""Wan-family VAE (Qwen-Image / Wan 2.1 / Wan 2.2): structure, key maps, loading, errors, and
equality with diffusers at tiny (reduced-width) configs. Real-config numerics: test_wan_real.py."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from turbovae.vae import api, loader
from turbovae.vae.accel.channels_last import channels_last_in_cpu_fp32
from turbovae.vae.checkpoint import CheckpointError, registered_architectures
from turbovae.vae.wan import (TINY_WAN21, TINY_WAN22, WAN21, WAN22, WanVAE, build, diffusers_to_original,
                              expected_shapes, original_to_diffusers)
from turbovae.vae.wan.config import diffusers_kwargs

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny configs are op-overhead bound: one thread avoids OpenMP barrier stalls on a busy 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def reference(cfg, seed=0):
    """A diffusers model of `cfg` with seeded weights (gammas randomised too, so they matter)."""
    torch.manual_seed(seed)
    cls = diffusers.AutoencoderKLWan if cfg.is_residual else diffusers.AutoencoderKLQwenImage
    ref = cls(**diffusers_kwargs(cfg)).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
    return ref


def max_err(a, b):
    return (a.float() - b.float()).abs().max().item()


@pytest.fixture(scope="module", params=["wan2.1", "wan2.2"])
def tiny_pair(request):
    cfg = TINY_WAN22 if request.param == "wan2.2" else TINY_WAN21
    ref = reference(cfg)
    ours = build(ref.state_dict(), config=cfg)
    return cfg, ref, ours


# -- structure ------------------------------------------------------------------------------
def test_real_config_counts_match_the_released_checkpoints():
    shapes21 = expected_shapes(WAN21)
    numel = {k: torch.Size(s).numel() for k, s in shapes21.items()}
    assert len(shapes21) == 194 and sum(numel.values()) == 126_892_531
    assert sum(v for k, v in numel.items() if k.startswith("encoder.")) == 53_595_872
    assert sum(v for k, v in numel.items() if k.startswith("decoder.")) == 73_295_331
    shapes22 = expected_shapes(WAN22)
    assert len(shapes22) == 196 and sum(torch.Size(s).numel() for s in shapes22.values()) == 704_688_668


@pytest.mark.parametrize("cfg", [WAN21, WAN22], ids=["wan2.1", "wan2.2"])
def test_real_config_key_set_equals_diffusers(cfg):
    cls = diffusers.AutoencoderKLWan if cfg.is_residual else diffusers.AutoencoderKLQwenImage
    with torch.device("meta"):
        ref = cls(**diffusers_kwargs(cfg))
    theirs = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    assert expected_shapes(cfg) == theirs


def test_receptive_radius_is_computed_from_layers():
    m = WanVAE(TINY_WAN21)
    assert (m.encoder.receptive_radius, m.decoder.receptive_radius) == (10, 13)


@pytest.mark.parametrize("cfg", [TINY_WAN21, TINY_WAN22], ids=["wan2.1", "wan2.2"])
def test_forward_up_is_local_within_its_radius(cfg):
    torch.manual_seed(1)
    m = WanVAE(cfg).eval()
    r, f = m.decoder.receptive_radius, cfg.spatial_factor
    h = torch.randn(1, cfg.decoder_dims()[0], 2 * r + 5, 2 * r + 6)
    h2 = h.clone()
    py, px = r + 2, r + 3
    h2[:, :, py, px] += 1.0
    with torch.inference_mode():
        ups = [m.decoder.forward_up(v, m.context()) for v in (h, h2)]
        diff = (ups[0] - ups[1]).abs().amax(dim=(0, 1))
    ys, xs = torch.nonzero(diff > 0, as_tuple=True)
    assert len(ys) > 0
    assert ys.min() >= (py - r) * f and ys.max() < (py + r + 1) * f
    assert xs.min() >= (px - r) * f and xs.max() < (px + r + 1) * f


@pytest.mark.parametrize("cfg", [TINY_WAN21, TINY_WAN22], ids=["wan2.1", "wan2.2"])
def test_forward_down_is_local_within_its_radius(cfg):
    torch.manual_seed(2)
    m = WanVAE(cfg).eval()
    r, f = m.encoder.receptive_radius, cfg.spatial_factor
    n = 2 * r + 4
    x = torch.randn(1, 3, n * f, (n + 1) * f)
    x2 = x.clone()
    py, px = (r + 2) * f + 3, (r + 2) * f + 5
    x2[:, :, py, px] += 1.0
    with torch.inference_mode():
        downs = [m.encoder.forward_down(v, m.context()) for v in (x, x2)]
        diff = (downs[0] - downs[1]).abs().amax(dim=(0, 1))
    ys, xs = torch.nonzero(diff > 0, as_tuple=True)
    assert len(ys) > 0
    assert ys.min() >= py // f - r and ys.max() <= py // f + r
    assert xs.min() >= px // f - r and xs.max() <= px // f + r


# -- key maps -------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [WAN21, WAN22], ids=["wan2.1", "wan2.2"])
def test_key_map_round_trips_both_ways(cfg):
    diff_keys = dict.fromkeys(expected_shapes(cfg))
    orig = diffusers_to_original(diff_keys, cfg)
    assert len(orig) == len(diff_keys)
    assert original_to_diffusers(orig, cfg) == diff_keys
    assert diffusers_to_original(original_to_diffusers(orig, cfg), cfg) == orig
    assert not any(k.startswith(("encoder.down_blocks", "decoder.up_blocks", "quant_conv", "post_quant_conv"))
                   for k in orig)


def test_key_map_matches_the_documented_names():
    pairs = {
        "conv1.weight": "quant_conv.weight",
        "conv2.bias": "post_quant_conv.bias",
        "encoder.conv1.weight": "encoder.conv_in.weight",
        "decoder.head.0.gamma": "decoder.norm_out.gamma",
        "decoder.head.2.weight": "decoder.conv_out.weight",
        "encoder.middle.1.to_qkv.weight": "encoder.mid_block.attentions.0.to_qkv.weight",
        "decoder.middle.2.residual.6.bias": "decoder.mid_block.resnets.1.conv2.bias",
        "encoder.downsamples.3.shortcut.weight": "encoder.down_blocks.3.conv_shortcut.weight",
        "encoder.downsamples.8.time_conv.weight": "encoder.down_blocks.8.time_conv.weight",
        "encoder.downsamples.10.residual.3.gamma": "encoder.down_blocks.10.norm2.gamma",
        "decoder.upsamples.4.shortcut.bias": "decoder.up_blocks.1.resnets.0.conv_shortcut.bias",
        "decoder.upsamples.7.time_conv.weight": "decoder.up_blocks.1.upsamplers.0.time_conv.weight",
        "decoder.upsamples.11.resample.1.weight": "decoder.up_blocks.2.upsamplers.0.resample.1.weight",
        "decoder.upsamples.14.residual.0.gamma": "decoder.up_blocks.3.resnets.2.norm1.gamma",
    }
    assert original_to_diffusers(dict.fromkeys(pairs), WAN21) == dict.fromkeys(pairs.values())
    pairs22 = {
        "encoder.downsamples.1.downsamples.2.time_conv.weight": "encoder.down_blocks.1.downsampler.time_conv.weight",
        "encoder.downsamples.0.downsamples.1.residual.2.weight": "encoder.down_blocks.0.resnets.1.conv1.weight",
        "decoder.upsamples.0.upsamples.3.time_conv.bias": "decoder.up_blocks.0.upsampler.time_conv.bias",
        "decoder.upsamples.3.upsamples.2.residual.6.weight": "decoder.up_blocks.3.resnets.2.conv2.weight",
    }
    assert original_to_diffusers(dict.fromkeys(pairs22), WAN22) == dict.fromkeys(pairs22.values())
    assert set(pairs22) <= set(diffusers_to_original(dict.fromkeys(expected_shapes(WAN22)), WAN22))


# -- equality with diffusers (tiny configs: same topology, reduced width) -------------------
@pytest.mark.parametrize("frames", [1, 5, 9])
def test_tiny_equals_diffusers(tiny_pair, frames):
    cfg, ref, ours = tiny_pair
    g = torch.Generator().manual_seed(frames)
    x = torch.rand(1, 3, frames, 64, 80, generator=g) * 2 - 1
    z = torch.randn(1, cfg.z_dim, (frames - 1) // 4 + 1, 64 // cfg.spatial_factor, 80 // cfg.spatial_factor,
                    generator=g)
    with torch.inference_mode():
        moments_ref = ref.encode(x).latent_dist.parameters
        pixels_ref = ref.decode(z).sample
        moments = ours.encode_moments(x)
        pixels = ours.decode_latents(z)
    assert moments.shape == moments_ref.shape and pixels.shape == pixels_ref.shape
    assert max_err(moments, moments_ref) <= TOL
    assert max_err(pixels, pixels_ref) <= TOL
    assert (pixels_ref.abs() < 0.999).float().mean() > 0.5  # not a comparison of saturated clamps


@pytest.mark.parametrize("slice_", [1, 2])
def test_temporal_slices_equal_whole_clip(tiny_pair, slice_):
    cfg, _, ours = tiny_pair
    g = torch.Generator().manual_seed(3)
    x = torch.rand(1, 3, 13, 32, 48, generator=g) * 2 - 1
    z = torch.randn(2, cfg.z_dim, 4, 2, 3, generator=g)
    with torch.inference_mode():
        assert max_err(ours.encode_moments(x, temporal_slice=slice_), ours.encode_moments(x)) <= 1e-5
        assert max_err(ours.decode_latents(z, temporal_slice=slice_), ours.decode_latents(z)) <= 1e-5


def test_streams_accept_uneven_decode_steps_and_reject_bad_encode_steps(tiny_pair):
    cfg, _, ours = tiny_pair
    g = torch.Generator().manual_seed(4)
    z = torch.randn(1, cfg.z_dim, 5, 2, 3, generator=g)
    x = torch.rand(1, 3, 9, 32, 48, generator=g) * 2 - 1
    with torch.inference_mode():
        whole = ours.decode_latents(z)
        with ours.decode_stream() as s:
            parts = [s.step(z[:, :, a:b]) for a, b in ((0, 2), (2, 3), (3, 5))]
        assert max_err(torch.cat(parts, 2), whole) <= 1e-5
        with ours.encode_stream() as s:
            enc = torch.cat([s.step(x[:, :, :1]), s.step(x[:, :, 1:5]), s.step(x[:, :, 5:9])], 2)
        assert max_err(enc, ours.encode_moments(x)) <= 1e-5
        with pytest.raises(ValueError, match="1\\+4k"):
            ours.encode_stream().step(x[:, :, :2])
        s = ours.encode_stream()
        s.step(x[:, :, :1])
        with pytest.raises(ValueError, match="4k"):
            s.step(x[:, :, 1:4])


@pytest.mark.slow
def test_every_flag_combination_is_exact(tiny_pair):
    cfg, _, ours = tiny_pair
    g = torch.Generator().manual_seed(5)
    x = torch.rand(1, 3, 5, 32, 48, generator=g) * 2 - 1
    z = torch.randn(1, cfg.z_dim, 2, 2, 3, generator=g)
    base = ours.fast
    try:
        outs = []
        for combo in itertools.product([True, False], repeat=len(WanVAE.fast_fields)):
            ours.fast = replace(base, **dict(zip(WanVAE.fast_fields, combo)))
            with torch.inference_mode():
                outs.append((ours.encode_moments(x[:, :, :1]), ours.encode_moments(x),
                             ours.decode_latents(z[:, :, :1]), ours.decode_latents(z)))
    finally:
        ours.fast = base
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            assert max_err(a, b) <= 1e-5


def test_image_modules_and_split_passes_match_the_model(tiny_pair):
    cfg, _, ours = tiny_pair
    g = torch.Generator().manual_seed(6)
    x = torch.rand(2, 3, 32, 48, generator=g) * 2 - 1
    z = torch.randn(2, cfg.z_dim, 2, 3, generator=g)
    with torch.inference_mode():
        enc, dec = ours.image_encoder(), ours.image_decoder()
        assert max_err(enc(x), ours.encode_moments(x.unsqueeze(2))[:, :, 0]) <= 1e-5
        assert max_err(dec(z), ours.decode_latents(z.unsqueeze(2))[:, :, 0]) <= 1e-5
        split = ours.decoder.forward_up(ours.decoder.forward_mid(z, ours.context()), ours.context()).clamp(-1, 1)
        assert max_err(split, dec(z)) <= 1e-6
        features = ours.encoder.forward_down(x, ours.context())
        assert max_err(ours.encoder.forward_mid(features, ours.context()), enc(x)) <= 1e-6
        # The fold equals the unfolded (zero-padded causal) computation.
        ours.fast = replace(ours.fast, image_path=False)
        try:
            assert max_err(ours.decode_latents(z.unsqueeze(2))[:, :, 0], dec(z)) <= 1e-5
        finally:
            ours.fast = replace(ours.fast, image_path=True)


def test_bf16_keeps_rms_reduction_in_fp32(tiny_pair):
    cfg, _, ours = tiny_pair
    g = torch.Generator().manual_seed(7)
    z = torch.randn(1, cfg.z_dim, 1, 4, 5, generator=g)
    half = WanVAE(cfg).eval()
    half.load_state_dict(ours.state_dict())
    half.to(torch.bfloat16)
    with torch.inference_mode():
        a = ours.decode_latents(z)
        b = half.decode_latents(z.bfloat16())
    assert b.dtype == torch.bfloat16
    mse = (a - b.float()).pow(2).mean().item()
    assert 10 * torch.log10(torch.tensor(4.0 / mse)).item() > 30


# -- loading: formats, kinds, errors --------------------------------------------------------
@pytest.fixture(scope="module")
def real_bf16_original():
    """A real-size Wan 2.1 state dict in original/ComfyUI key format (random bf16 values)."""
    g = torch.Generator().manual_seed(8)
    sd = {k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in expected_shapes(WAN21).items()}
    return diffusers_to_original(sd, WAN21)


def test_original_safetensors_and_pth_load_strictly(tmp_path, real_bf16_original):
    from safetensors.torch import save_file

    st = tmp_path / "wan_2.1_vae.safetensors"
    save_file(real_bf16_original, str(st))
    vae = loader.load_checkpoint(st, device="cpu")
    assert vae.kind == "wan2.1" and vae.dtype == torch.float32 and vae.latent_channels == 16
    assert vae.latent_format.mean[0] == -0.7571 and len(vae.latent_format.std) == 16
    loaded = vae.state_dict()
    conv = original_to_diffusers(real_bf16_original, WAN21)
    assert torch.equal(loaded["decoder.up_blocks.1.upsamplers.0.time_conv.weight"],
                       conv["decoder.up_blocks.1.upsamplers.0.time_conv.weight"].float())
    pth = tmp_path / "Qwen_VAE.pth"
    torch.save(dict(real_bf16_original), pth)
    vae2 = loader.load_checkpoint(pth, device="cpu", dtype="bf16")
    assert vae2.kind == "qwen_image" and vae2.dtype == torch.bfloat16
    assert torch.equal(vae2.state_dict()["encoder.conv_in.weight"], conv["encoder.conv_in.weight"])


@pytest.mark.parametrize("cfg", [TINY_WAN21, TINY_WAN22], ids=["wan2.1", "wan2.2"])
def test_diffusers_folder_loads_and_matches(tmp_path, cfg):
    ref = reference(cfg, seed=9)
    ref.save_pretrained(tmp_path / "model" / "vae")
    vae = loader.load_checkpoint(tmp_path / "model", device="cpu")
    assert vae.kind == ("wan2.2" if cfg.is_residual else "qwen_image")
    x = torch.rand(1, 3, 32, 48) * 2 - 1  # 4-D image in, 4-D latent out
    lat = vae.encode(x)
    assert lat.shape == (1, cfg.z_dim, 32 // cfg.spatial_factor, 48 // cfg.spatial_factor)
    with torch.inference_mode():
        want = ref.encode(x.unsqueeze(2)).latent_dist.mode()[:, :, 0]
    assert max_err(lat, want) <= TOL


def test_kind_rule():
    from turbovae.vae.wan import _kind

    assert _kind("wan2.1", "/m/vae/wan_2.1_vae.safetensors", None) == "wan2.1"
    assert _kind("wan2.1", "/m/vae/Wan2_1_VAE_bf16.safetensors", None) == "wan2.1"
    assert _kind("wan2.1", "/m/vae/qwen_image_vae.safetensors", None) == "qwen_image"
    assert _kind("wan2.1", "/hf/Wan2.1-T2V-1.3B-Diffusers/vae/diffusion_pytorch_model.safetensors", None) == "wan2.1"
    assert _kind("wan2.1", "/hf/Qwen-Image/vae/diffusion_pytorch_model.safetensors", None) == "qwen_image"
    assert _kind("wan2.1", "x", {"_class_name": "AutoencoderKLWan"}) == "wan2.1"
    assert _kind("wan2.1", "wan.safetensors", {"_class_name": "AutoencoderKLQwenImage"}) == "qwen_image"
    assert _kind("wan2.2", "whatever", None) == "wan2.2"


def test_truncated_file_gives_clear_error(tmp_path):
    from safetensors.torch import save_file

    sd = diffusers_to_original(reference(TINY_WAN21).state_dict(), TINY_WAN21)
    path = tmp_path / "qwen_image_vae.safetensors"
    save_file(sd, str(path))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        loader.load_checkpoint(path, device="cpu")


def test_missing_and_wrong_shape_keys_are_named(real_bf16_original):
    sd = dict(real_bf16_original)
    del sd["decoder.upsamples.7.time_conv.weight"]
    with pytest.raises(CheckpointError, match="missing.*decoder.up_blocks.1.upsamplers.0.time_conv.weight"):
        build(sd)
    sd = dict(real_bf16_original)
    sd["encoder.conv1.weight"] = sd["encoder.conv1.weight"][:, :, 0]
    with pytest.raises(CheckpointError, match="wrong-shape.*encoder.conv_in.weight"):
        build(sd)
    # A tiny-width file is not silently accepted as the real architecture.
    with pytest.raises(CheckpointError, match="Qwen-Image / Wan 2.1"):
        build(reference(TINY_WAN21).state_dict())


def test_other_architectures_are_rejected_with_what_they_look_like():
    sd_kl = {"decoder.up_blocks.0.resnets.0.norm1.weight": torch.ones(4),
             "decoder.up_blocks.0.resnets.0.conv1.weight": torch.ones(4, 4, 3, 3)}
    with pytest.raises(CheckpointError, match="SD-style"):
        loader.load_checkpoint(sd_kl, device="cpu")
    with pytest.raises(CheckpointError, match="SD-style"):
        build(sd_kl)
    seedvr2 = [a for a in registered_architectures() if "seedvr" in a.name.lower() and a.build is not None]
    if seedvr2:  # once the SeedVR2 package registers itself, its files must not load as Wan
        sd = {"decoder.up_blocks.0.resnets.0.norm1.weight": torch.ones(4),
              "decoder.up_blocks.0.resnets.0.conv1.conv.weight": torch.ones(4, 4, 3, 3, 3)}
        with pytest.raises(CheckpointError):
            build(sd)


def test_turbovae_round_trip_shapes():
    vae = api.TurboVAE(build(reference(TINY_WAN22).state_dict(), config=TINY_WAN22))
    x = torch.rand(1, 3, 7, 32, 48) * 2 - 1  # 7 frames: padded to 9 by the API policy
    lat = vae.encode(x)
    assert lat.shape == (1, 6, 3, 2, 3)
    out = vae.decode(lat, num_frames=7)
    assert out.shape == (1, 3, 7, 32, 48) and out.abs().max() <= 1.0


def test_mixed_dtype_file_is_widened_not_truncated(real_bf16_original):
    sd = dict(real_bf16_original)
    sd["conv2.weight"] = sd["conv2.weight"].float() + 1e-3  # not representable in bf16
    model = build(sd)
    assert model.dtype == torch.float32
    assert torch.equal(model.post_quant_conv.weight, sd["conv2.weight"])


@pytest.mark.parametrize("fmt", ["channels_last", "contiguous"])
def test_head_taps_equal_the_zero_padded_conv_in_decode_and_encode(tiny_pair, fmt, monkeypatch):
    """First-slice heads without the zero padding's taps (FastPaths.head_taps) equal the padded causal conv, for
    batch 2 (frames and batch must not mix), whole clips and slices, decode and encode, in both memory formats."""
    from turbovae.vae.wan.layers import CausalConv3d

    cfg, _, ours = tiny_pair
    calls = []
    head_taps = CausalConv3d.head_taps
    monkeypatch.setattr(CausalConv3d, "head_taps", lambda self, *a: calls.append(1) or head_taps(self, *a))
    g = torch.Generator().manual_seed(8)
    z = torch.randn(2, cfg.z_dim, 3, 3, 4, generator=g)
    x = torch.rand(2, 3, 9, 32, 48, generator=g) * 2 - 1
    base = replace(ours.fast, channels_last=fmt == "channels_last")
    outs = {}
    try:
        with channels_last_in_cpu_fp32():  # channels-last runs in this fp32 CPU test when asked for
            for taps in (True, False):
                ours.fast = replace(base, head_taps=taps)
                assert ours.active_fast().channels_last is (fmt == "channels_last")
                with torch.inference_mode():
                    outs[taps] = (ours.decode_latents(z), ours.decode_latents(z, temporal_slice=1),
                                  ours.encode_moments(x))
                ran = len(calls) if taps else ran
    finally:
        ours.fast = replace(base, channels_last=True, head_taps=True)
    assert [max_err(a, b) <= 1e-5 for a, b in zip(outs[True], outs[False])] == [True] * 3
    assert len(calls) == ran > 0  # the head path ran with head_taps on, and only then


@pytest.mark.parametrize("grad_of", ["inputs", "weights"])
def test_raw_forward_with_grad_backpropagates_like_diffusers(tiny_pair, grad_of, monkeypatch):
    """A raw forward with autograd recording (no inference_mode; the input or the weights require grad) runs the
    allocating norm instead of writing into the causal conv's padded input (out= ops are not differentiable): same
    outputs as the inference pass, and the gradients diffusers computes. Under inference_mode the single-buffer
    path still runs from the second slice on."""
    from turbovae.vae.wan.layers import CausalConv3d

    cfg, ref, _ = tiny_pair
    ours = build(ref.state_dict(), config=cfg)  # its own copy: the weights' requires_grad is switched on below
    calls = []
    video_padded = CausalConv3d.video_padded
    monkeypatch.setattr(CausalConv3d, "video_padded", lambda self, *a: calls.append(1) or video_padded(self, *a))
    g = torch.Generator().manual_seed(9)
    z = torch.randn(1, cfg.z_dim, 3, 2, 3, generator=g)
    x = torch.rand(1, 3, 5, 16, 16, generator=g) * 2 - 1
    with torch.inference_mode():
        fast = (ours.decode_latents(z, temporal_slice=1), ours.encode_moments(x, temporal_slice=1))
    assert calls  # the single-buffer path served the inference passes
    z, x = z.clone(), x.clone()
    if grad_of == "inputs":
        z.requires_grad_(True)
        x.requires_grad_(True)
    else:
        ours.requires_grad_(True)
    outs = (ours.decode_latents(z, temporal_slice=1), ours.encode_moments(x, temporal_slice=1))
    assert [max_err(a, b) <= 1e-5 for a, b in zip(outs, fast)] == [True, True]  # rounding of other op orders, kernels
    (outs[0].square().sum() + outs[1].square().sum()).backward()

    ref.zero_grad(set_to_none=True)
    zr, xr = z.detach().clone().requires_grad_(True), x.detach().clone().requires_grad_(True)
    try:
        (ref.decode(zr).sample.square().sum() + ref.encode(xr).latent_dist.parameters.square().sum()).backward()
        if grad_of == "inputs":
            assert max_err(z.grad, zr.grad) <= 1e-5 * zr.grad.abs().max().item()
            assert max_err(x.grad, xr.grad) <= 1e-5 * xr.grad.abs().max().item()
        else:
            ref_grads = dict(ref.named_parameters())
            grads = original_to_diffusers({k: p.grad for k, p in ours.named_parameters()}, cfg)
            assert all(grads[k] is not None for k in grads)
            # relative to the largest gradient anywhere too: a key bias's gradient is zero (softmax ignores it)
            floor = 1e-3 * max(p.grad.abs().max().item() for p in ref_grads.values())
            errs = {k: max_err(grads[k], ref_grads[k].grad) / max(ref_grads[k].grad.abs().max().item(), floor)
                    for k in grads}
            assert max(errs.values()) <= 1e-4, sorted(errs.items(), key=lambda kv: -kv[1])[:3]
    finally:
        ref.zero_grad(set_to_none=True)
