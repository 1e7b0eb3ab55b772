"""Hostile and malformed inputs: every case gets a typed, clear error or a clean PyTorch fallback, never a
raw KeyError/IndexError/RecursionError/AssertionError/JSONDecodeError, never NaN output, and leaves no side
effects (files written, models evicted).

Engine folders are built with the toy VAE (tests/engines_toy.py) through the production build path with
only the minutes-long Inductor C++ compile swapped for `torch.export.save/load` (`export_only`).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import warnings
from pathlib import Path

import pytest
import torch

import node_helpers
from engines_toy import edit_manifest, export_only, save_toy_checkpoint, toy_checkpoint

node_helpers.use_comfy_stubs()

import turbovae  # noqa: E402
from turbovae.nodes import engine_nodes  # noqa: E402
from turbovae.nodes import paths as _paths  # noqa: E402
from turbovae.trt.interface import BuildCancelled, BuildProgress, EngineLoadError, EngineRunError  # noqa: E402
from turbovae.trt.buckets import Bucket, static_table  # noqa: E402
from turbovae.trt.build import build_engine_set  # noqa: E402
from turbovae.trt.engine_set import EngineSet  # noqa: E402
from turbovae.trt.engine_vae import EngineFallbackWarning, EngineSourceError, load_engine_vae  # noqa: E402
from turbovae.trt.fileio import atomic_write_bytes, publish  # noqa: E402
from turbovae.trt.identity import IdentityError  # noqa: E402
from turbovae.trt.manifest import MANIFEST_NAME, ManifestError  # noqa: E402
from turbovae.vae.loader import DeviceUnavailable  # noqa: E402
from turbovae.vae.checkpoint import CheckpointError  # noqa: E402
from turbovae.vae.memory.device import InputTooLarge  # noqa: E402

folder_paths = _paths.folder_paths
node_helpers.hide_comfy_stubs()

BUCKET = Bucket(64, 64)
FILES = ("encoder_64x64.pt2", "decoder_64x64.pt2")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    ckpt, vae = toy_checkpoint(root)
    with export_only():
        build_engine_set(vae, root / "set", static_table(BUCKET), backend="aoti", device=torch.device("cpu"),
                         source=str(ckpt))
    return root, ckpt, vae


def _copy(built, name: str) -> Path:
    dst = built[0] / name
    shutil.copytree(built[0] / "set", dst)
    return dst


def _z(h: int = 8, w: int = 8) -> torch.Tensor:
    return torch.randn(1, 4, h, w, generator=torch.Generator().manual_seed(h * w))


# -- the folder is the manifest plus the files it lists --------------------------------------------
def test_stray_and_partial_files_are_ignored(built):
    folder = _copy(built, "strays")
    (folder / "decoder_128x128.pt2").write_bytes(b"a stray engine of another set")
    (folder / ".decoder_64x64.partial.pt2").write_bytes(b"left by a killed build")
    (folder / ".decoder_64x64.pt2.tmp-0123456789ab").write_bytes(b"a temporary file")
    with export_only(), warnings.catch_warnings():
        warnings.simplefilter("error", EngineFallbackWarning)
        ev = turbovae.load_vae(folder, device="cpu")
        out = ev.decode(_z())
    assert ev.engine_calls == 1 and [s.path.name for s in ev.engines.slots] == list(FILES)
    assert (out - built[2].decode(_z())).abs().max() <= 1e-4


def test_stray_file_picked_alone_is_refused(built):
    folder = _copy(built, "stray_alone")
    (folder / "decoder_128x128.pt2").write_bytes(b"stray")
    with pytest.raises(ManifestError, match="not listed"):
        EngineSet(folder / "decoder_128x128.pt2", "cpu")
    with pytest.warns(EngineFallbackWarning, match="not listed"):
        ev = load_engine_vae(folder / "decoder_128x128.pt2", device="cpu", fallback=built[1])
    assert ev.engines is None


def test_folder_without_manifest(built):
    folder = _copy(built, "no_manifest")
    (folder / MANIFEST_NAME).unlink()
    with pytest.raises(ManifestError, match="no manifest.json"):
        turbovae.load_vae(folder, device="cpu")
    with pytest.warns(EngineFallbackWarning, match="no manifest.json"):
        ev = turbovae.load_vae(folder, device="cpu", fallback=built[1])
    assert ev.engines is None and torch.equal(ev.decode(_z()), built[2].decode(_z()))


def test_old_sidecar_folder_is_refused_with_rebuild_hint(built):
    folder = _copy(built, "old_layout")
    (folder / MANIFEST_NAME).unlink()
    (folder / (FILES[1] + ".json")).write_text("{}")
    with pytest.raises(ManifestError, match="older TurboVAE.*build-engines"):
        turbovae.load_vae(folder, device="cpu")


@pytest.mark.parametrize("text", ["{not json", "[]", "null", json.dumps({"manifest_version": 99, "engines": []}),
                                  json.dumps({"manifest_version": 1, "engines": []}),
                                  json.dumps({"manifest_version": 1, "engines": [{"file": "x.pt2"}]}),
                                  "\xff\xfe garbage", "[" * 100000 + "]" * 100000])
def test_corrupt_manifest(built, text):
    folder = _copy(built, "corrupt_manifest")
    try:
        (folder / MANIFEST_NAME).write_bytes(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text)
        with pytest.raises(ManifestError):
            turbovae.load_vae(folder, device="cpu")
        with pytest.warns(EngineFallbackWarning):
            ev = turbovae.load_vae(folder, device="cpu", fallback=built[1])
        assert ev.engines is None
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("changes", [
    {"dtype": "fp64"}, {"dtype": 3}, {"component": "upscaler"}, {"entries": [7]}, {"entries": "0"},
    {"entries": [True]}, {"table": {"mode": "static"}}, {"table": {"mode": "static", "buckets": [[64]]}},
    {"table": {"mode": "static", "buckets": [[64, 64]], "multiple": 0}}, {"table": "64x64"},
    {"input_names": []}, {"input_names": "latents"}, {"latent_format": {}},
    {"latent_format": {"channels": 4, "spatial_factor": 0}}, {"engine_bytes": -1}, {"engine_sha256": None},
    {"format_version": 2}, {"unknown_field": 1}, {"input_shapes": {"latents": [1, -4]}}, {"backend": "onnx"},
    {"compute_capability": 5},
])
def test_edited_identity_fields_give_typed_errors_or_fallback(built, changes):
    folder = _copy(built, "edited")
    try:
        edit_manifest(folder, FILES[1], **changes)
        with pytest.raises(IdentityError):
            EngineSet(folder, "cpu")
        with pytest.warns(EngineFallbackWarning):
            ev = turbovae.load_vae(folder, device="cpu", fallback=built[1])
        assert ev.engines is None and torch.equal(ev.decode(_z()), built[2].decode(_z()))
        with pytest.warns(EngineFallbackWarning, match="edited or damaged|identity format|backend"):
            ev = turbovae.load_vae(folder, device="cpu")  # the recorded source is still read, leniently
        assert ev.engines is None and ev.source == str(built[1])
    finally:
        shutil.rmtree(folder)


def test_latent_format_that_differs_from_the_checkpoint(built):
    folder = _copy(built, "latent_format")
    edit_manifest(folder, FILES[1], latent_format={"channels": 16, "spatial_factor": 8})
    with pytest.warns(EngineFallbackWarning, match="latent format differs"):
        ev = turbovae.load_vae(folder, device="cpu")
    assert ev.engines is None


@pytest.mark.parametrize("name", ["../toy.safetensors", "/etc/passwd", "sub/decoder.pt2", ".hidden.pt2",
                                  "decoder.txt", "", None, 5])
def test_manifest_file_names_are_confined_to_the_folder(built, name):
    folder = _copy(built, "names")
    try:
        data = json.loads((folder / MANIFEST_NAME).read_text())
        data["engines"][1]["file"] = name
        (folder / MANIFEST_NAME).write_text(json.dumps(data))
        with pytest.raises(ManifestError, match="file"):
            EngineSet(folder, "cpu")
    finally:
        shutil.rmtree(folder)


def test_listed_file_missing_or_replaced_falls_back(built):
    folder = _copy(built, "missing")
    (folder / FILES[1]).unlink()
    with pytest.warns(EngineFallbackWarning, match="not readable"):
        ev = turbovae.load_vae(folder, device="cpu")
    assert ev.engines is None


# -- the recorded source ----------------------------------------------------------------------------
def test_source_pointing_at_the_engine_folder_itself(built):
    folder = _copy(built, "self_source")
    for source in (str(folder), str(folder / FILES[1]), str(folder / ".." / folder.name)):
        for entry in FILES:
            edit_manifest(folder, entry, source=source)
        with pytest.raises(EngineSourceError, match="engine folder or file"):
            turbovae.load_vae(folder, device="cpu")


def test_source_missing_or_a_symlink_loop(built, tmp_path):
    folder = _copy(built, "loop_source")
    loop = tmp_path / "loop.safetensors"
    os.symlink(loop, loop)
    edit_manifest(folder, FILES[0], source=str(loop))
    with pytest.raises(EngineSourceError, match="cannot be resolved"):
        turbovae.load_vae(folder / FILES[0], device="cpu")
    edit_manifest(folder, FILES[0], source=str(tmp_path / "gone.safetensors"))
    with pytest.raises(FileNotFoundError, match="fallback"):
        turbovae.load_vae(folder / FILES[0], device="cpu")


def test_source_outside_the_allowed_roots(built, tmp_path):
    allowed = tmp_path / "models" / "vae"
    allowed.mkdir(parents=True)
    with pytest.raises(EngineSourceError, match="outside the VAE model folder"):
        load_engine_vae(built[0] / "set", device="cpu", source_roots=[allowed])
    shutil.copy(built[1], allowed / "toy.safetensors")
    folder = _copy(built, "confined")
    for entry in FILES:
        edit_manifest(folder, entry, source=str(allowed / "toy.safetensors"))
    with export_only():
        ev = load_engine_vae(folder, device="cpu", source_roots=[allowed])
    assert ev.engines is not None


# -- engines that are not what the manifest says -----------------------------------------------------
def test_dtype_mismatch_never_returns_nan(built):
    """An fp32 engine whose manifest says fp16: the run fails or the output check refuses it; PyTorch answers."""
    folder = _copy(built, "dtype_lie")
    for entry in FILES:
        edit_manifest(folder, entry, dtype="fp16")
    with export_only():
        ev = turbovae.load_vae(folder, device="cpu")
        with pytest.warns(EngineFallbackWarning, match="decoder failed"):
            out = ev.decode(_z())
    assert torch.isfinite(out).all() and torch.equal(out, built[2].decode(_z()))


class _LyingEngine:
    """A loaded engine returning what a mis-built engine would."""

    path = Path("decoder_64x64.pt2")
    memory_bytes = 0

    def __init__(self, out: torch.Tensor):
        self.out = out

    def run(self, inputs, profile=0):
        return {"pixels": self.out}

    def release(self):
        pass


@pytest.mark.parametrize("bad,match", [
    (torch.full((1, 3, 64, 64), float("nan")), "NaN"),
    (torch.zeros(1, 3, 64, 64, dtype=torch.float16), "dtype"),
    (torch.zeros(1, 3, 32, 64), "shape"),
    (torch.zeros(2, 3, 64, 64), "shape"),
])
def test_engine_outputs_are_checked_against_the_manifest(built, bad, match):
    with export_only():
        engines = EngineSet(built[0] / "set", "cpu", lazy=True)
    slot = next(s for s in engines.slots if s.ident.component == "decoder")
    slot.engine = _LyingEngine(bad)
    with pytest.raises(EngineRunError, match=match):
        engines.run("decoder", _z(), 8)


def test_aoti_package_dtype_record_is_checked_before_the_first_run():
    from turbovae.trt.aoti import IO_METADATA_KEY, check_io_metadata

    record = {IO_METADATA_KEY: json.dumps({"inputs": ["torch.float32"], "outputs": ["torch.float32"]})}
    check_io_metadata(Path("e.pt2"), record, torch.float32, 1, 1)
    with pytest.raises(EngineLoadError, match="computes in torch.float32, the manifest says torch.float16"):
        check_io_metadata(Path("e.pt2"), record, torch.float16, 1, 1)
    with pytest.raises(EngineLoadError, match="2 outputs|1 outputs"):
        check_io_metadata(Path("e.pt2"), record, torch.float32, 1, 2)
    with pytest.raises(EngineLoadError, match="unreadable"):
        check_io_metadata(Path("e.pt2"), {IO_METADATA_KEY: "{"}, torch.float32, 1, 1)


# -- builds are all or nothing ------------------------------------------------------------------------
class _CancelAfter(BuildProgress):
    """Cancels once the given message was reported (e.g. after the first engine is written)."""

    def __init__(self, after: str):
        self.after, self.seen = after, False
        super().__init__(lambda m, _f: setattr(self, "seen", self.seen or self.after in m), lambda: self.seen)


def test_cancelled_build_writes_nothing(built, tmp_path):
    out = tmp_path / "cancelled"
    with export_only(), pytest.raises(BuildCancelled):
        build_engine_set(built[2], out, static_table(BUCKET), backend="aoti", device=torch.device("cpu"),
                         progress=_CancelAfter(f"{FILES[0]}: written"))
    assert list(out.iterdir()) == []


def test_cancelled_overwrite_keeps_the_previous_set(built):
    folder = _copy(built, "keep_previous")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with export_only(), pytest.raises(BuildCancelled):
        build_engine_set(built[2], folder, static_table(BUCKET), backend="aoti", device=torch.device("cpu"),
                         overwrite=True, progress=_CancelAfter(f"{FILES[1]}: written"))
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_interrupted_build_leaves_no_engine_named_file(built, tmp_path, monkeypatch):
    from turbovae.trt.aoti import AOTIBackend

    calls = []

    def compile_then_die(self, program, f):
        calls.append(1)
        if len(calls) == 2:
            f.write(b"half a package")
            raise KeyboardInterrupt  # killed while writing the second engine
        torch.export.save(program, f)

    out = tmp_path / "killed"
    monkeypatch.setattr(AOTIBackend, "compile_package", compile_then_die)  # one patcher: undone in full afterwards
    with pytest.raises(KeyboardInterrupt):
        build_engine_set(built[2], out, static_table(BUCKET), backend="aoti", device=torch.device("cpu"))
    assert list(out.iterdir()) == []


def test_files_follow_the_umask_and_never_clobber(built, tmp_path):
    old = os.umask(0o022)
    try:
        out = tmp_path / "perm"
        with export_only():
            build_engine_set(built[2], out, static_table(BUCKET), backend="aoti", device=torch.device("cpu"))
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes == {FILES[0]: 0o644, FILES[1]: 0o644, MANIFEST_NAME: 0o644}
    # the publish step itself refuses an existing target, whatever a check before it saw
    tmp = tmp_path / ".x.tmp-1"
    tmp.write_bytes(b"new")
    with pytest.raises(FileExistsError, match="overwrite"):
        publish(tmp, out / FILES[0], overwrite=False)
    assert tmp.exists() and (out / FILES[0]).read_bytes() != b"new"
    with pytest.raises(FileExistsError):
        atomic_write_bytes(out / MANIFEST_NAME, b"{}")
    assert sorted(p.name for p in out.iterdir()) == sorted([*FILES, MANIFEST_NAME])


# -- checkpoints, devices and sizes -------------------------------------------------------------------
@pytest.mark.parametrize("text", ["{broken", "[1, 2]", "\xff\xfe"])
def test_malformed_diffusers_config(tmp_path, text):
    folder = tmp_path / "diffusers"
    folder.mkdir()
    save_toy_checkpoint(folder / "diffusion_pytorch_model.safetensors")
    (folder / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(CheckpointError, match="config.json"):
        turbovae.load_vae(folder, device="cpu")


def test_symlink_loop_checkpoint(tmp_path):
    loop = tmp_path / "vae.safetensors"
    os.symlink(loop, loop)
    with pytest.raises(CheckpointError, match="loops back"):
        turbovae.load_vae(loop, device="cpu")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused(tmp_path, value):
    from safetensors.torch import load_file, save_file

    ckpt = tmp_path / "bad.safetensors"
    save_toy_checkpoint(ckpt)
    sd = load_file(str(ckpt))
    sd["decoder.conv_out.weight"][0, 0, 0, 0] = value
    save_file(sd, str(ckpt))
    with pytest.raises(CheckpointError, match="decoder.conv_out.weight contains NaN or Inf"):
        turbovae.load_vae(ckpt, device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine's message")
def test_cuda_device_on_a_cpu_machine(built, capsys, tmp_path):
    for device in ("cuda", "cuda:0", "gpu", "tpu"):
        with pytest.raises(DeviceUnavailable):
            turbovae.load_vae(built[1], device=device)
    from turbovae.cli import main

    out = tmp_path / "never"
    assert main(["build-engines", "--vae", str(built[1]), "--out", str(out), "--static", "64x64", "--backend",
                 "aoti", "--device", "cuda"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err and not out.exists()


def test_cli_bad_checkpoint_is_one_line(capsys, tmp_path):
    from turbovae.cli import main

    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not safetensors")
    assert main(["build-engines", "--vae", str(junk), "--out", str(tmp_path / "o"), "--static", "64x64",
                 "--backend", "aoti", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err and not (tmp_path / "o").exists()


def test_huge_latent_is_refused_before_allocating(built):
    vae = built[2]
    z = torch.zeros(1, 4, 1, 1, 1).expand(1, 4, 1, 100000, 100000)  # a view: no memory behind it
    with pytest.raises(InputTooLarge, match="GiB"):
        vae.decode(z)
    from turbovae.vae.tiled import decode_tiled

    with pytest.raises(InputTooLarge):
        decode_tiled(vae, z, mode="fast")


@pytest.mark.parametrize("source,error", [(None, TypeError), (42, TypeError),
                                          ({"decoder.conv_in.weight": [1.0]}, CheckpointError),
                                          ({1: torch.zeros(1)}, CheckpointError), ({}, CheckpointError)])
def test_malformed_sources(source, error):
    with pytest.raises(error):
        turbovae.load_vae(source, device="cpu")


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_temporal_slice_that_would_never_advance(built, value):
    """A slice of 0 or fewer latents used to loop forever in the slicer; now a ValueError first."""
    with pytest.raises(ValueError, match="temporal_slice"):
        built[2].decode(torch.zeros(1, 4, 3, 8, 8), temporal_slice=value)
    with pytest.raises(ValueError, match="temporal_slice"):
        built[2].encode(torch.zeros(1, 3, 5, 64, 64), temporal_slice=value)


def test_loader_arguments_for_engines_only(built):
    with pytest.raises(ValueError, match="apply to engine folders"):
        turbovae.load_vae(built[1], device="cpu", pad_to_bucket=True)


# -- tiled API ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,match", [({"tile_px": 64, "overlap_px": 32}, "less than half"),
                                      ({"tile_px": 64, "overlap_px": 40}, "less than half"),
                                      ({"temporal_slice": -1}, "temporal_slice=-1"),
                                      ({"temporal_slice": 0}, "temporal_slice=0"),
                                      ({"tile_px": -64}, "negative"), ({"overlap_px": -8}, "overlap_px"),
                                      ({"tile_px": "64"}, "integer"), ({"overlap_px": 8.5}, "integer")])
def test_tiled_api_validates_arguments(built, kw, match):
    from turbovae.vae.tiled import decode_tiled, encode_tiled

    with pytest.raises(ValueError, match=match):
        decode_tiled(built[2], torch.zeros(1, 4, 1, 8, 8), **kw)
    with pytest.raises(ValueError, match=match):
        encode_tiled(built[2], torch.zeros(1, 3, 1, 64, 64), **kw)


def test_cpu_out_of_memory_retries_with_smaller_tiles(caplog):
    from turbovae.vae.tiled import run_with_oom_retry
    from turbovae.vae.tiling.retry import TileRetry

    tiles = []

    def retry_at(tile_lat):
        return TileRetry("decode", 8, torch.device("cpu"), tile_lat, None, 1)

    def run(retry):
        tiles.append(retry.tile_latent)
        if retry.tile_latent > 16:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 68719476736 bytes.")
        return torch.zeros(1)

    assert run_with_oom_retry(run, retry_at(64)).shape == (1,)
    assert tiles == [64, 32, 16]

    def other(retry):
        raise RuntimeError("Expected all tensors to be on the same device")

    with pytest.raises(RuntimeError, match="same device"):  # not an allocation failure: no retry
        run_with_oom_retry(other, retry_at(64))

    def always(retry):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes.")

    with pytest.raises(MemoryError, match="even with 64 px tiles"):
        run_with_oom_retry(always, retry_at(8))


# -- the Build Engine node ------------------------------------------------------------------------------
@pytest.fixture
def comfy_root(tmp_path, monkeypatch):
    folder_paths.reset(str(tmp_path))
    vae_dir = tmp_path / "models" / "vae"
    vae_dir.mkdir(parents=True)
    save_toy_checkpoint(vae_dir / "toy.safetensors")
    monkeypatch.setattr(engine_nodes.mm, "unload_all_calls", [])
    return tmp_path


@pytest.mark.parametrize("vae_name", ["toy\x00.safetensors", "toy.safetensors\n", "   ", "", "\t",
                                      "../toy.safetensors", "missing.safetensors"])
def test_build_node_checks_the_vae_name_before_evicting(comfy_root, vae_name):
    with pytest.raises((ValueError, FileNotFoundError)):
        engine_nodes.TurboVAEBuildEngine.execute(vae_name=vae_name, name="set", mode="static", width=64, height=64,
                                                 backend="aoti", dtype="fp32")
    assert engine_nodes.mm.unload_all_calls == []
    assert not (comfy_root / "models" / "tensorrt" / "set").exists()


@pytest.mark.parametrize("name", ["a\nb", " set", "set ", "a\\b", "c:x", "\x00"])
def test_build_node_refuses_odd_folder_names(comfy_root, name):
    with pytest.raises(ValueError, match="plain folder name"):
        engine_nodes.TurboVAEBuildEngine.execute(vae_name="toy.safetensors", name=name, mode="static", width=64,
                                                 height=64, backend="aoti", dtype="fp32")
    assert engine_nodes.mm.unload_all_calls == []


def test_load_node_confines_the_recorded_source(comfy_root, built):
    """An engine folder in models/tensorrt whose manifest points outside models/vae is refused."""
    _paths.register_tensorrt_folder()
    dst = comfy_root / "models" / "tensorrt" / "set"
    shutil.copytree(built[0] / "set", dst)  # its manifest names the checkpoint in the test's temp folder
    with pytest.raises(EngineSourceError, match="outside the VAE model folder"):
        engine_nodes.TurboVAELoadEngine.execute(engine=f"set/{FILES[1]}")
    for entry in FILES:
        edit_manifest(dst, entry, source=str(comfy_root / "models" / "vae" / "toy.safetensors"))
    with export_only():
        out = engine_nodes.TurboVAELoadEngine.execute(engine=f"set/{FILES[1]}")
    assert out.args[0] is not None


@pytest.mark.parametrize("shape,decode,match", [((1, 16, 5, 8, 8), True, "4 channels"),
                                                ((1, 4, 0, 8, 8), True, "positive"),
                                                ((1, 4, 2, 3, 8, 8), True, r"\[B, 4, T, H, W\]"),
                                                (("a", 4, 1, 8, 8), True, "integers"),
                                                ((1, 3, 6, 64, 64), False, "1 \\+ 4n"),
                                                ((1, 3, 5, 60, 64), False, "multiples of 8")])
def test_plan_names_a_bad_shape(shape, decode, match):
    """TurboVAE.plan is public: a shape decode / encode would refuse gets the same kind of error before any meta
    pass (not a RuntimeError from a convolution's shape check)."""
    from turbovae.vae.api import TurboVAE
    from turbovae.vae.wan import TINY_WAN21, WanVAE

    with pytest.raises(ValueError, match=match):
        TurboVAE(WanVAE(TINY_WAN21).eval()).plan(shape, decode=decode)


def test_plan_temporal_slice_is_a_deprecated_plan():
    from turbovae.vae.api import TurboVAE
    from turbovae.vae.wan import TINY_WAN21, WanVAE

    vae = TurboVAE(WanVAE(TINY_WAN21).eval())
    budget = 64 << 20  # given, not read from the host's free memory, which moves between the two calls
    with pytest.warns(DeprecationWarning, match="TurboVAE.plan"):
        old = vae.plan_temporal_slice((1, 4, 5, 8, 8), decode=True, budget_bytes=budget)
    assert old == vae.plan((1, 4, 5, 8, 8), decode=True, budget_bytes=budget) and old.fits
