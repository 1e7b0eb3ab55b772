"""What ComfyUI's model management sees of a TurboVAE (nodes/device_memory.py, issue 33 item 7c): the CUDA
graph pool (and loaded engines) count in the patcher's size *and* as loaded, so core's "still to load"
(size minus loaded size, `LoadedModel.model_offloaded_memory`) is zero while the VAE holds them, and the
whole size once the VAE is unloaded.

Runs against the ComfyUI test doubles, whose `LoadedModel` / `ModelPatcher` accounting follows core's
(comfy/model_management.py `LoadedModel.model_offloaded_memory`, comfy/model_patcher.py `model_size`,
`loaded_size`); no core tree is available in CI. With a real core tree first on sys.path the same
assertions run against core's own classes (`use_comfy_stubs` refuses to mix the two)."""

from __future__ import annotations

import pytest
import torch

import node_helpers

node_helpers.use_comfy_stubs()

from turbovae.nodes import device_memory  # noqa: E402
from turbovae.vae.api import TurboVAE  # noqa: E402
from turbovae.vae.wan import TINY_WAN21, WanVAE  # noqa: E402

mm = device_memory.mm
node_helpers.hide_comfy_stubs()

POOL = 5 << 20


class _Pool:
    """A CUDA-graph runner's accounting only: the bytes its private pool holds."""

    def __init__(self, pool_bytes: int):
        self.pool_bytes = pool_bytes

    def invalidate(self) -> None:
        self.pool_bytes = 0


def _patched_vae():
    turbo = TurboVAE(WanVAE(TINY_WAN21).eval())
    module = torch.nn.Module()
    module.vae = turbo.model
    patcher, recount = device_memory.vae_patcher(turbo, module, torch.device("cpu"), torch.device("cpu"))
    return turbo, module, patcher, recount


def test_graph_pool_reads_as_held_not_as_memory_to_load():
    turbo, module, patcher, recount = _patched_vae()
    weights = mm.module_size(module)
    loaded = mm.LoadedModel(patcher)
    assert loaded.model_memory() == weights and loaded.model_offloaded_memory() == weights  # nothing loaded
    mm.load_models_gpu([patcher])
    assert loaded.model_offloaded_memory() == 0
    turbo._graphs[True] = _Pool(POOL)  # a pass captured a graph
    recount()
    assert loaded.model_memory() == weights + POOL  # model management counts the pool ...
    assert loaded.model_loaded_memory() == weights + POOL  # ... as memory the VAE holds ...
    assert loaded.model_offloaded_memory() == 0  # ... not as memory still to load
    patcher.detach()  # model management unloads the VAE: the pool is released with it
    assert turbo._graphs[True].pool_bytes == 0
    assert loaded.model_memory() == weights and loaded.model_offloaded_memory() == weights


def test_engines_count_as_held_only_once_loaded():
    turbo, module, _p, _r = _patched_vae()

    class _Engines:
        def __init__(self):
            self.loaded = 0

        def memory_bytes(self):
            return self.loaded

        def footprint_bytes(self):
            return 7 << 20

        def release(self):
            self.loaded = 0

    engines = _Engines()
    turbo.engines = engines
    turbo.engine_footprint_bytes = engines.footprint_bytes
    turbo.release_engines = engines.release
    patcher, _recount = device_memory.vae_patcher(turbo, module, torch.device("cpu"), torch.device("cpu"))
    loaded = mm.LoadedModel(patcher)
    weights = mm.module_size(module)
    mm.load_models_gpu([patcher])
    assert loaded.model_memory() == weights + (7 << 20)
    assert loaded.model_offloaded_memory() == 7 << 20  # the lazily loaded engines are still to load
    engines.loaded = 7 << 20
    assert loaded.model_offloaded_memory() == 0
    patcher.detach()
    assert loaded.model_offloaded_memory() == weights + (7 << 20)


def test_patcher_is_cores_model_patcher():
    _t, _m, patcher, _r = _patched_vae()
    assert isinstance(patcher, device_memory.comfy.model_patcher.ModelPatcher)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
