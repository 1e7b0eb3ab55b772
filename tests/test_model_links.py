"""Model folders as users keep them (issue 41, item 5): one model store shared by several installs through
symbolic links or extra_model_paths.yaml. A file listed in a model folder — directly, through a linked file
or folder, or under an extra root — is the user's to use, and so is an engine set built from it; a recorded
path that climbs out of the folders ('..', an absolute path nothing in them links to) is refused.

Real links (os.symlink) in pytest's temporary folders; engines are the toy set built through the production
path with only the compile swapped for torch.export (tests/engines_toy.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import node_helpers
from engines_toy import edit_manifest, export_only, toy_checkpoint

node_helpers.use_comfy_stubs()

from turbovae.trt.buckets import Bucket, static_table  # noqa: E402
from turbovae.trt.build import build_engine_set  # noqa: E402
from turbovae.trt.engine_vae import EngineSourceError, load_engine_vae  # noqa: E402
from turbovae.nodes import engine_nodes  # noqa: E402
from turbovae.nodes import paths as _paths  # noqa: E402

folder_paths = _paths.folder_paths
node_helpers.hide_comfy_stubs()

FILES = ("encoder_64x64.pt2", "decoder_64x64.pt2")


@pytest.fixture(scope="module")
def engine_set(tmp_path_factory):
    """An engine set and the checkpoint it was built from, in a folder outside any model folder."""
    root = tmp_path_factory.mktemp("links")
    ckpt, vae = toy_checkpoint(root)
    with export_only():
        build_engine_set(vae, root / "set", static_table(Bucket(64, 64)), backend="aoti",
                         device=torch.device("cpu"), source=str(ckpt))
    return root / "set", ckpt


@pytest.fixture
def store(tmp_path, engine_set):
    """A shared model store outside the ComfyUI tree holding the checkpoint, and an empty models/vae."""
    shared = tmp_path / "store"
    shared.mkdir()
    shutil.copy(engine_set[1], shared / "toy.safetensors")
    vae_dir = tmp_path / "comfy" / "models" / "vae"
    vae_dir.mkdir(parents=True)
    return shared, vae_dir


def _engines_recording(engine_set, tmp_path: Path, source: str) -> Path:
    folder = tmp_path / "engines"
    shutil.copytree(engine_set[0], folder)
    for entry in FILES:
        edit_manifest(folder, entry, source=source)
    return folder


def _loads(folder: Path, roots) -> None:
    with export_only():
        vae = load_engine_vae(folder, device="cpu", source_roots=roots)
    assert vae.engines is not None


# -- trt/: the recorded checkpoint against the model folders ------------------------------------------
def test_a_checkpoint_linked_into_the_folder_is_the_users(engine_set, store, tmp_path):
    """What Build Engine records for a linked file is the link's path in models/vae (issue 41's failure: the
    check resolved the link and found the store outside the folder)."""
    shared, vae_dir = store
    (vae_dir / "toy.safetensors").symlink_to(shared / "toy.safetensors")
    _loads(_engines_recording(engine_set, tmp_path, str(vae_dir / "toy.safetensors")), [vae_dir])


def test_a_linked_sub_folder_is_the_users(engine_set, store, tmp_path):
    shared, vae_dir = store
    (vae_dir / "shared").symlink_to(shared, target_is_directory=True)
    _loads(_engines_recording(engine_set, tmp_path, str(vae_dir / "shared" / "toy.safetensors")), [vae_dir])


def test_a_recorded_link_target_is_the_users_when_the_folder_links_it(engine_set, store, tmp_path):
    """Engines built outside ComfyUI record the resolved checkpoint; a link to it in models/vae makes it the
    user's (under any link name)."""
    shared, vae_dir = store
    folder = _engines_recording(engine_set, tmp_path, str(shared / "toy.safetensors"))
    with pytest.raises(EngineSourceError, match="outside the VAE model folder"):
        _loads(folder, [vae_dir])
    (vae_dir / "my_toy.safetensors").symlink_to(shared / "toy.safetensors")
    _loads(folder, [vae_dir])


def test_an_extra_root_and_a_linked_root_are_model_folders(engine_set, store, tmp_path):
    """extra_model_paths.yaml adds roots; a root may itself be a link to the store."""
    shared, vae_dir = store
    extra = tmp_path / "extra_vae"
    extra.symlink_to(shared, target_is_directory=True)
    _loads(_engines_recording(engine_set, tmp_path, str(extra / "toy.safetensors")), [vae_dir, extra])


@pytest.mark.parametrize("how", ["dotdot", "absolute_outside", "dotdot_to_a_linked_file"])
def test_a_recorded_path_that_climbs_out_is_refused(engine_set, store, tmp_path, how):
    shared, vae_dir = store
    if how == "dotdot_to_a_linked_file":  # the file is linked in, but the recorded name climbs out to reach it
        (vae_dir / "toy.safetensors").symlink_to(shared / "toy.safetensors")
    source = {"dotdot": vae_dir / ".." / ".." / ".." / "store" / "toy.safetensors",
              "absolute_outside": shared / "toy.safetensors",
              "dotdot_to_a_linked_file": vae_dir / ".." / ".." / ".." / "store" / "toy.safetensors"}[how]
    assert Path(source).resolve() == (shared / "toy.safetensors").resolve()
    folder = _engines_recording(engine_set, tmp_path, str(source))
    with pytest.raises(EngineSourceError, match="outside the VAE model folder|climbs out"):
        _loads(folder, [vae_dir])


def test_a_link_loop_in_the_folder_does_not_hang_the_check(engine_set, store, tmp_path):
    shared, vae_dir = store
    (vae_dir / "loop").symlink_to(vae_dir, target_is_directory=True)
    (vae_dir / "sub").mkdir()
    (vae_dir / "sub" / "up").symlink_to(vae_dir, target_is_directory=True)
    folder = _engines_recording(engine_set, tmp_path, str(shared / "toy.safetensors"))
    with pytest.raises(EngineSourceError, match="outside the VAE model folder"):
        _loads(folder, [vae_dir])


# -- nodes/: names from the UI ------------------------------------------------------------------------------
@pytest.fixture
def comfy_tree(store, engine_set, tmp_path, monkeypatch):
    """The stub folder_paths rooted at tmp_path/comfy, the checkpoint linked into models/vae and an engine
    set in models/tensorrt recording the link (as Build Engine records it)."""
    shared, vae_dir = store
    folder_paths.reset(str(tmp_path / "comfy"))
    (vae_dir / "toy.safetensors").symlink_to(shared / "toy.safetensors")
    _paths.register_tensorrt_folder()
    engines = tmp_path / "comfy" / "models" / "tensorrt" / "toy_set"
    shutil.copytree(engine_set[0], engines)
    for entry in FILES:
        edit_manifest(engines, entry, source=str(vae_dir / "toy.safetensors"))
    return shared, vae_dir


def test_load_engine_node_runs_engines_built_from_a_linked_vae(comfy_tree):
    with export_only():
        vae = engine_nodes.TurboVAELoadEngine.execute(engine="toy_set/manifest.json").args[0]
    assert vae.turbo.engines is not None


def test_names_in_linked_and_extra_folders_resolve_and_climbing_names_do_not(comfy_tree, tmp_path):
    shared, vae_dir = comfy_tree
    (vae_dir / "shared").symlink_to(shared, target_is_directory=True)
    extra = tmp_path / "extra_vae"
    extra.mkdir()
    (extra / "other.safetensors").symlink_to(shared / "toy.safetensors")
    folder_paths.add_model_folder_path("vae", str(extra))
    assert {"toy.safetensors", "shared/toy.safetensors", "other.safetensors"} <= set(_paths.list_model_files("vae"))
    assert _paths.resolve_model_file("vae", "shared/toy.safetensors") == str(vae_dir / "shared" / "toy.safetensors")
    assert _paths.resolve_model_file("vae", "other.safetensors") == str(extra / "other.safetensors")
    for name in ("../../store/toy.safetensors", str(shared / "toy.safetensors"), "shared/../../x.safetensors"):
        with pytest.raises(_paths.UnsafePathError):
            _paths.resolve_model_file("vae", name)
