"""What the node schemas of this pack share, written once: the category, the node frame, and the inputs and
outputs several nodes declare (the VAE, the latents and frames a pass takes and gives, the VAE file, tile size
and temporal slice, the hidden node id that progress is reported to). A node module states only what is its own;
ids, names, defaults, tooltips and order are what each node declared before (tests/test_nodes.py and
tests/test_workflows.py hold them)."""

from __future__ import annotations

from typing import Sequence

from comfy_api.latest import io

from .paths import VAE_KEY, list_model_files

CATEGORY = "TurboVAE"
LATENTS_OUT_HELP = "Latents as ComfyUI's own VAE of this kind gives them (what samplers and VAE Decode expect)."
SLICE_HELP = ("Latent frames processed at once (1 latent = 4 video frames); 0 = {zero}. Slices carry the causal "
              "cache, so slicing never changes the result.")


def node_schema(node_id: str, display_name: str, inputs: list, outputs: list, *, description: str,
                reports_progress: bool = False, **extra) -> io.Schema:
    """A node of this pack in its category; `reports_progress`: it takes the hidden unique id (progress bars and
    report lines name the running node)."""
    if reports_progress:
        extra["hidden"] = [io.Hidden.unique_id]
    return io.Schema(node_id=node_id, display_name=display_name, category=CATEGORY, description=description,
                     inputs=inputs, outputs=outputs, **extra)


def pass_inputs(decode: bool, pixels_help: str, vae_help: str, settings: list) -> list:
    """A decode or encode node's inputs: what it runs on (latents, or frames), the VAE, then its settings."""
    source = (io.Latent.Input("samples", tooltip="Latents to decode (from a sampler or an encode).") if decode
              else io.Image.Input("pixels", tooltip=pixels_help))
    return [source, io.Vae.Input("vae", tooltip=vae_help), *settings]


def pass_output(decode: bool, images_help: str = ""):
    """A decode node's IMAGE output, or an encode node's LATENT output."""
    return io.Image.Output(tooltip=images_help) if decode else io.Latent.Output(tooltip=LATENTS_OUT_HELP)


def combo(name: str, options: Sequence[str], tooltip: str, default=None):
    """A choice among a library table's values (nodes/choices.py checks a value against the same table)."""
    return io.Combo.Input(name, options=list(options), default=default, tooltip=tooltip)


def vae_file_input(tooltip: str):
    """The VAE checkpoint, a file of the VAE model folders."""
    return io.Combo.Input("vae_name", options=list_model_files(VAE_KEY), tooltip=tooltip)


def tile_size_input(default: int, tooltip: str):
    return io.Int.Input("tile_size", default=default, min=0, max=8192, step=32, tooltip=tooltip)


def temporal_slice_input(zero: str):
    """`zero`: what 0 (automatic) chooses."""
    return io.Int.Input("temporal_slice", default=0, min=0, max=4096, step=1, tooltip=SLICE_HELP.format(zero=zero))
