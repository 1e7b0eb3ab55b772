"""Engine nodes: Build Engine (AOTInductor or TensorRT, writes into models/tensorrt) and Load TRT VAE
(an engine file or its folder -> the standard TurboVAE `VAE`, with PyTorch fallback).

`tensorrt` is never imported here: the backends import it when a build or load needs it, and a
missing TensorRT shows up as a fallback warning (load) or an error naming the fix (build).
"""

from __future__ import annotations

import logging
import os

import comfy.model_management as mm
import comfy.utils
from comfy_api.latest import io

from ..trt.backends import AUTO_BACKEND, BACKEND_CHOICES, missing_onnx_export, resolve_backend
from ..trt.buckets import MODES
from ..trt.formats import LOADABLE_ENGINE_NAMES, MANIFEST_NAME
from ..vae.dtypes import DTYPE_NAMES
from ..vae.registry import titles
from .choices import check_choice
from .comfy_vae import WORKING_DTYPES, ComfyTurboVAE
from .schema import combo, node_schema, vae_file_input
from .paths import TENSORRT_KEY, VAE_KEY, check_model_name, engine_output_dir, list_model_files, model_roots, \
    register_tensorrt_folder, resolve_model_file

log = logging.getLogger(__name__)
SCOPES = ("folder", "file")


def _engine_names() -> list[str]:
    register_tensorrt_folder()
    return list_model_files(TENSORRT_KEY, LOADABLE_ENGINE_NAMES)


class TurboVAEBuildEngine(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return node_schema("TurboVAEBuildEngine", "Build Engine (TurboVAE)",
            [vae_file_input("VAE checkpoint in models/vae to build engines for"),
             io.String.Input("name", default="turbovae_engines",
                             tooltip="Sub-folder of models/tensorrt to create (never overwritten unless asked)"),
             combo("mode", MODES, "static: one size (width x height); multi_ratio: a set of ratio buckets (inputs "
                   "padded to the smallest that fits, output cropped back); multi_profile: dynamic engines for <=1 MP, "
                   "<=2.8 MP, <=4 MP", default="static"),
             io.Int.Input("width", default=1024, min=64, max=4096, step=16, tooltip="static mode only"),
             io.Int.Input("height", default=1024, min=64, max=4096, step=16, tooltip="static mode only"),
             combo("backend", BACKEND_CHOICES, "auto: tensorrt where it can build here, else aoti (the log says which "
                   "and why); tensorrt: fastest, needs an NVIDIA GPU, the tensorrt package and onnx + onnxscript; "
                   "aoti: AOTInductor, needs only PyTorch", default=AUTO_BACKEND),
             combo("dtype", DTYPE_NAMES, "Engine precision (baked into the engine)", default="fp16"),
             io.Boolean.Input("overwrite", default=False,
                              tooltip="Replace engines already in that folder (otherwise the build refuses)"),
             io.Boolean.Input("video", default=False,
                              tooltip="Also build video decode engines (one first-slice and one next-slice engine per "
                                      f"size) so videos decode on engines too: {titles()} (any VAE with explicit "
                                      "causal cache). Needs static or multi_ratio mode")],
            [io.String.Output(display_name="engine_folder")], is_output_node=True,
            description="Exports a VAE from models/vae and builds encoder/decoder engines into models/tensorrt/<name> "
                        f"(with video on, also video decode engines for {titles()}). TensorRT needs an NVIDIA GPU and "
                        "the tensorrt package; AOTInductor needs neither. Builds take minutes; Cancel stops between "
                        "phases (TensorRT also inside its builder).")

    @classmethod
    def execute(cls, vae_name: str, name: str, mode: str, width: int, height: int, backend: str, dtype: str,
                overwrite: bool = False, video: bool = False) -> io.NodeOutput:
        import torch

        from ..trt.interface import BuildProgress
        from ..trt.buckets import Bucket, multi_profile_table, multi_ratio_table, static_table
        from ..trt.build import build_engine_set, preflight
        from ..vae.loader import load_checkpoint
        from ..vae.dtypes import parse_dtype

        for what, value, allowed in (("mode", mode, MODES), ("backend", backend, BACKEND_CHOICES),
                                     ("dtype", dtype, DTYPE_NAMES)):
            check_choice(what, value, allowed)
        check_model_name(vae_name)  # a NUL, newline or blank name fails here, before anything is evicted
        if not isinstance(name, str) or not name.strip() or name != name.strip() or any(
                c in name for c in (os.sep, "/", "\\", ":")) or name.startswith(".") or any(
                ord(c) < 32 or ord(c) == 127 for c in name):
            raise ValueError(f"engine folder name {name!r} must be a plain folder name (no slashes, leading dot, "
                             "surrounding spaces or control characters)")
        if video and mode == "multi_profile":
            raise ValueError("video engines are static-shape: use mode static or multi_ratio with video on")
        table = {"static": lambda: static_table(Bucket(height, width)), "multi_ratio": multi_ratio_table,
                 "multi_profile": multi_profile_table}[mode]()
        out = os.path.join(engine_output_dir(), name)
        device = mm.get_torch_device()
        backend, why = resolve_backend(backend, device)
        log.info("TurboVAE build: backend %s (%s)", backend, why)
        # Backend, table and existing files are checked before anything is evicted or loaded.
        preflight(out, table, backend=backend, device=device, video=video, overwrite=overwrite)
        if backend == "tensorrt":
            _require_onnx_export()
        checkpoint = resolve_model_file(VAE_KEY, vae_name)  # a missing file also fails before the eviction
        mm.unload_all_models()  # builders size their workspace from free memory
        mm.soft_empty_cache()
        vae = load_checkpoint(checkpoint, dtype=torch.float32, device=device)
        bar = comfy.utils.ProgressBar(100)

        def report(message: str, fraction) -> None:
            log.info("TurboVAE build: %s", message)
            if fraction is not None:
                bar.update_absolute(int(100 * fraction), 100)

        def cancelled() -> bool:
            return mm.processing_interrupted()

        build_engine_set(vae, out, table, backend=backend, dtype=parse_dtype(dtype), device=device, video=video,
                         overwrite=overwrite, progress=BuildProgress(report, cancelled), source=None)
        del vae
        mm.soft_empty_cache()
        mm.throw_exception_if_processing_interrupted()
        return io.NodeOutput(out)


class TurboVAELoadEngine(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return node_schema("TurboVAELoadEngine", "Load TRT VAE (TurboVAE)",
            [combo("engine", _engine_names(), "A folder's manifest.json in models/tensorrt (every engine Build Engine "
                   "wrote there, TensorRT or AOTInductor) or one engine file"),
             combo("scope", SCOPES, "folder: load every engine next to this one (encoder + decoder, all buckets); "
                   "file: only this engine (a manifest.json always loads its folder)", default="folder"),
             combo("fallback_vae", ["(built from)"] + list_model_files(VAE_KEY), "Checkpoint for the PyTorch path; "
                   "default: the one the engines were built from"),
             io.Boolean.Input("lazy", default=False, tooltip="Load each engine on first use"),
             io.Boolean.Input("pad_to_bucket", default=False,
                              tooltip="Run sizes between buckets padded into the next bucket (faster, but APPROXIMATE: "
                                      "differs from the PyTorch VAE near the edges and through attention). Off: such "
                                      "sizes run on the PyTorch VAE, exactly")],
            [io.Vae.Output()],
            description="Loads engines from models/tensorrt as a standard VAE. Single frames run on the engines at "
                        "the sizes they compute exactly (other sizes on the PyTorch VAE, or padded when pad_to_bucket "
                        "is on); videos run on them only when the folder has video engines (Build Engine with video "
                        "on), otherwise on the PyTorch VAE. Sizes outside every bucket and any engine problem also "
                        "run the PyTorch VAE, with one warning.")

    @classmethod
    def execute(cls, engine: str, scope: str = "folder", fallback_vae: str = "(built from)",
                lazy: bool = False, pad_to_bucket: bool = False) -> io.NodeOutput:
        import torch

        from ..trt.engine_vae import load_engine_vae

        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        register_tensorrt_folder()
        path = resolve_model_file(TENSORRT_KEY, engine)
        # a manifest stands for its whole folder, whatever the scope
        target = os.path.dirname(path) if scope == "folder" or os.path.basename(path) == MANIFEST_NAME else path
        fallback = None if fallback_vae == "(built from)" else resolve_model_file(VAE_KEY, fallback_vae)
        load_device = mm.vae_device()
        dtype = mm.vae_dtype(load_device, WORKING_DTYPES)
        with torch.inference_mode(False):  # normal parameters, as in TurboVAELoader.execute
            # A checkpoint recorded in the manifest must lie in the VAE model folders, like a chosen one.
            turbo = load_engine_vae(target, dtype=dtype, device=load_device, fallback=fallback, lazy=lazy,
                                    pad_to_bucket=pad_to_bucket, source_roots=model_roots(VAE_KEY))
        log.info("TurboVAE: %r", turbo)
        return io.NodeOutput(ComfyTurboVAE(turbo, load_device=load_device))


ENGINE_NODES = [TurboVAEBuildEngine, TurboVAELoadEngine]


def _require_onnx_export() -> None:
    """TensorRT engines are built from an ONNX export; onnx/onnxscript are optional (not in requirements.txt)."""
    missing = missing_onnx_export()
    if missing:
        raise ImportError(f"the tensorrt backend exports ONNX first and needs {' and '.join(missing)}: run "
                          "`pip install onnx onnxscript` with ComfyUI's Python, or choose backend aoti")
