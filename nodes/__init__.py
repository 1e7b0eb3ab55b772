"""TurboVAE ComfyUI extension (V3). Imported only by ComfyUI through the pack's `comfy_entrypoint`.

Conventions for every node module in this folder (engine_nodes.py included):
- model-folder lookups and untrusted file names go through `nodes/paths.py` (`resolve_model_file`,
  `list_model_files`, `register_tensorrt_folder`, `engine_output_dir`);
- a schema is built with `nodes/schema.py` (`node_schema`, and the inputs and outputs several nodes share);
- combo options are the library's own tables (never restated here); their validation lives in
  `nodes/choices.py` (the server does not check V3 combos);
- a VAE produced by our loaders is a `nodes/comfy_vae.ComfyTurboVAE` (`is_turbovae(vae)` tells it apart);
- optional dependencies (tensorrt, onnx, onnxscript) are imported inside `execute`, never at module level,
  so a missing one only affects the node that needs it, with the install command in its error.
"""

from __future__ import annotations

import logging

from comfy_api.latest import ComfyExtension, io

from .loader_nodes import LOADER_NODES
from .parallel_nodes import PARALLEL_NODES
from .paths import register_tensorrt_folder
from .tiled_nodes import TILED_NODES

log = logging.getLogger(__name__)


def _engine_nodes() -> list[type[io.ComfyNode]]:
    """The engines helper's nodes; a failure there must never hide the VAE nodes."""
    try:
        from .engine_nodes import ENGINE_NODES
    except Exception as e:  # noqa: BLE001 - any import problem in that module is reported, not raised
        log.warning("TurboVAE: engine nodes unavailable (%s: %s); VAE nodes still load", type(e).__name__, e)
        return []
    return list(ENGINE_NODES)


def all_nodes() -> list[type[io.ComfyNode]]:
    return [*LOADER_NODES, *TILED_NODES, *PARALLEL_NODES, *_engine_nodes()]


class TurboVAEExtension(ComfyExtension):
    async def on_load(self) -> None:
        register_tensorrt_folder()

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        register_tensorrt_folder()
        return all_nodes()
