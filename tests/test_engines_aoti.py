"""AOTInductor engines end to end on CPU (tiny toy VAE; compiles are shared via module fixtures):
exact parity at the bucket, output size == request for padded sizes, load_vae routing, fallback on
identity mismatch / corrupt files / shapes outside the table, memory report and release."""

from __future__ import annotations

import random
import shutil
import warnings

import pytest
import torch

from engines_toy import edit_manifest, save_toy_checkpoint, toy_checkpoint  # noqa: E402

import turbovae  # noqa: E402
from turbovae.vae.measuring import psnr  # noqa: E402
from turbovae.trt.buckets import Bucket, static_table  # noqa: E402
from turbovae.trt.build import build_engine_set  # noqa: E402
from turbovae.trt.engine_vae import EngineFallbackWarning, EngineVAE  # noqa: E402
from turbovae.trt.engine_vae import ApproximateResultWarning  # noqa: E402

BUCKET = Bucket(64, 64)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("engines")
    ckpt, vae = toy_checkpoint(root)
    from turbovae.cli import main

    # Built through the command line, so the CLI is covered end to end too.
    assert main(["build-engines", "--vae", str(ckpt), "--out", str(root / "set"), "--static", BUCKET.name,
                 "--backend", "aoti", "--dtype", "fp32", "--device", "cpu"]) == 0
    paths = [root / "set" / "encoder_64x64.pt2", root / "set" / "decoder_64x64.pt2"]
    return root, ckpt, vae, paths


def _copy_set(built, name):
    root = built[0]
    dst = root / name
    shutil.copytree(root / "set", dst)
    return dst


@pytest.mark.slow
def test_static_bucket_is_exact(built):
    root, _ckpt, vae, paths = built
    assert all(p.is_file() for p in paths) and (root / "set" / "manifest.json").is_file()
    ev = turbovae.load_vae(root / "set", device="cpu")
    assert isinstance(ev, EngineVAE) and ev.engines is not None
    g = torch.Generator().manual_seed(1)
    x = torch.rand(2, 3, 64, 64, generator=g) * 2 - 1
    z = torch.randn(1, 4, 8, 8, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EngineFallbackWarning)
        enc, dec = ev.encode(x), ev.decode(z)
    assert ev.engine_calls == 2
    assert (enc - vae.encode(x)).abs().max() <= 1e-4
    assert (dec - vae.decode(z)).abs().max() <= 1e-4
    assert ev.engine_memory_bytes() > 0
    ev.release_engines()
    assert ev.engine_memory_bytes() == 0
    assert (ev.decode(z) - vae.decode(z)).abs().max() <= 1e-4  # reloads on use


def test_fast_tiles_of_the_engine_size_run_on_the_engines(built):
    """Tiled passes use engines too: with 64 px tiles every tile of a 128 px image fits the static bucket."""
    from turbovae.vae.tiled import decode_tiled, encode_tiled

    root, _ckpt, vae, _paths = built
    ev = turbovae.load_vae(root / "set", device="cpu")
    g = torch.Generator().manual_seed(4)
    z = torch.randn(1, 4, 1, 16, 16, generator=g)
    x = torch.rand(1, 3, 1, 128, 128, generator=g) * 2 - 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", EngineFallbackWarning)
        dec = decode_tiled(ev, z, tile_px=64, overlap_px=16, mode="fast")
        tiles = ev.engine_calls
        enc = encode_tiled(ev, x, tile_px=64, overlap_px=16, mode="fast")
    assert tiles == 9 and ev.engine_calls == 18  # 3 x 3 tiles of 64 px each way
    assert (dec - decode_tiled(vae, z, tile_px=64, overlap_px=16, mode="fast")).abs().max() <= 1e-4
    assert (enc - encode_tiled(vae, x, tile_px=64, overlap_px=16, mode="fast")).abs().max() <= 1e-4
    # auto (the nodes' default) runs an input that fits untiled, i.e. on the engine when one serves it
    small = z[..., :8, :8]
    with warnings.catch_warnings():
        warnings.simplefilter("error", EngineFallbackWarning)
        auto = decode_tiled(ev, small, mode="auto")
    assert ev.engine_calls == 19
    assert (auto - vae.decode(small)).abs().max() <= 1e-4


def test_off_bucket_sizes_run_exactly_on_pytorch_by_default(built):
    """A size that is not the bucket's own runs on PyTorch (exactly), with one warning per size."""
    root, _ckpt, vae, _ = built
    ev = turbovae.load_vae(root / "set", device="cpu")
    for h, w in ((48, 48), (64, 40), (16, 64)):
        z = torch.randn(1, 4, h // 8, w // 8, generator=torch.Generator().manual_seed(h + w))
        with pytest.warns(EngineFallbackWarning, match="not a size the decoder engines compute exactly"):
            out = ev.decode(z)
        assert torch.equal(out, vae.decode(z))
    assert ev.engine_calls == 0


def test_padded_sizes_keep_the_requested_size(built):
    """Opted in (pad_to_bucket=True): sizes between buckets run padded, with a warning that it is approximate."""
    root, _ckpt, vae, _ = built
    ev = turbovae.load_vae(root / "set", device="cpu", pad_to_bucket=True)
    rng = random.Random(0)
    psnrs = []
    for i in range(20):
        h, w = (8 * rng.randint(2, 7), 8 * rng.randint(2, 7)) if i else (48, 48)
        x = torch.rand(1, 3, h, w, generator=torch.Generator().manual_seed(h * 100 + w)) * 2 - 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lat = ev.encode(x)
        if i == 0:
            assert any(issubclass(c.category, ApproximateResultWarning) for c in caught)
        assert lat.shape == (1, 4, h // 8, w // 8)
        out = ev.decode(lat)
        assert out.shape == (1, 3, h, w)
        psnrs.append(psnr(out, vae.decode(lat)))
    assert ev.engine_calls == 40
    print(f"padded-bucket decode PSNR vs eager: min {min(psnrs):.1f} dB, mean {sum(psnrs) / len(psnrs):.1f} dB")
    assert min(psnrs) > 20  # random weights: global attention sees the padding (not exact, see docs)


def test_outside_bucket_falls_back_with_one_warning(built):
    root, _ckpt, vae, _ = built
    ev = turbovae.load_vae(root / "set", device="cpu")
    z = torch.randn(1, 4, 10, 8)  # 64x80 px: taller than the 64x64 bucket
    with pytest.warns(EngineFallbackWarning, match="outside every"):
        out = ev.decode(z)
    assert torch.equal(out, vae.decode(z)) and ev.engine_calls == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", EngineFallbackWarning)
        ev.decode(z)  # same size again: no second warning


def test_identity_mismatch_falls_back(built):
    folder = _copy_set(built, "mismatch")
    edit_manifest(folder, "decoder_64x64.pt2", backend_version="torch-0.0")
    with pytest.warns(EngineFallbackWarning, match="build-engines .*--static 64x64 --backend aoti"):
        ev = turbovae.load_vae(folder, device="cpu")
    assert ev.engines is None
    z = torch.randn(1, 4, 8, 8)
    assert torch.equal(ev.decode(z), built[2].decode(z))


def test_other_weights_fall_back(built, tmp_path):
    other = tmp_path / "other.safetensors"
    save_toy_checkpoint(other, seed=5)
    with pytest.warns(EngineFallbackWarning, match="different weights"):
        ev = turbovae.load_vae(built[0] / "set", device="cpu", fallback=other)
    assert ev.engines is None and ev.source == str(other)


def test_truncated_engine_is_detected_before_loading(built):
    folder = _copy_set(built, "truncated")
    eng = folder / "encoder_64x64.pt2"
    eng.write_bytes(eng.read_bytes()[: eng.stat().st_size // 2])
    with pytest.warns(EngineFallbackWarning, match="truncated"):
        ev = turbovae.load_vae(folder, device="cpu")
    assert ev.engines is None


def test_corrupt_engine_without_hash_gives_clear_error(built):
    from turbovae.trt.aoti import AOTIBackend
    from turbovae.trt.interface import EngineLoadError

    folder = _copy_set(built, "corrupt")
    eng = folder / "decoder_64x64.pt2"
    eng.write_bytes(b"not a zip file")
    with pytest.raises(EngineLoadError, match="rebuild"):
        AOTIBackend().load(eng, [{}], torch.device("cpu"), ("latents",), ("pixels",))


def test_rebuild_refuses_to_overwrite(built):
    root, _ckpt, vae, _ = built
    with pytest.raises(FileExistsError, match="overwrite"):
        build_engine_set(vae, root / "set", static_table(BUCKET), backend="aoti", device=torch.device("cpu"))


def test_single_engine_file_and_lazy_loading(built):
    root = built[0]
    ev = turbovae.load_vae(root / "set" / "decoder_64x64.pt2", device="cpu")
    assert ev.engines.components == ("decoder",)
    from turbovae.trt.engine_vae import load_engine_vae

    lazy = load_engine_vae(root / "set", device="cpu", lazy=True)
    assert lazy.engine_memory_bytes() == 0
    files = sum(s.ident.engine_bytes for s in lazy.engines.slots)
    assert files > 0 and lazy.engine_footprint_bytes() == files  # reserved before the first load
    lazy.decode(torch.randn(1, 4, 8, 8))
    assert lazy.engine_memory_bytes() > 0 and lazy.engine_calls == 1
    assert lazy.engine_footprint_bytes() >= lazy.engine_memory_bytes()


@pytest.mark.slow
def test_dynamic_profile_engine_matches_eager(built, tmp_path):
    """One AOTInductor package per profile: exact inside the range at 16-px multiples; multiples of 8 that
    are not multiples of 16 run on PyTorch (exactly), or padded (size kept) when opted in."""
    from turbovae.trt.buckets import Profile, multi_profile_table
    from turbovae.trt.engine_vae import load_engine_vae

    _root, ckpt, vae, _ = built
    table = multi_profile_table([Profile("small", (32, 32), (48, 64), (96, 96))])
    build_engine_set(vae, tmp_path / "dyn", table, backend="aoti", device=torch.device("cpu"),
                     components=("decoder",), source=str(ckpt))
    ev = load_engine_vae(tmp_path / "dyn", device="cpu")
    for h, w in ((4, 4), (6, 8), (12, 10), (8, 12)):  # latent sizes: 32..96 px in 16-px steps
        z = torch.randn(1, 4, h, w, generator=torch.Generator().manual_seed(h * w))
        assert (ev.decode(z) - vae.decode(z)).abs().max() <= 1e-4
    z = torch.randn(1, 4, 5, 7)  # 40x56 px: off the profile's 16-px grid
    with pytest.warns(EngineFallbackWarning, match="compute exactly"):
        assert torch.equal(ev.decode(z), vae.decode(z))
    assert ev.engine_calls == 4
    padded = load_engine_vae(tmp_path / "dyn", device="cpu", pad_to_bucket=True)
    with pytest.warns(ApproximateResultWarning):
        assert padded.decode(z).shape == (1, 3, 40, 56)  # padded to 48x64 inside the profile
    assert padded.engine_calls == 1


def test_model_dtype_differs_from_engine_dtype(built):
    """An fp32 engine under a bf16 model: inputs are cast to the engine dtype, outputs to the model's."""
    ev = turbovae.load_vae(built[0] / "set", device="cpu", dtype="bf16")
    z = torch.randn(1, 4, 8, 8)
    out = ev.decode(z)
    assert out.dtype is torch.bfloat16 and ev.engine_calls == 1
    ref = built[2].decode(z.to(torch.bfloat16).float())
    assert (out.float() - ref).abs().max() <= 1e-2  # bf16 output rounding only


def test_manifest_dtype_that_lies_is_caught_before_the_first_run(built):
    """The compiled package records its I/O dtypes; a manifest claiming fp16 for an fp32 package is refused
    when the engine loads (it would read fp16 inputs as fp32: garbage or NaN), and PyTorch answers."""
    folder = _copy_set(built, "dtype_lie")
    for name in ("encoder_64x64.pt2", "decoder_64x64.pt2"):
        edit_manifest(folder, name, dtype="fp16")
    with pytest.warns(EngineFallbackWarning, match="computes in torch.float32, the manifest says torch.float16"):
        ev = turbovae.load_vae(folder, device="cpu")  # engines load eagerly: refused at load
    z = torch.randn(1, 4, 8, 8)
    assert ev.engines is None and torch.equal(ev.decode(z), built[2].decode(z))


def test_build_leaves_only_the_listed_files(built):
    root = built[0]
    names = sorted(p.name for p in (root / "set").iterdir())
    assert names == ["decoder_64x64.pt2", "encoder_64x64.pt2", "manifest.json"]  # no temporary file, no sidecar


def test_an_8px_profile_table_runs_every_size_of_its_range_exactly(built, tmp_path):
    """`multiple=8` exports 8·Dim pixels / 1·Dim latents: every size in the range is on the grid, so every one
    runs on the engine, none padded. (Inductor's compile swapped for export save/load to stay fast.)"""
    from engines_toy import export_only

    from turbovae.trt.buckets import Profile, multi_profile_table
    from turbovae.trt.engine_vae import load_engine_vae

    _root, ckpt, vae, _ = built
    table = multi_profile_table([Profile("p", (32, 32), (48, 48), (96, 96))], multiple=8)
    with export_only():
        build_engine_set(vae, tmp_path / "p8", table, backend="aoti", device=torch.device("cpu"), source=str(ckpt))
        ev = load_engine_vae(tmp_path / "p8", device="cpu")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for h, w in ((4, 5), (5, 7), (9, 11), (12, 12)):
                z = torch.randn(1, 4, h, w, generator=torch.Generator().manual_seed(h * w))
                x = torch.rand(1, 3, 8 * h, 8 * w, generator=torch.Generator().manual_seed(h + w)) * 2 - 1
                assert (ev.decode(z) - vae.decode(z)).abs().max() <= 1e-4
                assert (ev.encode(x) - vae.encode(x)).abs().max() <= 1e-4
    assert ev.engine_calls == 8


@pytest.mark.parametrize("error", [lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB"),
                                   lambda: RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED"),
                                   lambda: RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED")],
                         ids=["torch", "cublas", "cudnn"])
@pytest.mark.slow
def test_engine_out_of_memory_waits_for_the_next_call(built, error):
    """A transient out-of-memory inside the engine (other models resident) runs that call on PyTorch with
    one warning and leaves the engine on; only repeated ones switch it off."""
    from turbovae.trt.engine_vae import ENGINE_OOM_FAILURES_TO_DISABLE

    root, _ckpt, vae, _ = built
    ev = turbovae.load_vae(root / "set", device="cpu")
    z = torch.randn(1, 4, 8, 8)
    want = vae.decode(z)
    ev.decode(z)  # loads the decoder engine
    slot = next(s for s in ev.engines.slots if s.engine is not None and "decoder" in s.path.name)
    real, failures = slot.engine._runner, [1]

    def runner(*args):
        if failures[0] > 0:
            failures[0] -= 1
            raise error()
        return real(*args)

    slot.engine._runner = runner
    calls = ev.engine_calls
    with pytest.warns(EngineFallbackWarning, match="ran out of memory") as record:
        first = ev.decode(z)
    assert len(record) == 1 and ev.engine_calls == calls  # PyTorch ran this one
    assert (first - want).abs().max() <= 1e-4
    assert (ev.decode(z) - want).abs().max() <= 1e-4 and ev.engine_calls == calls + 1  # the engine again
    failures[0] = ENGINE_OOM_FAILURES_TO_DISABLE
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", EngineFallbackWarning)
        for _ in range(ENGINE_OOM_FAILURES_TO_DISABLE):
            assert (ev.decode(z) - want).abs().max() <= 1e-4
    assert "decoder" in ev._disabled and "times in a row" in ev._disabled["decoder"]
    assert sum("from now on" in str(w.message) for w in caught) == 1
