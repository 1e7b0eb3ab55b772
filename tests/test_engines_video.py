"""SeedVR2 video slice engines (decode_slice_first / decode_slice_next) built and run end to end through
the AOTInductor backend: the chain equals the eager sliced and whole-clip decode, num_frames and
padding keep the requested size, and every failure (no bucket, missing or corrupt next engine) gives
one warning and the PyTorch result.

Inductor's C++ compile of the two slice graphs takes 1-2 minutes on a 2-core CPU, so most tests swap
only that step (and the matching load) for `torch.export.save` / `torch.export.load`: everything else —
export with the recorded static shapes, atomic writes, identities, routing, padding, chaining, fallback
— is the production path. The real compile runs in the CUDA test and, on CPU, with
TURBOVAE_COMPILE_TESTS=1.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from turbovae.vae.measuring import psnr
from turbovae.trt.buckets import Bucket, multi_profile_table, static_table
from turbovae.trt.build import build_engine_set
from turbovae.trt.engine_set import EngineSet
from turbovae.trt.engine_vae import ApproximateResultWarning, EngineFallbackWarning, EngineVAE
from turbovae.trt.fileio import file_sha256
from turbovae.trt.identity import model_hash
from turbovae.trt.video import default_slice_latents
from turbovae.vae.api import TurboVAE

from engines_toy import edit_manifest, export_only, manifest_identity

BUCKET = Bucket(32, 48)  # latents 4x6 for the 8x SeedVR2 VAE
LATENT_HW = (4, 6)
FILES = ("decoder_48x32.pt2", "decode_slice_first_48x32.pt2", "decode_slice_next_48x32.pt2")


def _seedvr2():
    from turbovae.vae.seedvr2.config import SeedVR2Config
    from turbovae.vae.seedvr2.model import SeedVR2VAE

    torch.manual_seed(0)
    return SeedVR2VAE(SeedVR2Config.tiny()).eval()


def _latents(t: int, hw=LATENT_HW, seed: int = 2, batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, 16, t, *hw, generator=torch.Generator().manual_seed(seed))


def _lazy_engine_vae(folder: Path, model) -> EngineVAE:
    """Identities checked now, packages loaded on first use (run it under `export_only()`)."""
    return EngineVAE(model, EngineSet(folder, "cpu", model_hash=model_hash(model.state_dict()), lazy=True))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("video_engines")
    model = _seedvr2()
    with export_only():
        paths = build_engine_set(TurboVAE(model, source="tiny seedvr2"), root / "set", static_table(BUCKET),
                                 backend="aoti", device=torch.device("cpu"), components=("decoder",), video=True)
    return root, model, paths


@pytest.fixture(scope="module")
def engines(built):
    """One loaded engine set shared by the tests that only run it (loading a package takes seconds)."""
    with export_only():
        return EngineSet(built[0] / "set", "cpu", model_hash=model_hash(built[1].state_dict()))


def _copy(built, name: str) -> Path:
    dst = built[0] / name
    shutil.copytree(built[0] / "set", dst)
    return dst


@pytest.mark.slow
def test_build_writes_named_pairs_with_identity(built):
    root, model, paths = built
    assert [p.name for p in paths] == list(FILES)
    assert all(p.is_file() for p in paths) and (paths[0].parent / "manifest.json").is_file()
    first, nxt = (manifest_identity(paths[0].parent, p.name) for p in paths[1:3])
    n_mem = len(model.cache_layout(decode=True, batch=1, height=4, width=6))
    assert first.input_names == ("latents",) and len(first.output_names) == 1 + n_mem
    assert nxt.input_names[0] == "latents" and len(nxt.input_names) == len(nxt.output_names) == 1 + n_mem
    k = default_slice_latents(torch.device("cpu"))  # the build's default: eager's fastest slice on CPU
    assert tuple(first.input_shapes["latents"]) == (1, 16, 1 + k, 4, 6)
    assert tuple(nxt.input_shapes["latents"]) == (1, 16, k, 4, 6)
    assert first.model_kind == "seedvr2" and first.entries == (0,) and first.engine_sha256 == file_sha256(paths[1])


@pytest.mark.slow
def test_chain_equals_eager_sliced_and_whole_clip_decode(built, engines):
    _root, model, _ = built
    ev = EngineVAE(model, engines)
    vae = TurboVAE(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EngineFallbackWarning)
        for t in (2, 4):  # first slice only; first + two next slices
            z = _latents(t)
            out = ev.decode(z, temporal_slice=3)  # the caller's slicing does not apply to engines
            with torch.inference_mode():
                sliced = model.decode_latents(z, temporal_slice=1)
                whole = model.decode_latents(z)
            assert out.shape == (1, 3, 1 + 4 * (t - 1), 32, 48)
            err_sliced, err_whole = (out - sliced).abs().max().item(), (out - whole).abs().max().item()
            print(f"T={t}: chain vs eager sliced {err_sliced:.2e}, vs whole clip {err_whole:.2e}")
            assert err_sliced <= 1e-5 and err_whole <= 1e-5
        assert ev.engine_calls == 2
        z = _latents(2, batch=2)
        trimmed = ev.decode(z, num_frames=3)  # trimming and batches follow TurboVAE.decode
        assert trimmed.shape == (2, 3, 3, 32, 48) and ev.engine_calls == 3
        assert (trimmed - vae.decode(z, num_frames=3)).abs().max() <= 1e-5
        image = ev.decode(_latents(1)[:, :, 0])  # 4-D image latents still use the image engine
        assert image.shape == (1, 3, 32, 48) and ev.engine_calls == 4


@pytest.mark.slow  # the module's engines: an AOTInductor build of both slice graphs
def test_off_bucket_clip_runs_on_pytorch_or_padded_when_opted_in(built, engines):
    _root, model, _ = built
    z = _latents(3, hw=(3, 5))  # 40x24 px: smaller than the 48x32 bucket
    ev = EngineVAE(model, engines)
    with pytest.warns(EngineFallbackWarning, match="compute exactly"):
        exact = ev.decode(z)
    assert torch.equal(exact, TurboVAE(model).decode(z)) and ev.engine_calls == 0
    engines.pad_to_bucket = True
    try:
        ev = EngineVAE(model, engines)
        with warnings.catch_warnings(), pytest.warns(ApproximateResultWarning, match="approximate"):
            warnings.simplefilter("error", EngineFallbackWarning)
            out = ev.decode(z)
    finally:
        engines.pad_to_bucket = False
    assert out.shape == (1, 3, 9, 24, 40) and ev.engine_calls == 1
    with torch.inference_mode():
        ref = model.decode_latents(z)
    print(f"padded clip PSNR vs eager: {psnr(out, ref):.1f} dB")
    assert psnr(out, ref) > 15  # random weights: attention and border convs see the padding (docs/engines.md)


@pytest.mark.slow  # the module's engines: an AOTInductor build of both slice graphs
def test_clip_outside_every_bucket_falls_back_with_one_warning(built, engines):
    _root, model, _ = built
    ev = EngineVAE(model, engines)
    z = _latents(3, hw=(6, 6))  # 48x48 px: taller than the 48x32 bucket
    with pytest.warns(EngineFallbackWarning, match="outside every"):
        out = ev.decode(z)
    assert torch.equal(out, TurboVAE(model).decode(z)) and ev.engine_calls == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", EngineFallbackWarning)
        ev.decode(z)  # same size again: no second warning
        ev.decode(_latents(2))  # a bucket size still runs on the engines
    assert ev.engine_calls == 1


@pytest.mark.slow  # the module's engines: an AOTInductor build of both slice graphs
def test_missing_next_engine_falls_back_and_keeps_image_engine(built):
    _root, model, _ = built
    folder = _copy(built, "no_next")
    (folder / FILES[2]).unlink()
    edit_manifest(folder, FILES[2], drop=True)
    ev = _lazy_engine_vae(folder, model)
    z = _latents(3)
    with pytest.warns(EngineFallbackWarning, match="no decode_slice_next"):
        out = ev.decode(z)
    assert torch.equal(out, TurboVAE(model).decode(z)) and ev.engine_calls == 0
    with export_only(), warnings.catch_warnings():
        warnings.simplefilter("error", EngineFallbackWarning)
        ev.decode(z)  # the video path stays off: no second warning
        ev.decode(_latents(1))
    assert ev.engine_calls == 1  # the image decoder engine is unaffected


@pytest.mark.slow
def test_corrupt_next_engine_falls_back(built):
    """A next engine that passes its identity check (manifest rewritten to match) but cannot load."""
    _root, model, _ = built
    folder = _copy(built, "corrupt_next")
    eng = folder / FILES[2]
    eng.write_bytes(b"not an engine")
    edit_manifest(folder, FILES[2], engine_sha256=file_sha256(eng), engine_bytes=eng.stat().st_size)
    ev = _lazy_engine_vae(folder, model)
    z = _latents(3)
    with export_only(), pytest.warns(EngineFallbackWarning, match="decode_slice_next"):
        out = ev.decode(z)
    assert torch.equal(out, TurboVAE(model).decode(z)) and ev.engine_calls == 0


@pytest.mark.slow  # the module's engines: an AOTInductor build of both slice graphs
def test_build_refuses_to_overwrite_before_any_work(built, tmp_path):
    root, model, _ = built
    with pytest.raises(FileExistsError, match="overwrite"):
        build_engine_set(TurboVAE(model), root / "set", static_table(BUCKET), backend="aoti",
                         device=torch.device("cpu"), components=(), video=True)
    folder = tmp_path / "partial"
    folder.mkdir()
    (folder / FILES[2]).write_bytes(b"someone else's engine")
    with pytest.raises(FileExistsError, match=FILES[2]):
        build_engine_set(TurboVAE(model), folder, static_table(BUCKET), backend="aoti", device=torch.device("cpu"),
                         components=(), video=True)
    assert sorted(p.name for p in folder.iterdir()) == [FILES[2]]  # nothing else was written


def test_video_engines_need_seedvr2_and_static_buckets(tmp_path):
    # (A Wan VAE now has the same causal-step contract, so it is no longer refused here; its video engines
    # are tested with them.)
    seedvr2 = TurboVAE(_seedvr2())
    with pytest.raises(ValueError, match="static-shape"):
        build_engine_set(seedvr2, tmp_path / "dyn", multi_profile_table(), backend="aoti",
                         device=torch.device("cpu"), video=True)
    with pytest.raises(ValueError, match="video=True"):
        build_engine_set(seedvr2, tmp_path / "c", static_table(BUCKET), backend="aoti", device=torch.device("cpu"),
                         components=("decode_slice_first",))
    with pytest.raises(ValueError, match="nothing to build"):
        build_engine_set(seedvr2, tmp_path / "e", static_table(BUCKET), backend="aoti", device=torch.device("cpu"),
                         components=())
    assert not any(tmp_path.iterdir())


@pytest.mark.slow  # the module's engines: an AOTInductor build of both slice graphs
def test_fp32_slice_engines_under_bf16_model(built, engines):
    """Model bf16, engines fp32: latents are cast in, pixels cast back out; only rounding differs."""
    _root, model, _ = built
    ev = EngineVAE(_seedvr2().to(torch.bfloat16), engines)
    z = _latents(3)
    out = ev.decode(z)
    assert out.dtype is torch.bfloat16 and ev.engine_calls == 1
    with torch.inference_mode():
        ref = model.decode_latents(z, temporal_slice=1)
    print(f"fp32 chain under a bf16 model vs fp32 eager: PSNR {psnr(out, ref):.1f} dB")
    assert psnr(out, ref) >= 40


def _real_compile_chain(tmp_path: Path, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, int]:
    model = _seedvr2().to(device)
    build_engine_set(TurboVAE(model), tmp_path / "real", static_table(BUCKET), backend="aoti", dtype=dtype,
                     device=torch.device(device), components=(), video=True)
    model = _seedvr2().to(device)
    ev = EngineVAE(model, EngineSet(tmp_path / "real", device, model_hash=model_hash(model.state_dict())))
    z = _latents(5).to(device)
    out = ev.decode(z)
    with torch.inference_mode():
        ref = model.decode_latents(z, temporal_slice=1)
    return out, ref, ev.engine_calls


@pytest.mark.skipif(os.environ.get("TURBOVAE_COMPILE_TESTS") != "1",
                    reason="Inductor compile of both slice graphs takes 1-2 min on CPU; set TURBOVAE_COMPILE_TESTS=1")
def test_real_aoti_compile_chain_on_cpu(tmp_path):
    out, ref, calls = _real_compile_chain(tmp_path, "cpu", torch.float32)
    err = (out - ref).abs().max().item()
    print(f"compiled AOTInductor chain vs eager sliced decode: max abs {err:.2e}")
    assert calls == 1 and err <= 1e-5


@pytest.mark.gpu
def test_bf16_slice_engines_on_cuda(tmp_path):
    out, ref, calls = _real_compile_chain(tmp_path, "cuda", torch.bfloat16)
    print(f"CUDA bf16 AOTInductor chain vs fp32 eager: PSNR {psnr(out, ref):.1f} dB")
    assert calls == 1 and psnr(out, ref) >= 40
