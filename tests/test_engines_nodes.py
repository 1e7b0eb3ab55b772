"""Engine nodes against the ComfyUI test doubles: without TensorRT, Load TRT VAE explains the fix and
falls back to the PyTorch VAE; Build Engine validates its inputs before any work."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

import node_helpers  # noqa: E402

node_helpers.use_comfy_stubs()

from turbovae import load_vae  # noqa: E402
from turbovae.nodes import engine_nodes  # noqa: E402
from turbovae.nodes import paths as _paths  # noqa: E402
from turbovae.trt import engine_vae  # noqa: E402
from turbovae.trt.buckets import Bucket, static_table  # noqa: E402
from turbovae.trt.engine_vae import EngineFallbackWarning  # noqa: E402
from turbovae.trt.fileio import file_sha256  # noqa: E402
from turbovae.trt.identity import EngineIdentity, model_hash  # noqa: E402
from turbovae.trt.manifest import Manifest, ManifestEntry  # noqa: E402

folder_paths = _paths.folder_paths
node_helpers.hide_comfy_stubs()

NAME = "qwen_image_tiny.safetensors"


@pytest.fixture
def comfy_root(tmp_path, monkeypatch):
    folder_paths.reset(str(tmp_path))
    vae_dir = tmp_path / "models" / "vae"
    vae_dir.mkdir(parents=True)
    ckpt, cfg = node_helpers.write_tiny_vae(vae_dir, NAME)
    # Same seam as the node tests: real-size default configs cannot hold tiny weights.
    monkeypatch.setattr(engine_vae, "load_checkpoint", lambda p, **kw: load_vae(p, config=cfg, **kw))
    return tmp_path, ckpt, cfg


def _fake_trt_set(folder: Path, ckpt: Path, cfg) -> Path:
    """A TensorRT engine + identity as Build Engine writes them (the plan bytes are never read here)."""
    folder.mkdir(parents=True)
    plan = folder / "decoder_64x64.engine"
    plan.write_bytes(b"plan")
    vae = load_vae(ckpt, config=cfg, device="cpu")
    ident = EngineIdentity(model_hash=model_hash(vae.model.state_dict()), model_kind=vae.kind, component="decoder",
                           dtype="fp16", table=static_table(Bucket(64, 64)).to_json(), entries=(0,),
                           input_names=("latents",), output_names=("pixels",), backend="tensorrt",
                           backend_version="11.4.0.106", device_type="cuda", gpu_name="NVIDIA H100",
                           compute_capability="9.0", torch_version=torch.__version__,
                           engine_sha256=file_sha256(plan), engine_bytes=4, source=str(ckpt),
                           latent_format={"channels": 4, "spatial_factor": 8})
    Manifest(folder, (ManifestEntry(plan.name, ident),)).write()
    return plan


def test_load_trt_vae_without_tensorrt_falls_back_and_names_the_fix(comfy_root, monkeypatch):
    base, ckpt, cfg = comfy_root
    _fake_trt_set(base / "models" / "tensorrt" / "qwen_set", ckpt, cfg)
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    assert engine_nodes._engine_names() == ["qwen_set/decoder_64x64.engine", "qwen_set/manifest.json"]
    with pytest.warns(EngineFallbackWarning, match="pip install tensorrt"):
        out = engine_nodes.TurboVAELoadEngine.execute(engine="qwen_set/decoder_64x64.engine")
    vae = out.args[0]
    assert vae.turbo.engines is None
    z = torch.randn(1, 4, 4, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EngineFallbackWarning)  # one warning only, at load
        got = vae.turbo.decode(z)
    ref = load_vae(ckpt, config=cfg, device="cpu", dtype=vae.turbo.dtype).decode(z)
    assert torch.equal(got, ref)


def test_load_rejects_paths_outside_the_models_folder(comfy_root):
    with pytest.raises((ValueError, FileNotFoundError)):
        engine_nodes.TurboVAELoadEngine.execute(engine="../../etc/passwd.engine")


@pytest.mark.parametrize("bad", [{"name": "../x"}, {"name": ""}, {"mode": "cropped"}, {"backend": "onnx"},
                                 {"mode": "multi_profile", "video": True}])
def test_build_engine_validates_before_work(comfy_root, bad):
    kw = dict(vae_name=NAME, name="set", mode="static", width=64, height=64, backend="aoti", dtype="fp32")
    kw.update(bad)
    with pytest.raises(ValueError):
        engine_nodes.TurboVAEBuildEngine.execute(**kw)


def test_build_engine_fails_fast_without_evicting_models(comfy_root, monkeypatch):
    """A missing TensorRT or an existing engine must fail before ComfyUI's models are unloaded and the
    checkpoint is read: the user loses nothing and hears the fix at once."""
    from turbovae.trt.interface import BackendUnavailable

    mm = engine_nodes.mm  # the (test double) model management the node module imported
    base = comfy_root[0]
    monkeypatch.setattr(mm, "unload_all_calls", [])
    monkeypatch.setattr(engine_nodes, "resolve_model_file",
                        lambda *a: pytest.fail("the checkpoint must not be read before the checks"))
    kw = dict(vae_name=NAME, name="set", mode="static", width=64, height=64, dtype="fp32")
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(BackendUnavailable, match="backend `aoti` in the Build Engine node"):
        engine_nodes.TurboVAEBuildEngine.execute(backend="tensorrt", **kw)
    existing = base / "models" / "tensorrt" / "set" / "decoder_64x64.pt2"
    existing.parent.mkdir(parents=True)
    existing.write_bytes(b"a user's engine")
    with pytest.raises(FileExistsError):
        engine_nodes.TurboVAEBuildEngine.execute(backend="aoti", **kw)
    assert existing.read_bytes() == b"a user's engine"
    assert mm.unload_all_calls == []


def test_node_list_and_schemas():
    ids = [n.define_schema().node_id for n in engine_nodes.ENGINE_NODES]
    assert ids == ["TurboVAEBuildEngine", "TurboVAELoadEngine"]


class _CountingEngines:
    """Stands in for an EngineSet: device memory it would hold, and how often it was released."""

    def __init__(self, footprint: int, kind: str):
        self.footprint = footprint
        self.kind = kind  # the model kind its engines were built for (EngineVAE checks it)
        self.released = 0

    def footprint_bytes(self) -> int:
        return self.footprint

    def release(self) -> None:
        self.released += 1


def test_model_management_counts_engine_memory_and_unloading_releases_engines(comfy_root):
    from turbovae.nodes.comfy_vae import ComfyTurboVAE
    from turbovae.trt.engine_vae import EngineVAE

    _base, ckpt, cfg = comfy_root
    model = load_vae(ckpt, config=cfg, device="cpu").model
    weights = sum(t.nelement() * t.element_size() for t in model.state_dict().values())
    engines = _CountingEngines(123_456_789, model.kind)
    vae = ComfyTurboVAE(EngineVAE(model, engines))
    assert vae.patcher.model_size() == weights + 123_456_789
    vae.patcher.detach()  # what model management does to free memory
    assert engines.released == 1
    plain = ComfyTurboVAE(load_vae(ckpt, config=cfg, device="cpu"))
    assert plain.patcher.model_size() == weights
    plain.patcher.detach()  # no engines: nothing to release, nothing breaks


def test_missing_onnx_export_names_the_install_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    with pytest.raises(ImportError, match="pip install onnx onnxscript.*backend aoti"):
        engine_nodes._require_onnx_export()


def test_requirements_install_only_what_the_nodes_need():
    lines = (Path(__file__).resolve().parents[1] / "requirements.txt").read_text().splitlines()
    names = {line.split(">")[0].split("=")[0].split("!")[0].strip() for line in lines if line.strip()
             and not line.lstrip().startswith("#")}
    assert names == {"safetensors", "numpy"}  # onnx/onnxscript/tensorrt are optional extras


def test_a_folder_manifest_is_offered_and_loads_the_whole_set(comfy_root, monkeypatch):
    """Load TRT VAE offers each engine folder's manifest.json and loads the folder from it (any scope), so a
    workflow can name what Build Engine wrote without knowing which backend built it."""
    base, ckpt, cfg = comfy_root
    _fake_trt_set(base / "models" / "tensorrt" / "qwen_set", ckpt, cfg)
    (base / "models" / "tensorrt" / "notes.json").write_text("{}")  # other JSON files are not offered
    assert engine_nodes._engine_names() == ["qwen_set/decoder_64x64.engine", "qwen_set/manifest.json"]
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    loaded, real_load = [], engine_vae.load_engine_vae

    def record(target, **kw):
        loaded.append(Path(target))
        return real_load(target, **kw)

    monkeypatch.setattr(engine_vae, "load_engine_vae", record)
    with pytest.warns(EngineFallbackWarning, match="pip install tensorrt"):
        vae = engine_nodes.TurboVAELoadEngine.execute(engine="qwen_set/manifest.json", scope="file").args[0]
    assert loaded == [base / "models" / "tensorrt" / "qwen_set"]  # the folder, though scope is file
    z = torch.randn(1, 4, 4, 6)
    torch.testing.assert_close(vae.turbo.decode(z), load_vae(ckpt, config=cfg, device="cpu",
                                                             dtype=vae.turbo.dtype).decode(z), atol=0, rtol=0)


def test_the_shipped_engine_workflows_name_the_same_folder():
    """engine_build.json writes models/tensorrt/<name>/ whatever the backend; engine_load_decode.json loads
    <name>/manifest.json, which every build writes (TensorRT or AOTInductor)."""
    import json

    root = Path(__file__).resolve().parents[1] / "workflows"
    build = json.loads((root / "engine_build.json").read_text())
    load = json.loads((root / "engine_load_decode.json").read_text())
    (build_node,) = [n for n in build["nodes"] if n["type"] == "TurboVAEBuildEngine"]
    (load_node,) = [n for n in load["nodes"] if n["type"] == "TurboVAELoadEngine"]
    assert build_node["widgets_values"][5] == "auto"  # backend: TensorRT where it can, else AOTInductor
    assert load_node["widgets_values"][0] == f"{build_node['widgets_values'][1]}/manifest.json"


@pytest.mark.slow
def test_the_shipped_engine_workflows_build_and_decode_a_wan_clip(comfy_root, monkeypatch):
    """engine_build.json's Build Engine with a Qwen-Image / Wan 2.1 VAE and video on, then engine_load_decode.json's
    Load TRT VAE: nothing refuses the Wan VAE, and a clip decodes on its video slice engines, equal to eager.
    The widgets are the shipped ones except the file, a CPU-test size and fp32 (Inductor's compile is swapped
    for a plain export save/load, as in tests/test_engines_video_wan.py)."""
    import json

    from engines_toy import export_only

    from turbovae.vae import loader

    base, ckpt, cfg = comfy_root
    real_load = loader.load_checkpoint
    # Build Engine's loader
    monkeypatch.setattr(loader, "load_checkpoint", lambda p, **kw: real_load(p, config=cfg, **kw))
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # backend auto -> aoti, as on any machine without TensorRT
    root = Path(__file__).resolve().parents[1] / "workflows"

    def widgets(workflow: str, node: type) -> dict:
        schema = node.define_schema()
        (entry,) = [n for n in json.loads((root / workflow).read_text())["nodes"] if n["type"] == schema.node_id]
        return dict(zip([i.id for i in schema.inputs], entry["widgets_values"]))

    build = dict(widgets("engine_build.json", engine_nodes.TurboVAEBuildEngine), vae_name=NAME, width=48, height=32,
                 dtype="fp32", video=True)
    with export_only():
        folder = Path(engine_nodes.TurboVAEBuildEngine.execute(**build).args[0])
        vae = engine_nodes.TurboVAELoadEngine.execute(**widgets("engine_load_decode.json",
                                                                engine_nodes.TurboVAELoadEngine)).args[0]
        z = torch.randn(1, 4, 3, 4, 6, generator=torch.Generator().manual_seed(0))  # 9 frames at 48x32
        with warnings.catch_warnings():
            warnings.simplefilter("error", EngineFallbackWarning)
            got = vae.turbo.decode(z)
    assert folder == base / "models" / "tensorrt" / build["name"]
    assert {p.name for p in folder.iterdir()} >= {"decode_slice_first_48x32.pt2", "decode_slice_next_48x32.pt2"}
    assert vae.turbo.engine_calls == 1
    ref = load_vae(ckpt, config=cfg, device="cpu").decode(z)
    assert got.shape == ref.shape == (1, 3, 9, 32, 48) and (got - ref).abs().max() <= 1e-4
