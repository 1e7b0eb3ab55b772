"""Every weight is held once: after each path (image decode, image encode, clip decode, clip encode) the
layers hold no derived copies of their weights beyond 5 % of the parameters, for each architecture at its
real channel counts (tiny spatial sizes keep it quick), counted two ways: tensors the modules keep beside
their parameters, and the process's resident memory after `malloc_trim`. Also: the one stored copy keeps
the checkpoint's shapes and values, `TurboVAE.state_dict()` gives the checkpoint's (contiguous) layout,
and the layout survives `.to()`."""

from __future__ import annotations

import gc

import pytest
import torch

import turbovae
from turbovae.bench import peak_rss
from turbovae.vae import seedvr2, wan
from turbovae.vae.seedvr2 import SeedVR2Config
from turbovae.vae.wan import TINY_WAN21, TINY_WAN22, WAN21, WAN22, WanVAE
from turbovae.vae.accel.channels_last import channels_last_in_cpu_fp32
from turbovae.vae.accel.weight_layout import is_channels_last

HELD_SHARE = 0.05  # of the parameters' size
ARCHITECTURES = {  # name -> (the architecture's key -> shape table, real config, tiny config)
    "wan2.1": (wan.expected_shapes, WAN21, TINY_WAN21),
    "wan2.2": (wan.expected_shapes, WAN22, TINY_WAN22),
    "seedvr2": (seedvr2.expected_shapes, SeedVR2Config(), SeedVR2Config.tiny()),
}


def constant_weights(shapes, cfg) -> dict:
    """Cheap finite weights for a real-size model (random ones take seconds to draw at 2.7 GB)."""
    return {k: torch.full(s, 1e-2) for k, s in shapes(cfg).items()}


def derived_bytes(model: torch.nn.Module) -> int:
    """Bytes of tensors the modules keep besides their parameters and buffers (caches of any kind, found
    through attributes, containers and helper objects), plus storage a parameter holds beyond its own
    elements (a copy hidden behind a view)."""
    owned = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: set[int] = set()
    total = 0

    def visit(value, depth: int) -> None:
        nonlocal total
        if depth > 4:
            return
        if isinstance(value, torch.Tensor):
            ptr = value.untyped_storage().data_ptr()
            if ptr not in owned and ptr not in seen:
                seen.add(ptr)
                total += value.untyped_storage().nbytes()
        elif isinstance(value, dict):
            for v in value.values():
                visit(v, depth + 1)
        elif isinstance(value, (list, tuple, set)):
            for v in value:
                visit(v, depth + 1)
        elif hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, type)):
            visit(vars(value), depth + 1)

    for module in model.modules():
        for name, value in vars(module).items():
            if name not in ("_parameters", "_buffers", "_modules"):
                visit(value, 0)
    for p in model.parameters():
        total += p.untyped_storage().nbytes() - p.numel() * p.element_size()
    return total


def paths(vae: turbovae.TurboVAE, px: int) -> list:
    fmt = vae.latent_format
    g = torch.Generator().manual_seed(0)
    lat = lambda frames: torch.randn((1, fmt.channels, 1 + (frames - 1) // fmt.temporal_factor,  # noqa: E731
                                      px // fmt.spatial_factor, px // fmt.spatial_factor), generator=g)
    pix = lambda frames: torch.rand((1, fmt.image_channels, frames, px, px), generator=g) * 2 - 1  # noqa: E731
    return [("image decode", lambda: vae.decode(lat(1))), ("image encode", lambda: vae.encode(pix(1))),
            ("clip decode", lambda: vae.decode(lat(5))), ("clip encode", lambda: vae.encode(pix(5)))]


def run_paths(vae: turbovae.TurboVAE, px: int, check=lambda name: None) -> None:
    with torch.inference_mode():
        for name, call in paths(vae, px):
            out = call()
            del out
            check(name)


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_no_path_holds_derived_weights(arch):
    shapes, real, tiny = ARCHITECTURES[arch]
    # the process's one-time costs (kernel code, thread pools) first, on the tiny config
    run_paths(turbovae.load_vae(constant_weights(shapes, tiny), config=tiny, device="cpu", dtype="fp32"), 32)
    gc.collect()
    vae = turbovae.load_vae(constant_weights(shapes, real), config=real, device="cpu", dtype="fp32")
    params = sum(p.numel() * p.element_size() for p in vae.model.parameters())
    budget = HELD_SHARE * params
    loaded = peak_rss.resident_mb() if peak_rss.supported() else None
    px = 2 * vae.spatial_factor  # a 2x2 latent: tiny spatial size, real channel counts

    def check(name: str) -> None:
        held = derived_bytes(vae.model)
        assert held <= budget, f"{arch} after {name}: layers hold {held / 2**20:.0f} MB of derived weights " \
                               f"(> {HELD_SHARE:.0%} of {params / 2**20:.0f} MB)"
        if loaded is not None:
            gc.collect()
            rss = (peak_rss.resident_mb() - loaded) * 2**20
            assert rss <= budget, f"{arch} after {name}: resident {rss / 2**20:.0f} MB beyond the loaded model " \
                                  f"(> {HELD_SHARE:.0%} of {params / 2**20:.0f} MB)"

    run_paths(vae, px, check)


def test_derived_bytes_sees_a_cache():
    """The counter is not blind: a cached copy kept on a layer, in a helper object, is counted."""

    class Cache:
        def __init__(self, t):
            self.store = {"fold": t}

    model = WanVAE(TINY_WAN21)
    conv = model.decoder.conv_in
    assert derived_bytes(model) == 0
    conv._derived = Cache(conv.weight[:, :, -1].contiguous())
    assert derived_bytes(model) == conv.weight[:, :, -1].numel() * 4


@pytest.mark.parametrize("arch", ["wan2.1", "wan2.2"])
def test_wan_weights_are_stored_once_channels_last_with_checkpoint_values(arch):
    with channels_last_in_cpu_fp32():  # where channels-last runs (fp32 on the CPU holds them contiguous)
        _stored_once_channels_last(arch)


def _stored_once_channels_last(arch):
    shapes, _, tiny = ARCHITECTURES[arch]
    sd = {k: torch.randn(s, generator=torch.Generator().manual_seed(i))
          for i, (k, s) in enumerate(shapes(tiny).items())}
    vae = turbovae.load_vae(sd, config=tiny, device="cpu", dtype="fp32")
    convs = [m for m in vae.model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d))]
    assert convs and all(is_channels_last(m.weight) for m in convs)
    for name, t in vae.model.state_dict().items():  # the parameters themselves: same shapes and values
        assert torch.equal(t, sd[name])
    saved = vae.state_dict()  # the checkpoint's layout, ready for safetensors
    assert all(t.is_contiguous() for t in saved.values())
    assert all(torch.equal(saved[k], sd[k]) for k in sd)
    again = turbovae.load_vae(saved, config=tiny, device="cpu", dtype="fp32")  # still strict, still loads
    assert all(is_channels_last(m.weight) for m in again.model.modules()
               if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)))
    half = vae.model.to(torch.bfloat16)  # moving or casting keeps the layout
    assert all(is_channels_last(m.weight) for m in half.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)))


def test_wan_layout_is_restored_after_an_assigning_load():
    """`load_state_dict(assign=True)` puts the checkpoint's contiguous tensors in place; the model lays them
    out again, and the outputs do not depend on the layout."""
    sd = {k: torch.randn(s, generator=torch.Generator().manual_seed(i)) * 0.1
          for i, (k, s) in enumerate(wan.expected_shapes(TINY_WAN21).items())}
    with channels_last_in_cpu_fp32():  # where channels-last runs
        model = WanVAE(TINY_WAN21).eval()
        model.load_state_dict(sd, assign=True)
        assert is_channels_last(model.decoder.conv_in.weight)
        z = torch.randn(1, TINY_WAN21.z_dim, 2, 4, 4, generator=torch.Generator().manual_seed(1))
        with torch.inference_mode():
            laid_out = model.decode_latents(z)
            for m in model.modules():
                if isinstance(m, (torch.nn.Conv2d, torch.nn.Conv3d)):
                    m.weight.data = m.weight.data.contiguous()
            contiguous = model.decode_latents(z)
    assert (laid_out - contiguous).abs().max() <= 1e-5
