"""Load VAE (TurboVAE) and Compile Settings: thin adapters over `load_vae` and `vae/accel/compile.py`."""

from __future__ import annotations

import logging

import torch

import comfy.model_management as mm
from comfy_api.latest import io

from ..loading import load_vae
from ..vae.accel.compile import BACKENDS as COMPILE_BACKENDS
from ..vae.accel.compile import DYNAMIC as COMPILE_DYNAMIC
from ..vae.accel.compile import MODES as COMPILE_MODES
from ..vae.dtypes import DTYPE_CHOICES, parse_dtype
from ..vae.registry import gpu_defaults_by_title, supported_text, titles
from ..vae.gpu_defaults import COMPILE_ALL, COMPILE_ARCHITECTURES, COMPILE_MEASURED, compile_applies, describe_compile
from .choices import check_choice, choice_error, first_error
from .comfy_vae import WORKING_DTYPES, ComfyTurboVAE
from .paths import VAE_KEY, resolve_model_file
from .schema import combo, node_schema, vae_file_input

log = logging.getLogger(__name__)

CompileSettingsType = io.Custom("TURBOVAE_COMPILE")


class TurboVAELoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return node_schema("TurboVAELoader", "Load VAE (TurboVAE)",
            [vae_file_input(f"VAE file in models/vae (or an extra_model_paths.yaml vae folder). Supported: "
                            f"{supported_text()}."),
             combo("dtype", DTYPE_CHOICES, "Weights and compute precision. auto: ComfyUI's VAE dtype for the device "
                   "(bf16 on recent GPUs, fp32 on CPU). fp16 can overflow in these VAEs.", default="auto"),
             CompileSettingsType.Input("compile", optional=True,
                                       tooltip="Optional: connect a 'Compile Settings (TurboVAE)' node to "
                                               "torch.compile the VAE's regions (first run is slow).")],
            [io.Vae.Output(tooltip="A standard VAE: works with core and TurboVAE nodes.")],
            description=f"Loads a VAE ({titles()}) from models/vae (architecture detected from the weights, every key "
                        "and shape checked). The result plugs into core VAE Decode/Encode (Tiled) nodes and into the "
                        "TurboVAE tiled nodes.")

    @classmethod
    def validate_inputs(cls, dtype: str = "auto") -> bool | str:
        return first_error(choice_error("dtype", dtype, DTYPE_CHOICES))

    @classmethod
    def execute(cls, vae_name: str, dtype: str = "auto", compile=None) -> io.NodeOutput:
        check_choice("dtype", dtype, DTYPE_CHOICES)
        path = resolve_model_file(VAE_KEY, vae_name)
        load_device = mm.vae_device()
        target = parse_dtype(dtype)
        if target is None:
            target = mm.vae_dtype(load_device, WORKING_DTYPES)
        # Weights land on the offload device; ComfyUI's model management moves them when a pass runs.
        # ComfyUI runs nodes under torch.inference_mode(): modules built there get inference-tensor
        # parameters, which have no version counter (the SeedVR2 derived-weight caches read it).
        with torch.inference_mode(False):
            turbo = load_vae(path, dtype=target, device=mm.vae_offload_device())
        if compile is not None and not compile_applies(turbo.model.gpu_defaults(), load_device, compile.architectures):
            log.info("TurboVAE: %s stays eager on %s: compile measured slower for this architecture on GPUs "
                     "(docs/gpu.md); set the Compile Settings node's 'architectures' to '%s' to compile it anyway",
                     turbo.kind, load_device, COMPILE_ALL)
        elif compile is not None:
            from ..vae.accel.compile import apply_compile

            apply_compile(turbo.model, compile)
            if compile.cuda_graphs:
                turbo.use_cuda_graphs()
        log.info("TurboVAE: loaded %s as %s (%s)", vae_name, turbo.kind, target)
        return io.NodeOutput(ComfyTurboVAE(turbo, load_device=load_device))


class TurboVAECompileSettings(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return node_schema("TurboVAECompileSettings", "Compile Settings (TurboVAE)",
            [combo("backend", COMPILE_BACKENDS, "torch.compile backend. inductor generates fused kernels (needs a C "
                   "compiler, and Triton on GPU); the others are for debugging.", default="inductor"),
             combo("mode", COMPILE_MODES, "default is usually best for a VAE. max-autotune-no-cudagraphs tunes kernels "
                   "(much slower first run). torch.compile's own CUDA graphs (reduce-overhead, max-autotune) are not "
                   "offered: the VAE's causal caches outlive a replay; use cuda_graphs below.", default="default"),
             combo("dynamic", COMPILE_DYNAMIC, "auto: static first, dynamic after a shape change. true: dynamic shapes "
                   "from the start (fewer recompiles, often slower). false: recompile for every new resolution / tile "
                   "size / frame count.", default="auto"),
             io.Boolean.Input("fullgraph", default=False,
                              tooltip="Require each region to compile as one graph (errors instead of graph breaks). "
                                      "Leave off unless debugging."),
             io.Int.Input("cache_size_limit", default=64, min=1, max=1024,
                          tooltip="torch._dynamo cache size per region: how many shape variants are kept before "
                                  "falling back to eager. Raise it if you switch sizes often."),
             io.Boolean.Input("cuda_graphs", default=False,
                              tooltip="NVIDIA GPUs: also capture each whole encode/decode pass as a CUDA graph (one "
                                      "per input size, at most 4 per direction) to remove kernel-launch gaps. Applies "
                                      "to the tiled nodes' tiles and to images in core VAE Decode/Encode; clips there "
                                      "run eagerly so progress and Cancel work per slice. The graphs' memory counts in "
                                      "the VAE's size and is freed when ComfyUI unloads it. A failed capture runs "
                                      "eagerly (out of memory: tried again next pass, off after 3 in a row)."),
             combo("architectures", COMPILE_ARCHITECTURES, describe_compile(gpu_defaults_by_title()),
                   default=COMPILE_MEASURED)],
            [CompileSettingsType.Output(display_name="compile", tooltip="Connect to 'Load VAE (TurboVAE)'.")],
            description="torch.compile settings for 'Load VAE (TurboVAE)'. Regions are compiled separately and "
                        "cached; if compilation fails (e.g. no C compiler) the VAE runs eagerly and one warning is "
                        "logged. "
                        + describe_compile(gpu_defaults_by_title()))

    @classmethod
    def validate_inputs(cls, backend: str = "inductor", mode: str = "default", dynamic: str = "auto",
                        architectures: str = COMPILE_MEASURED) -> bool | str:
        return first_error(choice_error("backend", backend, COMPILE_BACKENDS),
                           choice_error("mode", mode, COMPILE_MODES),
                           choice_error("dynamic", dynamic, COMPILE_DYNAMIC),
                           choice_error("architectures", architectures, COMPILE_ARCHITECTURES))

    @classmethod
    def execute(cls, backend: str = "inductor", mode: str = "default", dynamic: str = "auto",
                fullgraph: bool = False, cache_size_limit: int = 64, cuda_graphs: bool = False,
                architectures: str = COMPILE_MEASURED) -> io.NodeOutput:
        check_choice("backend", backend, COMPILE_BACKENDS)
        check_choice("mode", mode, COMPILE_MODES)
        check_choice("dynamic", dynamic, COMPILE_DYNAMIC)
        check_choice("architectures", architectures, COMPILE_ARCHITECTURES)
        if int(cache_size_limit) < 1:
            raise ValueError(f"cache_size_limit must be at least 1, got {cache_size_limit}")
        from ..vae.accel.compile import CompileSettings

        return io.NodeOutput(CompileSettings(backend=backend, mode=mode, dynamic=dynamic,
                                             fullgraph=bool(fullgraph), cache_size_limit=int(cache_size_limit),
                                             cuda_graphs=bool(cuda_graphs), architectures=architectures))


LOADER_NODES = [TurboVAELoader, TurboVAECompileSettings]
