"""What a loaded VAE holds after its passes beyond the weights (issue 40, item 4): the caches a `TurboVAE` keeps
(meta copies and peak predictions, the fast-path registry) hold no real storage, however many shapes were planned.
The process's resident memory after passes (RSS after `malloc_trim`, real configs) is bounded by
tests/test_weights_held_once.py."""

from __future__ import annotations

import pytest
import torch

import turbovae
from turbovae.vae.seedvr2 import SeedVR2Config
from turbovae.vae.seedvr2 import expected_shapes as seedvr2_shapes
from turbovae.vae.wan import TINY_WAN21
from turbovae.vae.wan import expected_shapes as wan_shapes

@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny configs are op-overhead bound: one thread avoids OpenMP barrier stalls on a busy 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


TINY = {"seedvr2": (seedvr2_shapes, SeedVR2Config.tiny()), "wan2.1": (wan_shapes, TINY_WAN21)}


def _load(arch: str) -> turbovae.TurboVAE:
    shapes, cfg = TINY[arch]
    return turbovae.load_vae({k: torch.full(s, 1e-2) for k, s in shapes(cfg).items()}, config=cfg, device="cpu",
                             dtype="fp32")


def _passes(vae: turbovae.TurboVAE, px: int = 32) -> None:
    """An image and a 5-frame clip, decoded and encoded; no temporal slice given, so each pass is planned from
    its predicted peak (the meta copies run)."""
    fmt = vae.latent_format
    g = torch.Generator().manual_seed(0)
    for frames in (1, 5):
        z = torch.randn((1, fmt.channels, 1 + (frames - 1) // fmt.temporal_factor, px // fmt.spatial_factor,
                         px // fmt.spatial_factor), generator=g)
        vae.decode(z)  # outputs dropped at once
        x = torch.rand((1, fmt.image_channels, frames, px, px), generator=g) * 2 - 1
        vae.encode(x)


def _real_tensors(root: object, owned: set[int]) -> list[str]:
    """Paths from `root` to tensors with real (non-meta) storage that `owned` (the model's parameters and buffers)
    does not hold: through attributes, containers and modules (their parameters and buffers included)."""
    found: list[str] = []
    seen: set[int] = set()

    def visit(value: object, path: str, depth: int) -> None:
        if depth > 64 or id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            if value.device.type != "meta" and value.untyped_storage().data_ptr() not in owned:
                found.append(f"{path}: {tuple(value.shape)} on {value.device}")
        elif isinstance(value, dict):
            for k, v in value.items():
                visit(v, f"{path}[{k!r}]", depth + 1)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for i, v in enumerate(value):
                visit(v, f"{path}[{i}]", depth + 1)
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            visit(vars(value), path, depth + 1)

    visit(root, "vae", 0)
    return found


@pytest.mark.parametrize("arch", list(TINY))
def test_retained_caches_hold_no_real_storage(arch):
    vae = _load(arch)
    with torch.inference_mode():
        for px in (32, 48):
            _passes(vae, px)
    assert vae._meta_passes is not None and vae._meta_passes._copies  # the passes were planned on meta copies
    owned = {t.untyped_storage().data_ptr() for t in [*vae.model.parameters(), *vae.model.buffers()]}
    assert _real_tensors(vae, owned) == []
    from turbovae.vae.accel import self_checks

    assert _real_tensors(self_checks.REGISTRY, owned) == []


def test_the_walk_finds_a_real_tensor_kept_in_a_meta_copy():
    """Not blind: a real tensor cached on a module of a meta copy (a per-shape cache, say) is found."""
    vae = _load("wan2.1")
    with torch.inference_mode():
        vae.decode(torch.zeros(1, vae.latent_format.channels, 1, 2, 2))
    copy = next(iter(vae._meta_passes._copies.values()))
    copy.decoder.conv_in._cache = {(1, 2, 2): torch.zeros(3)}
    owned = {t.untyped_storage().data_ptr() for t in [*vae.model.parameters(), *vae.model.buffers()]}
    assert len(_real_tensors(vae, owned)) == 1
