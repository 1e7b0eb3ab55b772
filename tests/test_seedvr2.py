"""SeedVR2 VAE: equality with the independent reference, slicing, image path, loader strictness, input checks."""

from __future__ import annotations

import math

import pytest
import torch

import turbovae
from turbovae.vae.accel.channels_last import channels_last_in_cpu_fp32
from turbovae.vae.checkpoint import CheckpointError
from turbovae.vae.seedvr2 import FastPaths, SeedVR2Config, SeedVR2VAE, build, expected_shapes
from turbovae.vae.seedvr2.layers import SeedVR2PassContext, Upsample3D
from turbovae.vae.seedvr2.shuffle import pixel_shuffle_3d

from seedvr2_reference import ReferenceSeedVR2, random_state_dict  # noqa: E402

TINY = SeedVR2Config.tiny()
REL = 1e-5


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


@pytest.fixture(scope="module")
def tiny_sd():
    return random_state_dict(expected_shapes(TINY), seed=1)


@pytest.fixture(scope="module")
def tiny_ref(tiny_sd):
    return ReferenceSeedVR2(tiny_sd, TINY.norm_groups)


def tiny_model(sd, fast=FastPaths()) -> SeedVR2VAE:
    return build(sd, TINY, fast=fast)


def clip(t, h=16, w=24, seed=0):
    return torch.rand(1, 3, t, h, w, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def latents(n, h=2, w=3, seed=0):
    return torch.randn(1, 16, n, h, w, generator=torch.Generator().manual_seed(seed))


# -- equality with the reference -------------------------------------------------------------------
@pytest.mark.parametrize("fast, t", [(FastPaths(), 1), (FastPaths(), 5), (FastPaths(), 9), (FastPaths(), 13),
                                     (FastPaths.plain(), 1), (FastPaths.plain(), 5)],
                         ids=["fast-1", "fast-5", "fast-9", "fast-13", "plain-1", "plain-5"])
def test_tiny_matches_reference(tiny_sd, tiny_ref, fast, t):
    model = tiny_model(tiny_sd, fast)
    x, z = clip(t, 24, 40, seed=t), latents((t - 1) // 4 + 1, 3, 5, seed=t)
    with torch.inference_mode():
        moments = model.encode_moments(x)
        pixels = model.decode_latents(z, clamp=False)
    ref_m, ref_p = tiny_ref.encode(x), tiny_ref.decode(z)
    assert moments.shape == ref_m.shape == (1, 32, (t - 1) // 4 + 1, 3, 5)
    assert pixels.shape == ref_p.shape == (1, 3, t, 24, 40)
    assert rel_err(moments[:, :16], ref_m[:, :16]) <= REL
    assert rel_err(moments, ref_m) <= REL
    assert rel_err(pixels, ref_p) <= REL


def test_turbovae_api_matches_reference(tiny_sd, tiny_ref):
    vae = turbovae.load_vae(tiny_sd, config=TINY, device="cpu", dtype="fp32")
    assert vae.kind == "seedvr2"
    assert vae.latent_format.scaling_factor == 0.9152 and vae.latent_format.channels == 16
    x = clip(9, 40, 24)
    mean = vae.encode(x)
    assert rel_err(mean, tiny_ref.encode(x)[:, :16]) <= REL
    z = latents(3, 5, 3) * 0.3
    assert rel_err(vae.decode(z), tiny_ref.decode(z).clamp(-1, 1)) <= REL


@pytest.mark.slow
def test_real_config_matches_reference():
    sd = random_state_dict(expected_shapes(), seed=2)
    model = build(sd)
    ref = ReferenceSeedVR2(sd, 32)
    with torch.inference_mode():
        for t, h, w in ((1, 32, 48), (5, 16, 16)):
            x = clip(t, h, w, seed=t)
            assert rel_err(model.encode_moments(x), ref.encode(x)) <= REL
            z = latents((t - 1) // 4 + 1, h // 8, w // 8, seed=t)
            assert rel_err(model.decode_latents(z, clamp=False), ref.decode(z)) <= REL


# -- slicing, streams, image path, shuffle ----------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3])
def test_temporal_slicing_equals_whole_clip(tiny_sd, n):
    model = tiny_model(tiny_sd)
    x, z = clip(13, seed=3), latents(4, seed=3)
    with torch.inference_mode():
        whole_m, whole_p = model.encode_moments(x), model.decode_latents(z, clamp=False)
        assert rel_err(model.encode_moments(x, temporal_slice=n), whole_m) <= REL
        assert rel_err(model.decode_latents(z, temporal_slice=n, clamp=False), whole_p) <= REL


def test_plain_slicing_equals_whole_clip(tiny_sd):
    model = tiny_model(tiny_sd, FastPaths.plain())
    z = latents(4, seed=4)
    with torch.inference_mode():
        assert rel_err(model.decode_latents(z, temporal_slice=1, clamp=False),
                       model.decode_latents(z, clamp=False)) <= REL


def test_streams_equal_whole_clip_and_check_lengths(tiny_sd):
    model = tiny_model(tiny_sd)
    x, z = clip(13, seed=5), latents(4, seed=5)
    with torch.inference_mode():
        with model.encode_stream() as s:
            enc = torch.cat([s.step(x[:, :, :5]), s.step(x[:, :, 5:13])], dim=2)
            with pytest.raises(ValueError, match="multiples of 4"):
                s.step(x[:, :, :3])
        with model.decode_stream() as s:
            dec = torch.cat([s.step(z[:, :, :1]), s.step(z[:, :, 1:3]), s.step(z[:, :, 3:])], dim=2)
        assert rel_err(enc, model.encode_moments(x)) <= REL
        assert rel_err(dec, model.decode_latents(z)) <= REL


def test_functional_state_matches_layout(tiny_sd):
    model = tiny_model(tiny_sd)
    z = latents(4, seed=6)
    with torch.inference_mode():
        out0, state = model.decode_step(z[:, :, :2], None)
        layout = model.cache_layout(decode=True, batch=1, height=2, width=3, first_frames=2)
        assert [s for _, s in layout] == [tuple(t.shape) for t in state]
        compact = lambda t: t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last_3d)  # noqa: E731
        assert all(compact(t) and t._base is None for t in state)  # compact copies (either layout), no views
        out1, state2 = model.decode_step(z[:, :, 2:], state)
        assert len(state2) == len(state)
        with pytest.raises(ValueError, match="causal cache"):
            model.decode_step(z[:, :, 2:], state[:-1])
    assert rel_err(torch.cat([out0, out1], 2), model.decode_latents(z)) <= REL


def test_encode_layout_shapes():
    with torch.device("meta"):
        model = SeedVR2VAE()
    layout = dict(model.cache_layout(decode=False, batch=1, height=64, width=96, first_frames=5))
    assert layout["encoder.conv_in"] == (1, 3, 2, 64, 96)
    assert layout["encoder.down_blocks.1.downsamplers.0.conv"] == (1, 256, 1, 33, 49)  # right/bottom pad kept
    assert "encoder.down_blocks.0.downsamplers.0.conv" not in layout  # k_t = 1: no memory


@pytest.mark.parametrize("t", [1, 2])
def test_image_path_equals_3d_path(tiny_sd, t):
    fast = tiny_model(tiny_sd)
    slow = tiny_model(tiny_sd, FastPaths().without("image_path"))
    x = clip(1, seed=7)
    z = latents(t, seed=7)
    with torch.inference_mode():
        assert rel_err(fast.encode_moments(x), slow.encode_moments(x)) <= REL
        assert rel_err(fast.decode_latents(z, clamp=False), slow.decode_latents(z, clamp=False)) <= REL
        img = fast.image_decoder()(z[:, :, 0])
        assert rel_err(img, slow.decode_latents(z[:, :, :1])[:, :, 0]) <= REL
        assert rel_err(fast.image_encoder()(x[:, :, 0]), slow.encode_moments(x)[:, :, 0]) <= REL


def test_head_taps_equal_padded_conv(tiny_sd):
    fast = tiny_model(tiny_sd)
    slow = tiny_model(tiny_sd, FastPaths().without("head_taps"))
    x, z = clip(5, seed=14), latents(3, seed=14)
    with torch.inference_mode():
        assert rel_err(fast.encode_moments(x), slow.encode_moments(x)) <= REL
        assert rel_err(fast.decode_latents(z, clamp=False), slow.decode_latents(z, clamp=False)) <= REL
        a, sa = fast.decode_step(z[:, :, :2], None)
        b, sb = slow.decode_step(z[:, :, :2], None)
        assert len(sa) == len(sb) and all(rel_err(p, q) <= REL for p, q in zip(sa, sb))


def test_folded_weights_follow_weight_changes(tiny_sd):
    model = tiny_model(tiny_sd)
    x = clip(1, seed=8)
    with torch.inference_mode():
        before = model.encode_moments(x)
    with torch.no_grad():
        model.encoder.conv_in.weight.mul_(2)
    with torch.inference_mode():
        after = model.encode_moments(x)
    ref = tiny_model({k: v.clone() for k, v in model.state_dict().items()}, FastPaths.plain())
    with torch.inference_mode():
        assert not torch.allclose(before, after)
        assert rel_err(after, ref.encode_moments(x)) <= REL


def test_channels_last_is_exact(tiny_sd):
    """The channels-last machinery (run here on the CPU in fp32, where passes keep it off: `channels_last_in_cpu_fp32`)
    equals the contiguous pass."""
    with channels_last_in_cpu_fp32():
        a, b = tiny_model(tiny_sd, FastPaths(channels_last=False)), tiny_model(tiny_sd)
        assert b.fast.channels_last and b.active_fast().channels_last  # the default, and it runs
        z, x = latents(3, seed=9), clip(5, seed=9)
        with torch.inference_mode():
            assert rel_err(b.decode_latents(z, clamp=False), a.decode_latents(z, clamp=False)) <= REL
            assert rel_err(b.encode_moments(x), a.encode_moments(x)) <= REL
            assert rel_err(b.decode_latents(z, temporal_slice=1), a.decode_latents(z, temporal_slice=1)) <= REL


def test_fp32_on_the_cpu_runs_contiguous_with_the_default_paths(tiny_sd):
    """channels-last is on by default, but a CPU fp32 pass runs contiguous (oneDNN's NHWC fp32 convolutions cost
    3x the plain path's error, issue 51): the weights are held contiguous, the pass's activations are contiguous,
    and it equals the pass without the switch bit for bit."""
    model, contiguous = tiny_model(tiny_sd), tiny_model(tiny_sd, FastPaths(channels_last=False))
    assert model.fast.channels_last and not model.active_fast().channels_last
    assert all(w.is_contiguous() and not w.is_contiguous(memory_format=torch.channels_last_3d)
               for w in _conv_weights(model))
    z = latents(3, seed=9)
    with torch.inference_mode():
        assert torch.equal(model.decode_latents(z), contiguous.decode_latents(z))
    with channels_last_in_cpu_fp32():
        assert model.active_fast().channels_last


def _conv_weights(model):
    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Conv3d) and m.weight.shape[2:] == (3, 3, 3)]


def test_weights_follow_the_channels_last_switch_in_place(tiny_sd):
    with channels_last_in_cpu_fp32():  # where channels-last runs
        model = tiny_model(tiny_sd)
        params = [id(w) for w in _conv_weights(model)]
        assert all(w.is_contiguous(memory_format=torch.channels_last_3d) for w in _conv_weights(model))
        model.fast = FastPaths.plain()  # the plain path reads the checkpoint's layout, as the reference does
        assert all(w.is_contiguous() for w in _conv_weights(model))
        model.fast = FastPaths()
        assert all(w.is_contiguous(memory_format=torch.channels_last_3d) for w in _conv_weights(model))
    model.fast = FastPaths()  # fp32 on the CPU: the layout its passes read, contiguous
    assert all(w.is_contiguous() for w in _conv_weights(model))
    assert [id(w) for w in _conv_weights(model)] == params  # the same Parameters: relaid, never copied beside
    assert all(torch.equal(model.state_dict()[k], v) for k, v in tiny_sd.items())


@pytest.mark.parametrize("first", [True, False])
def test_every_layer_keeps_the_channels_last_layout(first):
    """Convs large enough for oneDNN (ATen's reference kernel returns contiguous memory at small sizes): a
    channels-last pass keeps its activations channels-last through the head taps, the padded body, and both
    upsampler formulations, and matches the contiguous pass."""
    from turbovae.vae.seedvr2.layers import CausalConv3d
    from turbovae.vae.seedvr2 import subpixel

    torch.manual_seed(0)
    conv = CausalConv3d(64, 64, (3, 3, 3)).eval()
    up = Upsample3D(64, True).eval()
    x = torch.randn(1, 64, 4, 64, 64)
    prev = None if first else [torch.randn(1, 64, 2, 64, 64), torch.randn(1, 64, 2, 128, 128)]
    outs = {}
    for cl in (False, True):
        fast = FastPaths(channels_last=cl)
        for m in (conv, up):
            for p in m.modules():
                if isinstance(p, torch.nn.Conv3d):
                    p.weight.data = p.weight.data.contiguous(
                        memory_format=torch.channels_last_3d if cl else torch.contiguous_format)
        def ctx(memory):
            return SeedVR2PassContext(fast, None if first else [memory], collect=True)
        with torch.inference_mode():
            y = conv(x, ctx(prev[0] if prev else None))  # a contiguous input: the conv lays it out itself
            up_ctx = ctx(prev[1] if prev else None)
            plain_up = up.conv(up.upscale(y, up_ctx), up_ctx)
            composed = subpixel.upsample_conv(up, y, ctx(prev[1] if prev else None))
        if cl:
            for name, t in (("conv", y), ("upsampler", plain_up), ("composed upsampler", composed)):
                assert t.is_contiguous(memory_format=torch.channels_last_3d) and not t.is_contiguous(), name
        outs[cl] = (y, plain_up, composed)
    for a, b in zip(outs[False], outs[True]):
        assert rel_err(b, a) <= REL


@pytest.mark.parametrize("zr", [1, 2])
@pytest.mark.parametrize("drop_head", [False, True])
def test_native_shuffle_is_bit_exact_to_einops(zr, drop_head):
    from einops import rearrange

    if drop_head and zr == 1:
        pytest.skip("only temporal upsamplers drop the head frame")
    u = torch.randn(2, 4 * zr * 5, 3, 4, 6)
    ref = rearrange(u, "b (x y z c) f h w -> b c (f z) (h x) (w y)", x=2, y=2, z=zr)
    assert torch.equal(pixel_shuffle_3d(u, 2, zr), ref)
    up = Upsample3D(5, temporal=zr == 2)
    got = up.shuffle_into_output(u, drop_head)
    want = torch.cat([ref[:, :, :1], ref[:, :, 2:]], dim=2) if drop_head else ref
    assert torch.equal(got, want)


# -- real architecture: keys and parameters ---------------------------------------------------------
def test_real_key_set_and_parameter_count():
    with torch.device("meta"):
        model = SeedVR2VAE()
    sd = model.state_dict()
    assert len(sd) == 250
    assert sum(p.numel() for p in model.parameters()) == 250_648_227
    assert {k: tuple(v.shape) for k, v in sd.items()} == expected_shapes()
    assert sum(v.numel() for k, v in sd.items() if k.startswith("encoder.")) == 100_046_496


# -- loading -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_load_safetensors_in_each_dtype(tmp_path, tiny_sd, dtype):
    from safetensors.torch import save_file

    path = tmp_path / f"ema_vae_{dtype}.safetensors"
    stored = {k: v.to(dtype).contiguous() for k, v in tiny_sd.items()}
    save_file(stored, str(path))
    vae = turbovae.load_vae(path, config=TINY, device="cpu", dtype="fp32")
    assert vae.kind == "seedvr2" and vae.dtype == torch.float32
    for k, v in vae.state_dict().items():
        assert torch.equal(v, stored[k].float()), k
    same = turbovae.load_vae(path, config=TINY, device="cpu", dtype=dtype)
    assert same.dtype == dtype


def test_bf16_decode_close_to_fp32(tiny_sd):
    z = latents(2, seed=10) * 0.3
    f32 = turbovae.load_vae(tiny_sd, config=TINY, device="cpu", dtype="fp32").decode(z)
    b16 = turbovae.load_vae(tiny_sd, config=TINY, device="cpu", dtype="bf16").decode(z)
    assert b16.dtype == torch.bfloat16
    assert (b16.float() - f32).abs().max().item() < 0.1


def test_truncated_file_is_reported(tmp_path, tiny_sd):
    from safetensors.torch import save_file

    path = tmp_path / "ema_vae.safetensors"
    save_file(tiny_sd, str(path))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        turbovae.load_vae(path, config=TINY)


@pytest.mark.parametrize("prefix", ["vae.", "module.ema_vae.", "first_stage_model."])
def test_wrapped_and_bundled_checkpoints_load_strictly(tiny_sd, prefix, caplog):
    """Training wrappers and bundles keep the VAE under a prefix: the VAE part loads, unchanged."""
    z = latents(2, seed=3) * 0.3
    want = turbovae.load_vae(tiny_sd, config=TINY, device="cpu", dtype="fp32").decode(z)
    wrapped = {prefix + k: v for k, v in tiny_sd.items()}
    if prefix == "first_stage_model.":  # an LDM-style bundle: other models' keys sit beside the VAE
        wrapped["model.diffusion_model.out.weight"] = torch.zeros(4, 4)
    with caplog.at_level("INFO", logger="turbovae"):
        got = turbovae.load_vae(wrapped, config=TINY, device="cpu", dtype="fp32").decode(z)
    assert torch.equal(got, want)
    assert f"under '{prefix}'" in caplog.text
    assert ("1 other keys ignored" in caplog.text) == (prefix == "first_stage_model.")


def test_wrapped_checkpoint_is_still_strict(tiny_sd):
    wrapped = {"vae." + k: v for k, v in tiny_sd.items() if k != "decoder.conv_out.bias"}
    with pytest.raises(CheckpointError, match="1 missing key\\(s\\): decoder.conv_out.bias"):
        turbovae.load_vae(wrapped, config=TINY, device="cpu")


def test_inference_tensor_parameters_run_every_path(tiny_sd):
    """Weights created under inference_mode have no version counter; the derived-weight caches
    (folded taps, head taps, the upsampler's kept half) must still work and match."""
    z, x = latents(3, seed=4) * 0.3, clip(5, seed=4)
    ref = turbovae.load_vae(tiny_sd, config=TINY, device="cpu", dtype="fp32")
    want = (ref.decode(z), ref.decode(z[:, :, :1]), ref.encode(x), ref.encode(x[:, :, :1]))
    vae = turbovae.load_vae(tiny_sd, config=TINY, device="cpu", dtype="fp32")
    with torch.inference_mode():  # parameters re-created as inference tensors (ComfyUI runs nodes in this mode)
        for module in vae.model.modules():
            for name, p in list(module.named_parameters(recurse=False)):
                setattr(module, name, torch.nn.Parameter(p.detach().clone(), requires_grad=False))
    assert vae.model.decoder.conv_in.weight.is_inference()
    got = (vae.decode(z), vae.decode(z[:, :, :1]), vae.encode(x), vae.encode(x[:, :, :1]))
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_renamed_keys_are_listed(tiny_sd):
    sd = dict(tiny_sd)
    sd["decoder.conv_out.weight_renamed"] = sd.pop("decoder.conv_out.weight")
    with pytest.raises(CheckpointError) as e:
        build(sd, TINY)
    msg = str(e.value)
    assert "1 missing key(s): decoder.conv_out.weight" in msg
    assert "1 unexpected key(s): decoder.conv_out.weight_renamed" in msg
    assert "looks like SeedVR2" in msg


def test_wrong_shape_and_2d_conv_are_rejected(tiny_sd):
    sd = dict(tiny_sd)
    sd["encoder.conv_in.weight"] = torch.zeros(8, 3, 1, 3, 3)
    with pytest.raises(CheckpointError, match=r"wrong-shape key\(s\): encoder.conv_in.weight \(8, 3, 1, 3, 3\)"):
        build(sd, TINY)
    sd = dict(tiny_sd)
    sd["decoder.conv_in.weight"] = sd["decoder.conv_in.weight"][:, :, 1]
    with pytest.raises(CheckpointError, match="2-D .*decoder.conv_in.weight"):
        turbovae.load_vae(sd, config=TINY)


def test_missing_real_key_and_wrong_models():
    shapes = expected_shapes()
    sd = {k: torch.empty(s, device="meta") for k, s in shapes.items() if "attentions" not in k}
    with pytest.raises(CheckpointError, match="20 missing key"):
        build(sd)
    sd_kl = {"decoder.up_blocks.0.resnets.0.norm1.weight": torch.zeros(512),
             "decoder.up_blocks.0.resnets.0.conv1.weight": torch.zeros(512, 512, 3, 3)}
    with pytest.raises(CheckpointError, match="looks like SD-style"):
        build(sd_kl)
    with pytest.raises(CheckpointError, match="SD-style"):
        turbovae.load_vae(sd_kl)


def test_wan_dict_is_named_as_wan():
    wan = pytest.importorskip("turbovae.vae.wan")
    table = wan.expected_shapes(wan.WAN21)
    sd = {k: torch.empty(s, device="meta") for k, s in table.items()}
    with pytest.raises(CheckpointError, match="looks like Qwen-Image / Wan 2.1"):
        build(sd)


# -- TurboVAE behaviour on this architecture ----------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_vae(tiny_sd):
    return turbovae.load_vae(tiny_sd, config=TINY, device="cpu", dtype="fp32")


def test_sample_draws_from_posterior(tiny_vae):
    x = clip(5, seed=11)
    moments = tiny_vae.encode_moments(x)
    mean, logvar = moments.chunk(2, dim=1)
    s = tiny_vae.encode(x, sample=True, generator=torch.Generator().manual_seed(3))
    eps = torch.randn(mean.shape, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(s, mean + torch.exp(0.5 * logvar.clamp(-30, 20)) * eps, atol=1e-6)
    assert not torch.allclose(s, tiny_vae.encode(x))
    assert torch.equal(tiny_vae.encode(x), mean)


@pytest.mark.parametrize("bad, match", [
    (torch.zeros(3, 32, 32), "4-D for a single frame"),
    (torch.zeros(1, 4, 1, 32, 32), "3 channels"),
    (torch.zeros(1, 3, 1, 32, 32, dtype=torch.int64), "floating-point"),
    (torch.zeros(1, 3, 1, 30, 32), "multiples of 8"),
    (torch.zeros(1, 3, 0, 32, 32), "empty"),
    (torch.full((1, 3, 1, 32, 32), float("nan")), "NaN"),
    (torch.full((1, 3, 1, 32, 32), float("inf")), "NaN or inf"),
])
def test_bad_pixels_raise_value_error(tiny_vae, bad, match):
    with pytest.raises(ValueError, match=match):
        tiny_vae.encode(bad)


def test_bad_latents_raise_value_error(tiny_vae):
    with pytest.raises(ValueError, match="16 channels"):
        tiny_vae.decode(torch.zeros(1, 4, 1, 4, 4))
    with pytest.raises(ValueError, match="temporal_slice"):
        tiny_vae.decode(torch.zeros(1, 16, 3, 4, 4), temporal_slice=0)


def test_non_4n1_clip_is_padded_and_trimmed(tiny_vae):
    x = clip(6, seed=12)
    z = tiny_vae.encode(x)
    assert z.shape[2] == 3  # 6 frames -> padded to 9 -> 3 latents
    padded = torch.cat([x, x[:, :, -1:].expand(-1, -1, 3, -1, -1)], dim=2)
    assert torch.equal(z, tiny_vae.encode(padded))
    out = tiny_vae.decode(z, num_frames=6)
    assert out.shape == (1, 3, 6, 16, 24)
    assert torch.equal(out, tiny_vae.decode(z)[:, :, :6])
    img = tiny_vae.decode(tiny_vae.encode(x[:, :, 0]))
    assert img.shape == (1, 3, 16, 24)  # 4-D in, 4-D out


def test_decode_step_exports_with_explicit_memory(tiny_sd):
    """The engines' video slice graph: latents + memory in, pixels + new memory out, via torch.export."""
    from turbovae.vae.memory.cpu_conv import pytorch_kernels
    from turbovae.vae.norms import native_channels_last_group_norm

    model = tiny_model(tiny_sd)
    z = latents(3, seed=13)
    # The exported graph holds PyTorch's group-norm op (traced code leaves the norm to the compiler) and its conv3d
    # (eager runs oneDNN where PyTorch would not: vae/memory/cpu_conv.py); the eager side runs the same kernels, so
    # the two compare bit for bit (eager's stable channels-last statistics differ in the last bits:
    # tests/test_norm_stats.py)
    with torch.inference_mode(), native_channels_last_group_norm(), pytorch_kernels():
        _, state = model.decode_step(z[:, :, :2], None)
        want, want_state = model.decode_step(z[:, :, 2:], state)

    class SliceStep(torch.nn.Module):
        def __init__(self, vae):
            super().__init__()
            self.vae = vae

        def forward(self, latent_slice, *memory):
            pixels, new_memory = self.vae.decode_step(latent_slice, memory)
            return (pixels, *new_memory)

    program = torch.export.export(SliceStep(model), (z[:, :, 2:], *state))
    got = program.module()(z[:, :, 2:], *state)
    assert len(got) == 1 + len(want_state)
    assert torch.equal(got[0], want)
    assert all(torch.equal(a, b) for a, b in zip(got[1:], want_state))


@pytest.mark.parametrize("grad_of", ["inputs", "weights"])
def test_raw_forward_with_grad_backpropagates_like_the_reference(tiny_sd, grad_of, monkeypatch):
    """A raw forward with autograd recording (no inference_mode; the input or the weights require grad) runs the
    plain GroupNorm instead of the channels-last one (its out= ops are not differentiable): outputs as the
    inference pass's, gradients as the reference's. Under inference_mode the channels-last norm still runs."""
    from turbovae.vae import norms

    calls = []
    channels_last_norm = norms.group_norm_channels_last
    monkeypatch.setattr(norms, "group_norm_channels_last", lambda *a, **k: calls.append(1) or channels_last_norm(*a, **k))
    with channels_last_in_cpu_fp32():  # the channels-last pass, built in its layout (no re-layout inside a pass)
        _grad_matches_the_reference(tiny_sd, grad_of, calls)


def _grad_matches_the_reference(tiny_sd, grad_of, calls):
    model = tiny_model(tiny_sd)
    x, z = clip(5, seed=11), latents(2, seed=11)
    with torch.inference_mode():
        fast = (model.decode_latents(z, clamp=False), model.encode_moments(x))
    assert calls  # the channels-last norm served the inference passes
    x, z = x.clone(), z.clone()
    if grad_of == "inputs":
        x.requires_grad_(True)
        z.requires_grad_(True)
    else:
        model.requires_grad_(True)
    outs = (model.decode_latents(z, clamp=False), model.encode_moments(x))
    assert [rel_err(a, b) <= REL for a, b in zip(outs, fast)] == [True, True]
    (outs[0].square().sum() + outs[1].square().sum()).backward()

    sd = {k: v.detach().clone().requires_grad_(grad_of == "weights") for k, v in tiny_sd.items()}
    ref = ReferenceSeedVR2(sd, TINY.norm_groups)
    xr, zr = x.detach().clone().requires_grad_(True), z.detach().clone().requires_grad_(True)
    (ref.decode(zr).square().sum() + ref.encode(xr).square().sum()).backward()
    if grad_of == "inputs":
        assert rel_err(z.grad, zr.grad) <= 1e-4 and rel_err(x.grad, xr.grad) <= 1e-4
    else:
        # relative to the largest gradient anywhere too: a key bias's gradient is zero (softmax ignores it)
        floor = 1e-3 * max(g.grad.abs().max().item() for g in sd.values())
        errs = {k: (p.grad - sd[k].grad).abs().max().item() / max(sd[k].grad.abs().max().item(), floor)
                for k, p in model.named_parameters()}
        assert max(errs.values()) <= 1e-4, sorted(errs.items(), key=lambda kv: -kv[1])[:3]
