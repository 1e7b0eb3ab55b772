"""Node `execute` with real tensors and tiny random-weight VAE files, against ComfyUI test doubles.

What the doubles cannot show (core nodes using our VAE, real interrupts, /object_info, the shipped workflows
running) is covered by tests/test_nodes_comfyui.py against a real ComfyUI server (skipped unless
TURBOVAE_COMFYUI names a ComfyUI checkout).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import node_helpers  # noqa: E402

node_helpers.use_comfy_stubs()

from turbovae import TurboVAE, load_vae  # noqa: E402
from turbovae.vae.checkpoint import CheckpointError  # noqa: E402
from turbovae.vae.input_rules import PassShape  # noqa: E402
from turbovae.vae.tiling.exact import supports_exact  # noqa: E402
from turbovae.nodes import TurboVAEExtension, all_nodes, loader_nodes  # noqa: E402
from turbovae.nodes.comfy_vae import ComfyTurboVAE  # noqa: E402
from turbovae.nodes.loader_nodes import TurboVAECompileSettings, TurboVAELoader  # noqa: E402
from turbovae.nodes.paths import UnsafePathError, register_tensorrt_folder, resolve_model_file  # noqa: E402
from turbovae.nodes.tiled_nodes import TurboVAETiledDecode, TurboVAETiledEncode  # noqa: E402

# The doubles exactly as the node modules bound them (another test module may have imported them first).
from turbovae.nodes import comfy_vae as _cv, paths as _paths, progress as _progress  # noqa: E402

mm, comfy, folder_paths = _cv.mm, _progress.comfy, _paths.folder_paths
node_helpers.hide_comfy_stubs()

NODES_DIR = Path(loader_nodes.__file__).parent


@pytest.fixture(scope="module")
def model_root(tmp_path_factory):
    base = tmp_path_factory.mktemp("comfy")
    folder_paths.reset(str(base))
    vae_dir = base / "models" / "vae"
    vae_dir.mkdir(parents=True)
    configs = {}
    for name in node_helpers.TINY_MODELS:
        _, configs[name] = node_helpers.write_tiny_vae(vae_dir, name)
    return base, configs


@pytest.fixture(autouse=True)
def _registry(model_root, monkeypatch):
    base, configs = model_root
    folder_paths.reset(str(base))
    comfy.utils.PROGRESS_BAR_HOOK = None
    mm.interrupt_processing = False
    mm.load_calls.clear()

    # The only test seam: the real-size default configs cannot hold tiny weights, so the loader is
    # handed the tiny config that matches the file (everything else is the node's real path).
    def load_tiny(path, **kw):
        return load_vae(path, config=configs.get(Path(path).name), **kw)

    monkeypatch.setattr(loader_nodes, "load_vae", load_tiny)
    yield


@functools.lru_cache(maxsize=None)
def _load(name: str) -> ComfyTurboVAE:
    return TurboVAELoader.execute(vae_name=name, dtype="fp32").args[0]


def _vae(name: str) -> ComfyTurboVAE:
    return _load(name)


VAE_NAMES = list(node_helpers.TINY_MODELS)


# -- loader -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", VAE_NAMES)
def test_loader_returns_a_core_compatible_vae(name):
    vae = _vae(name)
    assert isinstance(vae, ComfyTurboVAE) and isinstance(vae.turbo, TurboVAE)
    assert vae.kind == ("seedvr2" if "seedvr2" in name else "qwen_image")
    assert vae.latent_dim == 3 and vae.spacial_compression_decode() == 8 and vae.temporal_compression_decode() == 4
    assert vae.downscale_index_formula == (4, 8, 8) and vae.latent_channels == vae.turbo.latent_channels
    assert vae.vae_dtype == torch.float32 and vae.patcher.model.vae is vae.turbo.model
    assert set(vae.get_sd()) == set(vae.turbo.state_dict())


@pytest.mark.parametrize("name", VAE_NAMES)
def test_core_decode_encode_contract_matches_turbovae(name):
    vae = _vae(name)
    torch.manual_seed(1)
    z = torch.randn(1, vae.latent_channels, 2, 4, 4)
    images = vae.decode(z)  # what core VAEDecode calls
    assert images.shape == (1, 5, 32, 32, 3) and images.dtype == torch.float32
    # core's LATENT for the kind: raw for Qwen/Wan, times the scaling factor for SeedVR2 (test_seedvr2_core_contract)
    scale = vae.turbo.scaling_factor if vae.kind == "seedvr2" else 1.0
    ref = ((vae.turbo.decode(z / scale) + 1) / 2).clamp(0, 1).movedim(1, -1)
    torch.testing.assert_close(images, ref, atol=1e-6, rtol=0)
    assert 0.0 <= images.min() and images.max() <= 1.0

    frames = torch.rand(5, 34, 33, 3)  # crop to 32x32, 5 frames = one clip
    latents = vae.encode(frames)
    clip = frames[:, 1:33, 0:32].movedim(-1, 0).unsqueeze(0) * 2 - 1
    torch.testing.assert_close(latents, vae.turbo.encode(clip) * scale, atol=1e-6, rtol=0)
    assert latents.shape == (1, vae.latent_channels, 2, 4, 4)
    assert mm.load_calls and all(c["force_full_load"] for c in mm.load_calls)


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("simulated: whole pass too large"),
                                   RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                                                "68719476736 bytes. Error code 12 (Cannot allocate memory)"),
                                   RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
                                                "`cublasCreate(handle)`"),
                                   RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
                                   RuntimeError("CUDA error: out of memory")],
                         ids=["torch", "cpu", "cublas", "cudnn", "cuda"])
@pytest.mark.parametrize("name", VAE_NAMES)
@pytest.mark.slow
def test_core_decode_encode_retry_tiled_on_out_of_memory(name, error, monkeypatch, caplog):
    """Core VAE Decode/Encode call vae.decode/encode, which (like core's VAE) must retry tiled when the
    whole pass runs out of memory (CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError), not fail
    the prompt."""
    vae = TurboVAELoader.execute(vae_name=name, dtype="fp32").args[0]  # private copy: its turbo is patched
    torch.manual_seed(3)
    z = torch.randn(1, vae.latent_channels, 2, 6, 5)
    frames = torch.rand(5, 48, 40, 3)
    want_images, want_latents = vae.decode(z), vae.encode(frames)

    def oom(*a, **k):
        raise error

    monkeypatch.setattr(vae.turbo, "decode_checked", oom)
    monkeypatch.setattr(vae.turbo, "encode_checked", oom)
    with caplog.at_level("WARNING"):
        images, latents = vae.decode(z), vae.encode(frames)
    assert "out of memory decoding without tiles" in caplog.text and "out of memory encoding" in caplog.text
    assert sum("out of memory" in r.getMessage() for r in caplog.records if r.levelname == "WARNING") == 2
    torch.testing.assert_close(images, want_images, atol=1e-4, rtol=0)  # auto tiles: exact, or the untiled pass
    torch.testing.assert_close(latents, want_latents, atol=1e-4, rtol=0)


def test_core_decode_keeps_finished_batch_items_when_a_later_one_runs_out_of_memory(monkeypatch):
    vae = TurboVAELoader.execute(vae_name=VAE_NAMES[0], dtype="fp32").args[0]
    torch.manual_seed(4)
    z = torch.randn(3, vae.latent_channels, 2, 6, 5)
    want = vae.decode(z)
    real, calls = vae.turbo.decode_checked, []

    def second_fails(latents, **kw):
        calls.append(latents)
        if len(calls) == 2:
            raise RuntimeError("CUDA error: out of memory")
        return real(latents, **kw)

    monkeypatch.setattr(vae.turbo, "decode_checked", second_fails)
    images = vae.decode(z)
    assert len(calls) == 2  # item 0 decoded whole once and kept; items 1 and 2 went to tiles
    torch.testing.assert_close(images, want, atol=1e-4, rtol=0)


def test_core_decode_checks_the_latents_once(monkeypatch):
    """Core VAE Decode of a batch: the latents are checked (every value read for NaN/inf) once for the batch, not
    again for each item the pass decodes (issue 42, item 8)."""
    vae = TurboVAELoader.execute(vae_name=VAE_NAMES[0], dtype="fp32").args[0]
    z = torch.randn(3, vae.latent_channels, 2, 6, 5, generator=torch.Generator().manual_seed(6))
    real, checked = vae.turbo.check_latents, []
    monkeypatch.setattr(vae.turbo, "check_latents", lambda latents: checked.append(latents.shape) or real(latents))
    images = vae.decode(z)
    assert checked == [z.shape] and images.shape[:2] == (3, 5)
    with pytest.raises(ValueError, match="NaN or inf"):
        vae.decode(torch.full_like(z, float("nan")))  # still checked, once


def test_core_decode_does_not_retry_other_runtime_errors(monkeypatch):
    vae = TurboVAELoader.execute(vae_name=VAE_NAMES[0], dtype="fp32").args[0]

    def broken(*a, **k):
        raise RuntimeError("Expected all tensors to be on the same device")

    monkeypatch.setattr(vae.turbo, "decode_checked", broken)
    with pytest.raises(RuntimeError, match="same device"):
        vae.decode(torch.randn(1, vae.latent_channels, 1, 4, 4))


@pytest.mark.parametrize("name", VAE_NAMES)
def test_vae_loaded_and_run_under_inference_mode_like_comfyui(name):
    """ComfyUI executes every node under torch.inference_mode(): loading there must still give a VAE
    whose passes run (SeedVR2's derived-weight caches read the parameters' version counters)."""
    torch.manual_seed(2)
    with torch.inference_mode():
        vae = TurboVAELoader.execute(vae_name=name, dtype="fp32").args[0]
        z = torch.randn(1, vae.latent_channels, 2, 4, 4)
        frames = vae.decode(z)[0]
        assert frames.shape == (5, 32, 32, 3)
        assert vae.encode(frames).shape == (1, vae.latent_channels, 2, 4, 4)
        assert vae.encode(frames[:1]).shape == (1, vae.latent_channels, 1, 4, 4)  # single image
        out = TurboVAETiledDecode.execute(samples={"samples": z}, vae=vae, tile_size=0, overlap=0,
                                          temporal_slice=1, mode="fast").args[0]
        assert out.shape == (5, 32, 32, 3)


def test_memory_estimate_is_the_planned_peak_under_the_comfyui_budget(caplog):
    """memory_used_decode is the predicted peak of the plan core VAE Decode runs under ComfyUI's budget (so core does
    not tile on top of us): within the budget, less than the untiled whole clip for a long clip, smaller under a
    tighter budget; decode logs the plan, its predicted peak and where the budget came from."""
    from turbovae.nodes.pass_budget import comfy_budget_bytes, item_shape
    from turbovae.vae.planning.meta_pass import predict_pass

    vae = _vae("qwen_image_tiny.safetensors")
    c = vae.latent_channels
    long_shape = (1, c, 9, 32, 32)
    saved = mm.free_memory_bytes
    try:
        mm.free_memory_bytes = 8 * 2**30
        budget = comfy_budget_bytes(vae.turbo, vae.device)
        long_clip = vae.memory_used_decode(long_shape, torch.bfloat16)
        plan = vae._plan(item_shape(vae.turbo, long_shape, decode=True), log_it=False)
        assert long_clip == plan.predicted.pass_bytes <= budget
        # the plan's own prediction (on the CPU a slice step can need more than the whole clip: with fewer frames
        # PyTorch picks its im2col conv kernels, whose column buffers count; vae/memory/cpu_conv.py)
        one = vae.memory_used_decode((1, c, 1, 32, 32), torch.bfloat16)
        assert one == predict_pass(vae.turbo.model, (1, c, 1, 32, 32), decode=True).pass_bytes
        mm.free_memory_bytes = int(long_clip * 0.9) + (8 * 2**30 - budget)  # the plan that fitted no longer does
        tight = vae.memory_used_decode(long_shape, torch.bfloat16)
        assert tight < long_clip and tight <= comfy_budget_bytes(vae.turbo, vae.device)
        with caplog.at_level("INFO", logger="turbovae"):
            vae.decode(torch.randn(1, c, 3, 4, 4))
        assert any("predicted peak" in r.getMessage() and "ComfyUI" in r.getMessage() for r in caplog.records)
    finally:
        mm.free_memory_bytes = saved


def test_tiled_node_plans_first_then_asks_for_the_plans_peak():
    """The tiled decode asks model management for the peak of the plan it runs (review item: it asked for a square
    of the frame's longer side before planning, 31 GB for a 720p frame that needs 17.6)."""
    vae = _vae("qwen_image_tiny.safetensors")
    z = torch.randn(1, vae.latent_channels, 3, 8, 24)
    before = len(mm.load_calls)
    vae.decode_tiled_px(z, vae.tiling(0, 16))
    asked = mm.load_calls[before]["memory_required"]
    plan = vae.tiled_plan(PassShape.of(z, decode=True), vae.tiling(0, 16))
    assert asked == plan.predicted.pass_bytes
    assert vae.last_report.how == plan.layout() and vae.last_report.predicted_mb == asked / 2**20


def test_encode_plans_every_clip_of_a_batch():
    """A 5-D IMAGE of B clips encodes them together, so its plan is for B clips (review item: it planned one)."""
    from turbovae.nodes.pass_budget import item_shape

    vae = _vae("qwen_image_tiny.safetensors")
    assert item_shape(vae.turbo, (3, 3, 5, 64, 64), decode=False).dims[0] == 3
    assert item_shape(vae.turbo, (3, vae.latent_channels, 5, 8, 8), decode=True).dims[0] == 1  # item by item
    from turbovae.vae.planning.meta_pass import predict_pass

    one = vae.memory_used_encode((1, 3, 5, 64, 64), torch.float32)
    three = vae.memory_used_encode((3, 3, 5, 64, 64), torch.float32)
    plan = vae._plan(item_shape(vae.turbo, (3, 3, 5, 64, 64), decode=False), log_it=False)
    assert plan.shape[0] == 3 and plan.mode == "untiled" and three == plan.predicted.pass_bytes
    # the three clips' pass as predicted, not one clip's (on the CPU three clips can take less: with a batch of 3
    # PyTorch picks oneDNN's conv kernels over its im2col ones, whose columns count; vae/memory/cpu_conv.py)
    assert three == predict_pass(vae.turbo.model, (3, 3, 5, 64, 64), decode=False,
                                 temporal_slice=plan.temporal_slice).pass_bytes != one


def test_loader_dtype_choice_and_validation():
    assert TurboVAELoader.validate_inputs(dtype="fp64").startswith("dtype='fp64' is not a valid choice")
    assert TurboVAELoader.validate_inputs(dtype="bf16") is True
    with pytest.raises(ValueError, match="use one of: auto, bf16, fp16, fp32"):
        TurboVAELoader.execute(vae_name=VAE_NAMES[0], dtype="fp64")
    vae = TurboVAELoader.execute(vae_name=VAE_NAMES[0], dtype="bf16").args[0]
    assert vae.vae_dtype == torch.bfloat16 and vae.turbo.dtype == torch.bfloat16


# -- bad inputs ---------------------------------------------------------------------------------------
def test_missing_file_names_the_folder():
    with pytest.raises(FileNotFoundError, match="models folder"):
        TurboVAELoader.execute(vae_name="nope.safetensors")


@pytest.mark.parametrize("name", ["../secret.safetensors", "sub/../../secret.safetensors", "/etc/passwd",
                                  "..\\secret.safetensors", "C:\\x.safetensors"])
def test_paths_leaving_the_models_folder_are_refused(name, model_root):
    base, _ = model_root
    (base / "models" / "secret.safetensors").write_bytes(b"x")
    with pytest.raises(UnsafePathError, match="outside the models folder"):
        TurboVAELoader.execute(vae_name=name)


def test_symlinked_file_inside_models_folder_is_allowed(model_root, tmp_path):
    base, _ = model_root
    link = base / "models" / "vae" / "linked_seedvr2_tiny.safetensors"
    if not link.exists():
        link.symlink_to(base / "models" / "vae" / "seedvr2_tiny.safetensors")
    assert resolve_model_file("vae", link.name) == str(link)


def test_non_vae_files_are_rejected_with_what_they_look_like(model_root):
    from safetensors.torch import save_file

    vae_dir = model_root[0] / "models" / "vae"
    save_file({"decoder.up.0.block.0.norm1.weight": torch.ones(4),
               "decoder.up.0.block.0.conv1.weight": torch.ones(4, 4, 3, 3)}, str(vae_dir / "sdxl_vae.safetensors"))
    with pytest.raises(CheckpointError, match="SD-style 2-D KL autoencoder"):
        TurboVAELoader.execute(vae_name="sdxl_vae.safetensors")
    (vae_dir / "notes.safetensors").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        TurboVAELoader.execute(vae_name="notes.safetensors")


@pytest.mark.parametrize("name", VAE_NAMES)
def test_wrong_latent_channels_say_what_the_vae_needs(name):
    vae = _vae(name)
    bad = {"samples": torch.randn(1, vae.latent_channels + 1, 1, 8, 8)}
    with pytest.raises(ValueError, match=f"must have {vae.latent_channels} channels"):
        TurboVAETiledDecode.execute(samples=bad, vae=vae, tile_size=0)
    with pytest.raises(ValueError, match="channels"):
        vae.decode(bad["samples"])


@pytest.mark.parametrize("name", VAE_NAMES)
def test_tiled_decode_checks_the_latents_once(name, monkeypatch):
    """The node converts core's samples and plans from their shape; the library's tiled pass is the one place the
    latents are checked (issue 42)."""
    vae = _vae(name)
    calls = []
    check = type(vae.turbo).check_latents
    monkeypatch.setattr(type(vae.turbo), "check_latents", lambda self, x: calls.append(1) or check(self, x))
    z = torch.randn(1, vae.latent_channels, 1, 8, 8)
    TurboVAETiledDecode.execute(samples={"samples": z}, vae=vae, tile_size=0)
    assert len(calls) == 1
    with pytest.raises(ValueError, match="NaN"):
        TurboVAETiledDecode.execute(samples={"samples": torch.full_like(z, float("nan"))}, vae=vae, tile_size=0)


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "fastest"}, "mode='fastest' is not a valid choice"),
    ({"tile_size": 32}, "too small"),
    ({"tile_size": 128, "overlap": 64}, "less than half"),
])
def test_tiled_settings_are_validated(kwargs, message):
    vae = _vae(VAE_NAMES[0])
    args = {"samples": {"samples": torch.randn(1, vae.latent_channels, 1, 8, 8)}, "vae": vae, **kwargs}
    with pytest.raises(ValueError, match=message):
        TurboVAETiledDecode.execute(**args)
    assert TurboVAETiledEncode.validate_inputs(mode="fastest") != True  # noqa: E712


# -- tiled nodes ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", VAE_NAMES)
def test_tiled_decode_reports_progress_per_tile_and_matches_untiled_with_one_tile(name):
    vae = _vae(name)
    torch.manual_seed(2)
    z = torch.randn(1, vae.latent_channels, 2, 8, 12)  # 64x96 px: two 64 px tiles across
    calls = []
    comfy.utils.PROGRESS_BAR_HOOK = lambda value, total, preview, node_id=None: calls.append((value, total))
    tiled = TurboVAETiledDecode.execute(samples={"samples": z}, vae=vae, tile_size=64, overlap=16,
                                        temporal_slice=1, mode="fast").args[0]
    assert tiled.shape == (5, 64, 96, 3) and torch.isfinite(tiled).all()
    assert len(calls) >= 2 and calls[-1][0] == calls[-1][1]
    whole = vae.decode(z).reshape(-1, 64, 96, 3)
    single = TurboVAETiledDecode.execute(samples={"samples": z}, vae=vae, tile_size=128, overlap=16,
                                         mode="fast").args[0]
    torch.testing.assert_close(single, whole, atol=1e-5, rtol=0)  # one tile == untiled pass
    if supports_exact(vae.turbo.model, decode=True):
        exact = TurboVAETiledDecode.execute(samples={"samples": z}, vae=vae, tile_size=64, overlap=16,
                                            mode="exact").args[0]
        torch.testing.assert_close(exact, whole, atol=1e-4, rtol=0)
    else:
        with pytest.raises(ValueError, match="exact tiled decode is not available"):
            TurboVAETiledDecode.execute(samples={"samples": z}, vae=vae, tile_size=64, overlap=16, mode="exact")


@pytest.mark.parametrize("name", VAE_NAMES[:1])
def test_tiled_encode_node_single_tile_equals_core_encode(name):
    vae = _vae(name)
    frames = torch.rand(5, 64, 64, 3)
    out = TurboVAETiledEncode.execute(pixels=frames, vae=vae, tile_size=128, overlap=16, mode="fast").args[0]
    torch.testing.assert_close(out["samples"], vae.encode(frames), atol=1e-5, rtol=0)


def test_cancel_between_tiles_propagates_and_leaves_the_vae_usable():
    vae = _vae(VAE_NAMES[0])
    z = torch.randn(1, vae.latent_channels, 1, 8, 16)
    seen = []

    def hook(value, total, preview, node_id=None):
        seen.append(value)
        mm.interrupt_current_processing(True)  # the user presses Cancel after the first tile

    comfy.utils.PROGRESS_BAR_HOOK = hook
    with pytest.raises(mm.InterruptProcessingException):
        TurboVAETiledDecode.execute(samples={"samples": z}, vae=vae, tile_size=64, overlap=16, mode="fast")
    assert seen == [1]  # stopped right after the first of several tiles
    comfy.utils.PROGRESS_BAR_HOOK = None
    again = TurboVAETiledDecode.execute(samples={"samples": z}, vae=vae, tile_size=256, mode="fast").args[0]
    torch.testing.assert_close(again, vae.decode(z).reshape(-1, 64, 128, 3), atol=1e-5, rtol=0)


def test_core_vae_falls_back_to_its_own_tiled_methods():
    class CoreLikeVAE:  # records what a core VAE receives (core VAEDecodeTiled's units)
        def spacial_compression_decode(self):
            return 8

        def temporal_compression_decode(self):
            return 4

        def decode_tiled(self, samples, **kw):
            self.decode_args = kw
            return torch.zeros(1, 5, 16, 16, 3)

        def encode_tiled(self, pixels, **kw):
            self.encode_args = kw
            return torch.zeros(1, 16, 2, 2, 2)

    core = CoreLikeVAE()
    out = TurboVAETiledDecode.execute(samples={"samples": torch.zeros(1, 16, 2, 2, 2)}, vae=core, tile_size=512,
                                      overlap=64, temporal_slice=0, mode="auto").args[0]
    assert out.shape == (5, 16, 16, 3)
    assert core.decode_args == {"tile_x": 64, "tile_y": 64, "overlap": 8, "tile_t": 16, "overlap_t": 2}
    TurboVAETiledEncode.execute(pixels=torch.zeros(5, 16, 16, 3), vae=core, tile_size=256, overlap=32,
                                temporal_slice=4, mode="auto")
    assert core.encode_args == {"tile_x": 256, "tile_y": 256, "overlap": 32, "tile_t": 16, "overlap_t": 8}


def test_core_tiled_contract_converts_latent_units():
    vae = _vae(VAE_NAMES[1])
    z = torch.randn(1, vae.latent_channels, 2, 8, 8)
    out = vae.decode_tiled(z, tile_x=16, tile_y=16, overlap=2, tile_t=2, overlap_t=1)  # core VAEDecodeTiled units
    torch.testing.assert_close(out, vae.decode(z), atol=1e-5, rtol=0)  # 128 px tile covers the frame
    frames = torch.rand(5, 64, 64, 3)
    enc = vae.encode_tiled(frames, tile_x=512, tile_y=512, overlap=64, tile_t=64, overlap_t=8)
    torch.testing.assert_close(enc, vae.encode(frames), atol=1e-5, rtol=0)


# -- compile settings -----------------------------------------------------------------------------------
def test_compile_settings_node_validates_and_builds_settings():
    assert "not a valid choice" in TurboVAECompileSettings.validate_inputs(mode="turbo")
    with pytest.raises(ValueError, match="dynamic='maybe'"):
        TurboVAECompileSettings.execute(dynamic="maybe")
    compile_mod = pytest.importorskip("turbovae.vae.accel.compile", reason="vae/accel/compile.py (kernels area) not landed yet")
    settings = TurboVAECompileSettings.execute(backend="inductor", mode="max-autotune-no-cudagraphs",
                                               dynamic="false", fullgraph=True, cache_size_limit=16).args[0]
    assert isinstance(settings, compile_mod.CompileSettings)
    assert (settings.mode, settings.dynamic, settings.fullgraph, settings.cache_size_limit) == \
        ("max-autotune-no-cudagraphs", "false", True, 16)
    for mode in ("reduce-overhead", "max-autotune"):  # torch.compile's CUDA graph trees: not offered, refused
        assert "not a valid choice" in TurboVAECompileSettings.validate_inputs(mode=mode)
    assert settings.cuda_graphs is False


@pytest.mark.slow
def test_node_counts_the_graph_pool_and_releases_it_on_unload():
    """Images through core VAE Decode replay the graph (progress after it); the pool is part of the size
    model management sees, and unloading the VAE (ComfyUI's detach) frees it."""
    from test_cuda_graphs import _ScriptedCaptureRunner

    settings = TurboVAECompileSettings.execute(backend="eager", cuda_graphs=True).args[0]
    vae = TurboVAELoader.execute(vae_name="qwen_image_tiny.safetensors", dtype="fp32", compile=settings).args[0]
    turbo = vae.turbo
    runner = _ScriptedCaptureRunner(turbo.model.decode_latents, pool=5 << 20)
    turbo._graphs[True] = runner
    base = vae.patcher.model_size()
    image = vae.decode(torch.randn(1, vae.latent_channels, 1, 4, 4))
    assert image.shape[-1] == 3 and runner.captures == 1  # core VAE Decode of an image used the graph
    assert vae.patcher.model_size() == base + (5 << 20)
    vae.decode(torch.randn(1, vae.latent_channels, 5, 4, 4))  # a clip: slices with progress, eagerly
    assert runner.captures == 1
    vae.patcher.detach()
    assert runner.pool_bytes == 0 and len(runner.cache) == 0 and vae.patcher.model_size() == base


def test_loader_opts_in_to_cuda_graphs_from_compile_settings():
    settings = TurboVAECompileSettings.execute(backend="eager", cuda_graphs=True).args[0]
    vae = TurboVAELoader.execute(vae_name="qwen_image_tiny.safetensors", dtype="fp32", compile=settings).args[0]
    assert set(vae.turbo._graphs) == {True, False}
    plain = _vae("qwen_image_tiny.safetensors")
    z = torch.randn(1, vae.latent_channels, 1, 4, 4)
    assert torch.equal(vae.decode(z), plain.decode(z))  # off CUDA the runner passes straight through


def test_compile_settings_node_says_what_compile_does_per_architecture():
    from turbovae.vae import gpu_defaults
    from turbovae.vae.registry import gpu_defaults_by_title

    schema = TurboVAECompileSettings.GET_SCHEMA()
    assert gpu_defaults.describe_compile(gpu_defaults_by_title()) in schema.description
    arch = next(i for i in schema.inputs if i.id == "architectures")
    assert arch.tooltip == gpu_defaults.describe_compile(gpu_defaults_by_title())
    assert "not a valid choice" in TurboVAECompileSettings.validate_inputs(architectures="some")
    settings = TurboVAECompileSettings.execute(backend="eager", architectures=gpu_defaults.COMPILE_ALL).args[0]
    assert settings.architectures == gpu_defaults.COMPILE_ALL


@pytest.mark.parametrize("architectures, compiled", [("where measured faster", False), ("all", True)])
def test_loader_leaves_seedvr2_eager_on_cuda_where_compile_measured_slower(monkeypatch, architectures, compiled):
    """The loader only decides here (the load device is faked as CUDA; nothing runs on it)."""
    from turbovae.vae.accel import compile as compile_mod

    calls = []
    monkeypatch.setattr(compile_mod, "apply_compile", lambda model, settings: calls.append(model.kind))
    monkeypatch.setattr(mm, "vae_device", lambda: torch.device("cuda"))
    settings = TurboVAECompileSettings.execute(backend="eager", architectures=architectures).args[0]
    TurboVAELoader.execute(vae_name="seedvr2_tiny.safetensors", dtype="fp32", compile=settings)
    assert calls == (["seedvr2"] if compiled else [])
    TurboVAELoader.execute(vae_name="qwen_image_tiny.safetensors", dtype="fp32", compile=settings)
    assert calls[-1] == "qwen_image"


# -- registration -----------------------------------------------------------------------------------------
def test_extension_lists_prefixed_nodes_with_tooltips_everywhere():
    ext = TurboVAEExtension()
    nodes = asyncio.run(ext.get_node_list())
    ids = [n.GET_SCHEMA().node_id for n in nodes]
    assert {"TurboVAELoader", "TurboVAECompileSettings", "TurboVAETiledDecode", "TurboVAETiledEncode"} <= set(ids)
    assert len(ids) == len(set(ids))
    for node in nodes:
        schema = node.GET_SCHEMA()
        assert schema.node_id.startswith("TurboVAE") and schema.category == "TurboVAE"
        for inp in schema.inputs:
            assert inp.tooltip, f"{schema.node_id}.{inp.id} has no tooltip"


def test_node_modules_stay_small():
    for path in NODES_DIR.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 300, path.name


def test_tensorrt_folder_is_merged_not_replaced(tmp_path):
    folder_paths.reset(str(tmp_path))
    user = str(tmp_path / "my_engines")
    folder_paths.folder_names_and_paths["tensorrt"] = ([user], {".trt"})
    entry = folder_paths.folder_names_and_paths["tensorrt"]
    paths = register_tensorrt_folder()
    assert paths == [user, os.path.join(folder_paths.models_dir, "tensorrt")]
    assert folder_paths.folder_names_and_paths["tensorrt"] is entry  # same tuple, merged in place
    assert {".trt", ".engine", ".plan"} <= entry[1]
    register_tensorrt_folder()
    assert len(entry[0]) == 2  # idempotent
    folder_paths.folder_names_and_paths["tensorrt"] = ([user], set())  # empty set = every file: keep it
    register_tensorrt_folder()
    assert folder_paths.folder_names_and_paths["tensorrt"][1] == set()
    del folder_paths.folder_names_and_paths["tensorrt"]
    register_tensorrt_folder()
    assert folder_paths.get_folder_paths("tensorrt") == [os.path.join(folder_paths.models_dir, "tensorrt")]


def test_import_turbovae_does_not_import_comfy():
    code = "import sys, turbovae; assert 'comfy' not in sys.modules and 'folder_paths' not in sys.modules; " \
           "assert callable(turbovae.load_vae) and callable(turbovae.decode_tiled) and callable(turbovae.encode_tiled); " \
           "assert inspect.iscoroutinefunction(turbovae.comfy_entrypoint)"
    subprocess.run([sys.executable, "-c", "import inspect; " + code], check=True, timeout=120)
    assert inspect.isclass(TurboVAEExtension)


# -- what the nodes say they did ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", VAE_NAMES)
def test_nodes_report_mode_tiles_backend_and_time(name, caplog):
    vae = _vae(name)
    torch.manual_seed(4)
    z = torch.randn(1, vae.latent_channels, 1, 8, 12)  # 64x96 px
    calls = []
    comfy.utils.PROGRESS_BAR_HOOK = lambda value, total, preview, node_id=None: calls.append((value, total))
    with caplog.at_level("INFO"):
        out = TurboVAETiledDecode.execute(samples={"samples": z}, vae=vae, tile_size=64, overlap=16, mode="auto")
    report = vae.last_report
    chosen = "exact" if supports_exact(vae.turbo.model, decode=True) else "fast"
    assert report.how == f"{chosen} tiles 64 px ×2, whole clip" and len(calls) >= 2  # 96 px wide: two 64 px tiles
    assert report.requested == "auto" and report.predicted_mb > 0
    assert report.what == "decode" and report.backend == "PyTorch" and report.seconds > 0
    assert out.ui == {"text": [report.line()]} and report.line() in caplog.text
    TurboVAETiledDecode.execute(samples={"samples": z}, vae=vae, tile_size=256, overlap=16, mode="auto")
    assert vae.last_report.how == "untiled, whole clip"
    enc = TurboVAETiledEncode.execute(pixels=torch.rand(1, 64, 64, 3), vae=vae, tile_size=0, mode="fast")
    assert vae.last_report.what == "encode" and enc.ui["text"][0].startswith("TurboVAE encode (fast): ")
    vae.decode(z)  # core VAE Decode
    assert vae.last_report.how == "untiled, whole clip" and "predicted" in vae.last_report.line()


def test_core_vae_decode_shows_progress_and_stops_on_cancel():
    vae = _vae(VAE_NAMES[0])
    z = torch.randn(3, vae.latent_channels, 1, 4, 4)
    seen = []

    def hook(value, total, preview, node_id=None):
        seen.append((value, total))
        mm.interrupt_current_processing(True)  # Cancel after the first image of the batch

    comfy.utils.PROGRESS_BAR_HOOK = hook
    with pytest.raises(mm.InterruptProcessingException):
        vae.decode(z)  # what core VAE Decode calls
    assert seen == [(1, 3)]
    mm.interrupt_processing = False
    comfy.utils.PROGRESS_BAR_HOOK = None
    assert vae.decode(z).shape == (3, 1, 32, 32, 3)  # still usable (5-D latents: [B, T, H, W, C])


def _progress_log(call):
    """(result, [(value, total), …]) of `call()` with every UI progress update recorded (the autouse fixture
    removes the hook after the test)."""
    seen = []
    comfy.utils.PROGRESS_BAR_HOOK = lambda value, total, preview, node_id=None: seen.append((value, total))
    return call(), seen


@pytest.mark.parametrize("name", VAE_NAMES)
def test_core_vae_decode_and_encode_of_a_clip_step_through_slices_and_cancel_between_them(name):
    """A clip through core VAE Decode/Encode: several progress steps (temporal slices, which carry the causal
    memory, so the result is the whole-clip pass's), and Cancel stops the pass between two slices."""
    vae = _vae(name)
    z = torch.randn(1, vae.latent_channels, 9, 4, 4, generator=torch.Generator().manual_seed(5))
    out, seen = _progress_log(lambda: vae.decode(z))
    whole = vae.turbo.decode(vae._check_latents(z), temporal_slice=None)  # one whole-clip pass (raw latents)
    assert (out - vae.clip_to_image(whole, False)).abs().max().item() <= 1e-5
    assert len({v for v, _ in seen}) == 4 and seen[-1][0] == seen[-1][1]  # 9 latents: slices of 3, 2, 2, 2
    assert [v for v, _ in seen] == sorted(v for v, _ in seen)

    frames = torch.rand(9, 32, 32, 3, generator=torch.Generator().manual_seed(6))  # 9 frames -> 3 latents
    lat, enc_seen = _progress_log(lambda: vae.encode(frames))
    ref = vae.to_comfy_latents(vae.turbo.encode(vae._image_to_clip(frames)))
    assert (lat - ref.float()).abs().max().item() <= 1e-5
    assert len({v for v, _ in enc_seen}) == 2 and enc_seen[-1][0] == enc_seen[-1][1]  # 3 latents: slices of 2, 1

    def cancel_at_second(value, total, preview, node_id=None):
        if value == 2:
            mm.interrupt_current_processing(True)

    comfy.utils.PROGRESS_BAR_HOOK = cancel_at_second
    with pytest.raises(mm.InterruptProcessingException):
        vae.decode(z)


def test_tile_minimum_follows_the_architecture():
    from turbovae.nodes import tiled_nodes

    class Wan22Like:  # the node reads only these two attributes
        is_turbovae = True
        turbo = type("T", (), {"spatial_factor": 16})()

    assert tiled_nodes._min_tile(Wan22Like()) == 128 and tiled_nodes._min_tile(_vae(VAE_NAMES[0])) == 64
    with pytest.raises(ValueError, match="at least 128 pixels"):
        tiled_nodes.node_tiling(96, 16, 0, "auto", tiled_nodes._min_tile(Wan22Like()))


def test_tiled_api_defaults_to_auto_like_the_nodes():
    from turbovae import decode_tiled, encode_tiled

    assert inspect.signature(decode_tiled).parameters["mode"].default == "auto"
    assert inspect.signature(encode_tiled).parameters["mode"].default == "auto"


def test_fixed_combo_options_are_the_librarys_tables():
    """One table per fact: every combo whose options are fixed is exactly one of the library's option tables
    (what the library accepts), never a list restated in the node; file lists and node-only UI choices are
    named here with the reason."""
    from turbovae.trt.backends import BACKEND_CHOICES
    from turbovae.trt.buckets import MODES as ENGINE_SET_MODES
    from turbovae.vae.accel import compile as compile_settings
    from turbovae.vae.dtypes import DTYPE_CHOICES, DTYPE_NAMES
    from turbovae.vae.gpu_defaults import COMPILE_ARCHITECTURES
    from turbovae.vae.input_rules import MODES as TILE_MODES

    library = {TILE_MODES, DTYPE_CHOICES, DTYPE_NAMES, BACKEND_CHOICES, ENGINE_SET_MODES, compile_settings.MODES,
               compile_settings.BACKENDS, tuple(compile_settings.DYNAMIC), COMPILE_ARCHITECTURES}
    _assert_no_restated_tables(library)
    file_lists = {"vae_name", "engine", "fallback_vae"}  # the model folders' contents, listed at load
    node_only = {("TurboVAELoadEngine", "scope")}  # how Load TRT VAE reads its selection: a UI choice only
    node_helpers.use_comfy_stubs()
    try:
        from turbovae.nodes.engine_nodes import ENGINE_NODES
    finally:
        node_helpers.hide_comfy_stubs()
    seen = 0
    for node in [*all_nodes(), *ENGINE_NODES]:
        schema = node.define_schema()
        for inp in schema.inputs:
            if inp.options is None or inp.id in file_lists or (schema.node_id, inp.id) in node_only:
                continue
            seen += 1
            assert tuple(inp.options) in library, (schema.node_id, inp.id, inp.options)
    assert seen >= 7  # tile mode ×2, loader dtype, compile backend/mode/dynamic, engine mode/backend/dtype


def _assert_no_restated_tables(library: set) -> None:
    """No literal list of strings in the nodes or the command lines has the same members as a library table
    (a copy would pass the option check above until the library's table changes)."""
    import ast

    root = NODES_DIR.parent
    members = {frozenset(t) for t in library}
    for path in [*NODES_DIR.glob("*.py"), *(root / "cli").glob("*.py"), root / "bench" / "runner.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) > 1 and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
                literal = frozenset(e.value for e in node.elts)
                assert literal not in members, f"{path.name}:{node.lineno} restates {sorted(literal)}"
