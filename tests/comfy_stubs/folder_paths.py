"""TEST DOUBLE of ComfyUI's folder_paths (only what TurboVAE uses). Not ComfyUI code."""

import os

supported_pt_extensions = {".ckpt", ".pt", ".pt2", ".bin", ".pth", ".safetensors", ".pkl", ".sft"}
base_path = os.environ.get("TURBOVAE_STUB_COMFY_BASE", os.path.abspath("."))
models_dir = os.path.join(base_path, "models")
folder_names_and_paths: dict = {}


def reset(base: str) -> None:
    """Test helper: point the registry at a fresh base folder."""
    global base_path, models_dir
    base_path = base
    models_dir = os.path.join(base, "models")
    folder_names_and_paths.clear()
    folder_names_and_paths["vae"] = ([os.path.join(models_dir, "vae")], supported_pt_extensions)


def add_model_folder_path(folder_name, full_folder_path, is_default=False):
    if folder_name in folder_names_and_paths:
        paths = folder_names_and_paths[folder_name][0]
        if full_folder_path not in paths:
            paths.insert(0, full_folder_path) if is_default else paths.append(full_folder_path)
    else:
        folder_names_and_paths[folder_name] = ([full_folder_path], set())


def get_folder_paths(folder_name):
    return folder_names_and_paths[folder_name][0][:]


def get_full_path(folder_name, filename):
    if folder_name not in folder_names_and_paths:
        return None
    filename = os.path.relpath(os.path.join("/", filename), "/")  # ComfyUI's '..' sanitising
    for folder in folder_names_and_paths[folder_name][0]:
        full = os.path.join(folder, filename)
        if os.path.isfile(full):
            return full
    return None


def get_filename_list(folder_name):
    paths, exts = folder_names_and_paths[folder_name]
    out = set()
    for folder in paths:
        for root, _dirs, files in os.walk(folder, followlinks=True):
            for name in files:
                if not exts or os.path.splitext(name)[1].lower() in exts:
                    out.add(os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/"))
    return sorted(out)
