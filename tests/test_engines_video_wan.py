"""Wan 2.1 and Wan 2.2 clips on video slice engines, end to end: `python -m turbovae build-engines --video` for
a Wan checkpoint the test writes (a diffusers folder: safetensors + config.json, the tiny configs with the real
topology; Wan 2.2 with its released 48 latent channels and patchified 16x layout), loaded back with
`turbovae.load_vae(engine_folder)`, and decoded at 5, 9 and 21 frames (2, 3 and 6 latents) against eager.
Off-bucket sizes run the PyTorch VAE exactly, and engines of one architecture never serve another.

As in tests/test_engines_video.py, Inductor's minutes-long C++ compile is swapped for a plain
`torch.export` save/load (`export_only`); everything else is the production path. The real compile runs with
TURBOVAE_COMPILE_TESTS=1.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import turbovae
from turbovae import cli
from turbovae.trt import engine_vae
from turbovae.trt.buckets import Bucket, static_table
from turbovae.trt.build import build_engine_set
from turbovae.trt.engine_set import EngineSet
from turbovae.trt.engine_vae import EngineFallbackWarning, EngineVAE
from turbovae.trt.identity import IdentityError, model_hash
from turbovae.trt.video import default_slice_latents
from turbovae.vae.api import TurboVAE
from turbovae.vae.wan import TINY_WAN21, TINY_WAN22, WanVAE
from turbovae.vae.wan.config import diffusers_kwargs

from engines_toy import export_only, manifest_identity

# Wan 2.2 as released has 48 latent channels; the tiny config's 6 would not exercise that width.
TINY_WAN22_48CH = replace(TINY_WAN22, z_dim=48)
ARCHS = {  # kind -> (config, bucket WxH px, --slice-latents: None = the build's default)
    "wan2.1": (TINY_WAN21, "48x32", None),  # latents 6x4 (8x)
    "wan2.2": (TINY_WAN22_48CH, "64x48", 3),  # latents 4x3 (16x: 2x2 patches over an 8x decoder)
}
CLIP_LATENTS = (2, 3, 6)  # 5, 9 and 21 frames


def _write_checkpoint(folder: Path, cfg) -> Path:
    """A diffusers-layout Wan VAE folder (AutoencoderKLWan config + safetensors) with seeded weights."""
    torch.manual_seed(0)
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in WanVAE(cfg).state_dict().items()},
              str(folder / "diffusion_pytorch_model.safetensors"))
    (folder / "config.json").write_text(json.dumps(dict(diffusers_kwargs(cfg), _class_name="AutoencoderKLWan")))
    return folder


@pytest.fixture(scope="module", params=list(ARCHS))
def built(request, tmp_path_factory):
    """(kind, checkpoint folder, engine folder, eager TurboVAE, engine VAE), built through the CLI."""
    kind = request.param
    cfg, bucket, k = ARCHS[kind]
    root = tmp_path_factory.mktemp(f"{kind}_video")
    ckpt = _write_checkpoint(root / f"{kind}_vae", cfg)
    out = root / "engines"
    with export_only():
        code = cli.main(["build-engines", "--vae", str(ckpt), "--out", str(out), "--static", bucket, "--backend",
                         "aoti", "--dtype", "fp32", "--device", "cpu", "--components", "decoder", "--video",
                         *(["--slice-latents", str(k)] if k else [])])
        assert code == 0
        ev = turbovae.load_vae(out)  # the engine folder; its PyTorch path is the checkpoint it records
    eager = turbovae.load_vae(ckpt, device="cpu")
    assert isinstance(ev, EngineVAE) and ev.engines is not None and ev.kind == eager.kind == kind
    return kind, ckpt, out, eager, ev


def _latents(vae: TurboVAE, t: int, hw, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, vae.latent_format.channels, t, *hw, generator=torch.Generator().manual_seed(seed))


def _bucket_latents(kind: str, vae: TurboVAE) -> tuple[int, int]:
    b = Bucket.parse(ARCHS[kind][1])
    f = vae.latent_format.spatial_factor
    return b.height // f, b.width // f


@pytest.mark.slow
def test_cli_writes_the_first_next_pair_with_the_models_memory_layout(built):
    kind, ckpt, out, eager, _ev = built
    h, w = _bucket_latents(kind, eager)
    bucket = ARCHS[kind][1]
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([f"decoder_{bucket}.pt2", f"decode_slice_first_{bucket}.pt2",
                            f"decode_slice_next_{bucket}.pt2", "manifest.json"])
    first = manifest_identity(out, f"decode_slice_first_{bucket}.pt2")
    nxt = manifest_identity(out, f"decode_slice_next_{bucket}.pt2")
    k = ARCHS[kind][2] or default_slice_latents(torch.device("cpu"))
    layout = eager.model.cache_layout(decode=True, batch=1, height=h, width=w, first_frames=1 + k)
    c = eager.latent_format.channels
    assert c == (48 if kind == "wan2.2" else 4)
    assert first.model_kind == nxt.model_kind == kind and first.source == str(ckpt.resolve())
    assert tuple(first.input_shapes["latents"]) == (1, c, 1 + k, h, w)
    assert tuple(nxt.input_shapes["latents"]) == (1, c, k, h, w)
    assert len(first.output_names) == len(nxt.input_names) == len(nxt.output_names) == 1 + len(layout)
    assert [tuple(nxt.input_shapes[n]) for n in nxt.input_names[1:]] == [tuple(s) for _name, s in layout]


@pytest.mark.slow
def test_chain_equals_eager_at_5_9_and_21_frames(built):
    kind, _ckpt, _out, eager, ev = built
    hw = _bucket_latents(kind, eager)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EngineFallbackWarning)
        for n, t in enumerate(CLIP_LATENTS, start=1):
            z = _latents(eager, t, hw)
            with export_only():
                out = ev.decode(z)
            k = ARCHS[kind][2] or default_slice_latents(torch.device("cpu"))
            whole, sliced = eager.decode(z), eager.decode(z, temporal_slice=k)
            assert out.shape == (1, 3, 1 + 4 * (t - 1), *(s * eager.latent_format.spatial_factor for s in hw))
            err_whole, err_sliced = (out - whole).abs().max().item(), (out - sliced).abs().max().item()
            print(f"{kind} {out.shape[2]} frames: chain vs eager whole clip {err_whole:.2e}, vs sliced {err_sliced:.2e}")
            assert err_whole <= 1e-4 and err_sliced <= 1e-4
            assert ev.engine_calls == n  # every clip ran on the engines
        with export_only():
            image = ev.decode(_latents(eager, 1, hw)[:, :, 0])  # 4-D image latents: the image decoder engine
        assert image.shape[:2] == (1, 3) and ev.engine_calls == len(CLIP_LATENTS) + 1


@pytest.mark.slow  # the module's engines: an AOTInductor build per architecture
def test_off_bucket_clips_fall_back_to_eager_exactly(built):
    kind, _ckpt, _out, eager, ev = built
    h, w = _bucket_latents(kind, eager)
    inside, outside = _latents(eager, 3, (h, w - 1)), _latents(eager, 3, (h + 1, w))
    calls = ev.engine_calls
    with export_only():
        with pytest.warns(EngineFallbackWarning, match="compute exactly"):
            got_inside = ev.decode(inside)
        with pytest.warns(EngineFallbackWarning, match="outside every"):
            got_outside = ev.decode(outside)
    assert torch.equal(got_inside, eager.decode(inside)) and torch.equal(got_outside, eager.decode(outside))
    assert ev.engine_calls == calls  # nothing ran on the engines, and the bucket size still does:
    with export_only(), warnings.catch_warnings():
        warnings.simplefilter("error", EngineFallbackWarning)
        ev.decode(_latents(eager, 2, (h, w)))
    assert ev.engine_calls == calls + 1


@pytest.fixture(scope="module")
def seedvr2_engines(tmp_path_factory):
    """Tiny SeedVR2 video engines at the Wan 2.1 bucket size. The refusal is by model kind, before anything
    runs: shapes tell the two apart only by chance (the tiny configs' latent channels, 16 vs 4 or 48)."""
    from turbovae.vae.seedvr2 import SeedVR2Config, SeedVR2VAE

    torch.manual_seed(0)
    model = SeedVR2VAE(SeedVR2Config.tiny()).eval()
    folder = tmp_path_factory.mktemp("seedvr2_video") / "set"
    with export_only():
        build_engine_set(TurboVAE(model, source="tiny seedvr2"), folder, static_table(Bucket.parse("48x32")),
                         backend="aoti", device=torch.device("cpu"), components=(), video=True)
    return folder, model


@pytest.mark.slow
def test_engines_of_another_architecture_are_never_used(built, seedvr2_engines, monkeypatch):
    """SeedVR2 video engines for a Wan model and Wan video engines for a SeedVR2 model: refused by kind at load
    (one warning, the PyTorch path) and when put together by hand (IdentityError naming the fix)."""
    kind, ckpt, out, eager, _ev = built
    s_folder, s_model = seedvr2_engines
    with pytest.warns(EngineFallbackWarning, match="built for a seedvr2 VAE, the fallback is " + kind):
        wan_on_seedvr2 = engine_vae.load_engine_vae(s_folder, fallback=ckpt)
    assert wan_on_seedvr2.engines is None
    z = _latents(eager, 3, _bucket_latents(kind, eager))
    assert torch.equal(wan_on_seedvr2.decode(z), eager.decode(z))
    with pytest.raises(IdentityError, match=f"built for a seedvr2 VAE cannot serve a {kind} model"):
        EngineVAE(eager.model, EngineSet(s_folder, "cpu", lazy=True))
    # The other way round: the Wan folder with a SeedVR2 model as its PyTorch path.
    monkeypatch.setattr(engine_vae, "load_checkpoint", lambda *_a, **_k: TurboVAE(s_model, source="tiny seedvr2"))
    with pytest.warns(EngineFallbackWarning, match=f"built for a {kind} VAE, the fallback is seedvr2"):
        seedvr2_on_wan = engine_vae.load_engine_vae(out, fallback=ckpt)
    assert seedvr2_on_wan.engines is None
    with pytest.raises(IdentityError, match=f"built for a {kind} VAE cannot serve a seedvr2 model"):
        EngineVAE(s_model, EngineSet(out, "cpu", lazy=True))


def _real_compile_chain(tmp_path: Path, kind: str) -> list[float]:
    cfg, bucket, k = ARCHS[kind]
    torch.manual_seed(0)
    model = WanVAE(cfg).eval().requires_grad_(False)
    build_engine_set(TurboVAE(model), tmp_path / kind, static_table(Bucket.parse(bucket)), backend="aoti",
                     device=torch.device("cpu"), components=(), video=True, slice_latents=k)
    ev = EngineVAE(model, EngineSet(tmp_path / kind, "cpu", model_hash=model_hash(model.state_dict())))
    eager = TurboVAE(model)
    errors = []
    for t in CLIP_LATENTS:
        z = _latents(eager, t, _bucket_latents(kind, eager))
        errors.append((ev.decode(z) - eager.decode(z)).abs().max().item())
    assert ev.engine_calls == len(CLIP_LATENTS)
    return errors


@pytest.mark.skipif(os.environ.get("TURBOVAE_COMPILE_TESTS") != "1",
                    reason="Inductor compile of both slice graphs takes ~1 min per architecture on CPU; set "
                           "TURBOVAE_COMPILE_TESTS=1")
@pytest.mark.parametrize("kind", list(ARCHS))
def test_real_aoti_compile_chain_on_cpu(tmp_path, kind):
    errors = _real_compile_chain(tmp_path, kind)
    print(f"{kind} compiled AOTInductor chain vs eager at 5/9/21 frames: max abs {', '.join(f'{e:.2e}' for e in errors)}")
    assert max(errors) <= 1e-4


def test_a_model_without_the_causal_step_contract_is_refused_naming_the_fix():
    from torch import nn

    from turbovae.trt.video import check_video_model, supports_video

    assert supports_video(WanVAE(TINY_WAN21)) and supports_video(WanVAE(TINY_WAN22_48CH))
    with pytest.raises(ValueError, match=r"decode_step and cache_layout.*drop --video"):
        check_video_model(nn.Conv2d(4, 3, 1))


class _FakeSliceEngine:
    """A LoadedEngine double: pixels filled with the latents' first value (so the order is visible), memory +1."""

    def __init__(self, name: str, frames: int, hw=(8, 8), dtype=torch.float32):
        self.path, self.frames, self.hw, self.dtype = Path(name), frames, hw, dtype

    def run(self, inputs, profile=0):
        z = inputs["latents"]
        memory = inputs.get("memory_0", torch.zeros(1))
        pixels = torch.full((1, 3, self.frames, *self.hw), float(z.flatten()[0]), dtype=self.dtype)
        return {"pixels": pixels, "memory_0_out": memory + 1}


def test_chain_writes_each_slice_in_place_and_refuses_a_slice_that_does_not_fit():
    from turbovae.trt.interface import EngineRunError
    from turbovae.trt.video import chain_slices

    names = (("latents",), ("pixels", "memory_0_out")), (("latents", "memory_0"), ("pixels", "memory_0_out"))
    z = torch.arange(5.0).reshape(1, 1, 5, 1, 1)  # latent t holds the value t
    clip = chain_slices(_FakeSliceEngine("first", 5), names[0], _FakeSliceEngine("next", 4), names[1], z, 4,
                        first_latents=2, next_latents=1)
    assert clip.shape == (1, 3, 5 + 3 * 4, 8, 8)
    assert [clip[0, 0, f, 0, 0].item() for f in (0, 4, 5, 8, 9, 13, 16)] == [0, 0, 2, 2, 3, 4, 4]
    for bad in (_FakeSliceEngine("next", 4, hw=(8, 9)), _FakeSliceEngine("next", 4, dtype=torch.float16),
                _FakeSliceEngine("next", 3)):
        with pytest.raises(EngineRunError, match="next: pixels"):
            chain_slices(_FakeSliceEngine("first", 5), names[0], bad, names[1], z, 4, first_latents=2, next_latents=1)


@pytest.mark.parametrize("latents", [2, 3, 4, 5, 6])
def test_chain_of_k_latent_slices_pads_the_last_slice_and_crops_its_pixels(latents):
    """First slice 1 + 2 latents (9 frames), next slices 2 latents (8 frames): a clip that does not fill its
    last slice (or its first) runs on zero latents appended at the end, whose frames are cropped."""
    from turbovae.trt.video import chain_slices, padded_latents

    names = (("latents",), ("pixels", "memory_0_out")), (("latents", "memory_0"), ("pixels", "memory_0_out"))
    z = torch.arange(1.0, latents + 1).reshape(1, 1, latents, 1, 1)  # latent t holds t + 1; padding holds 0
    first, nxt = _FakeSliceEngine("first", 9), _FakeSliceEngine("next", 8)
    clip = chain_slices(first, names[0], nxt, names[1], z, 4, first_latents=3, next_latents=2)
    assert clip.shape[2] == 1 + 4 * (latents - 1)
    starts = [1] + [t + 1 for t in range(3, padded_latents(latents, 3, 2), 2)]  # each call's first latent value
    expect = [1] * 9 + [v for v in starts[1:] for _ in range(8)]
    assert [clip[0, 0, f, 0, 0].item() for f in range(clip.shape[2])] == expect[:clip.shape[2]]
    assert padded_latents(latents, 3, 2) == {2: 3, 3: 3, 4: 5, 5: 5, 6: 7}[latents]


@pytest.mark.parametrize("extra, message", [(["--slice-latents", "2"], "add --video"),
                                            (["--video", "--slice-latents", "0"], "from 1 to")])
def test_slice_latents_misuse_is_refused_before_the_checkpoint_loads(tmp_path, capsys, extra, message):
    code = cli.main(["build-engines", "--vae", str(tmp_path / "none"), "--out", str(tmp_path / "e"), "--static",
                     "48x32", "--backend", "aoti", "--device", "cpu", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "none" not in err  # the missing checkpoint was never reached


@pytest.mark.slow
def test_bench_clip_rows_time_engine_and_eager_in_one_run():
    """bench/engines.py's clip case (quick size): eager (the reference), eager sliced and the slice-engine chain
    on the same latents, each with its peak memory; the chain runs on the engines and matches eager."""
    from turbovae.bench.common import BenchOptions
    from turbovae.bench.engines import clip_cases, clip_rows

    opts = BenchOptions(quick=True, repeat=1, warmup=0)
    (case,) = [c for c in clip_cases(cuda=False, quick=True) if c.family == "wan2.2"]
    with export_only():
        rows = clip_rows(case, opts, torch.device("cpu"), torch.float32)
    assert [r.variant for r in rows] == ["eager", "eager sliced (2 latents/slice)", "aoti slice chain"]
    eager, _sliced, chain = rows
    assert eager.reference and eager.case == chain.case == "tiny wan2.2 clip decode 64x64x9 float32"
    assert chain.note == "" and chain.baseline_ms == eager.ms and chain.max_abs_err <= 1e-4
    assert all(r.ms > 0 for r in rows)
    from turbovae.bench import peak_rss

    if peak_rss.supported():
        assert all(r.peak_mb is not None for r in rows)
