"""Cost model of the sharded passes: bytes exchanged and FLOPs per rank, and the efficiency they predict.

Everything is read off the real layer shapes: the model is built and run on the meta device (no memory,
no weights) with hooks recording every convolution's and attention block's input and output shapes, so
the numbers follow the code, not a hand count. The table docs/multi_gpu.md shows is rendered from these
predictions by `python -m turbovae.bench.parallel_cost` (the library keeps only the model).

Per rank (interior band, the busiest):
- SeedVR2 (halo exchange): conv FLOPs / N, attention queries / N (keys/values projected on every rank);
  received bytes = Σ over k×k convs of (k - stride) rows × width × C_in × frames, GroupNorm sums, the
  gathered latent frame for attention, and the all-gathered result (every rank returns it).
- Wan/Qwen, both ways the code runs: "overlap recomputed" (bands larger than their share of the tile): no
  halo bytes; each local stage runs on H/N + 2·halo rows of its input (halos of the whole chain from the exact
  plan). "halo exchange per stage" (bands that fit their share, vae/parallel/band_chain.py): each stage runs
  on H/N + 2·(its own radius) rows and receives those rows from the neighbours. Both: the global part (mid
  block) on every rank except its attention queries (/ N); bytes also = the attention output gather and the
  result gather (+ the mid features for encode).
Time per rank = FLOPs / R + bytes / B + collectives × α, no overlap of communication with compute;
efficiency = T(1) / (N · T(N)) with T(1) the unsplit pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from ..registry import families, family

BYTES_PER_ELEMENT = 2  # bf16 activations


@dataclass(frozen=True)
class Link:
    name: str
    bytes_per_s: float  # per direction, per GPU
    latency_s: float  # per collective / exchange step


@dataclass(frozen=True)
class Assumptions:
    tflops: float = 400.0  # achieved bf16 conv throughput per H100 (≈ 40 % of the 989 TFLOP/s dense peak)
    links: tuple[Link, ...] = (Link("NVLink", 450e9, 10e-6), Link("PCIe 5", 64e9, 20e-6))


SIZES = {"1080p image": (1, 1080, 1920), "720p×81": (81, 720, 1280), "4K×21": (21, 2160, 3840)}


@dataclass
class _Layer:
    name: str
    flops: float
    halo_bytes: float  # received per interior rank if this layer's input rows were exchanged (per full frame)
    attention: bool = False
    kv_flops: float = 0.0  # key/value projections every rank repeats (SeedVR2 attention)
    frame_bytes: float = 0.0  # the latent frame an attention layer gathers
    row_bytes: float = 0.0  # one row of this layer's input (all frames it reads)


def _conv_record(name: str, mod: nn.Module, x: torch.Tensor, y: torch.Tensor) -> _Layer:
    k = mod.kernel_size
    kt, kh, kw = (k if len(k) == 3 else (1, *k))
    sh = mod.stride[-2]
    frames = x.shape[2] if x.ndim == 5 else x.shape[0]
    kt_eff = kt if x.ndim == 5 and x.shape[2] > 1 else 1  # one frame: the temporal taps fold into one
    flops = 2.0 * y.numel() * (mod.in_channels // mod.groups) * kt_eff * kh * kw
    halo_rows = max(0, kh - sh)
    row = x.shape[-1] * x.shape[1] * (frames + kt - 1) * BYTES_PER_ELEMENT * (x.shape[0] if x.ndim == 5 else 1)
    return _Layer(name, flops, halo_rows * row, row_bytes=row)


def _attention_record(name: str, x: torch.Tensor, separate_kv: bool) -> _Layer:
    if x.ndim == 5:
        b, c, t, h, w = x.shape
        frames = b * t
    else:
        frames, c, h, w = x.shape
    n = h * w
    proj = 2.0 * frames * n * c * c
    flops = 4 * proj + 4.0 * frames * n * n * c
    return _Layer(name, flops, 0.0, attention=True, kv_flops=2 * proj if separate_kv else 0.0,
                  frame_bytes=frames * n * c * BYTES_PER_ELEMENT)


def trace_layers(build: Callable[[], nn.Module], run: Callable[[nn.Module, torch.Tensor], object],
                 shape: tuple[int, ...]) -> list[_Layer]:
    """Run `run(model, x)` on the meta device and record conv / attention / upsampler work in call order."""
    with torch.device("meta"):
        model = build()
    layers: list[_Layer] = []
    hooks = []
    for name, mod in model.named_modules():
        cls = type(mod).__name__
        if isinstance(mod, (nn.Conv2d, nn.Conv3d)) and not name.endswith("upscale_conv"):
            hooks.append(mod.register_forward_hook(
                lambda m, a, out, name=name: layers.append(_conv_record(name, m, a[0], out))))
        elif cls in ("MidAttention", "AttentionBlock"):
            hooks.append(mod.register_forward_hook(
                lambda m, a, out, name=name: layers.append(_attention_record(name, a[0], True))))
        elif cls == "Upsample3D":  # its 1×1 conv runs as a functional call: count it here
            def up(m, a, out, name=name):
                x = a[0]
                flops = 2.0 * x.numel() * x.shape[1] * 4 * m.zr
                layers.append(_Layer(name + ".upscale_conv", flops, 0.0))
            hooks.append(mod.register_forward_pre_hook(lambda m, a, name=name, up=up: up(m, a, None)))
    try:
        with torch.inference_mode():
            run(model, torch.empty(shape, device="meta"))
    finally:
        for h in hooks:
            h.remove()
    return layers


@dataclass(frozen=True)
class Prediction:
    arch: str
    pass_name: str
    size: str
    ranks: int
    variant: str
    total_tflop: float
    rank_tflop: float
    rank_mbytes: float
    collectives: int
    efficiency: dict  # link name -> predicted parallel efficiency


def _predict(arch, pass_name, size, n, variant, total, rank_flops, rank_bytes, collectives,
             assume: Assumptions) -> Prediction:
    rate = assume.tflops * 1e12
    eff = {}
    for link in assume.links:
        t1 = total / rate
        tn = rank_flops / rate + rank_bytes / link.bytes_per_s + collectives * link.latency_s
        eff[link.name] = t1 / (n * tn)
    return Prediction(arch, pass_name, size, n, variant, total / 1e12, rank_flops / 1e12, rank_bytes / 1e6,
                      collectives, eff)


def architectures() -> tuple[str, ...]:
    """The families the cost model can predict (every registered family that declares an exact tiling: only
    those split a frame across devices), by the names `predict` takes."""
    return tuple(f.key for f in families() if f.exact_plan(decode=True, for_split=True) is not None)


def predict(arch: str, decode: bool, size: str, ranks: tuple[int, ...] = (2, 4, 8),
            assume: Assumptions = Assumptions()) -> list[Prediction]:
    fam = family(arch)
    model = fam.meta_model(for_split=True)  # the cost-model hook: what the ranks run
    plan = model.exact_plan(decode=decode)
    if plan is None:
        raise ValueError(f"{arch}: the {fam.title} model declares no exact tiling (VAEModel.exact_plan), so its "
                         f"frames are never split across devices; families the cost model covers: "
                         f"{', '.join(architectures())}")
    lf = model.latent_format
    z_dim, f, tf = lf.channels, lf.spatial_factor, lf.temporal_factor
    frames, h, w = SIZES[size]
    h = math.ceil(h / f) * f  # Wan 2.2 (16 px per latent) pads 1080 to 1088
    lat_frames = (frames - 1) // tf + 1
    shape = (1, z_dim, lat_frames, h // f, w // f) if decode else (1, 3, frames, h, w)
    run = (lambda m, x: m.decode_slices(x)) if decode else (lambda m, x: m.encode_slices(x))
    layers = trace_layers(lambda: fam.meta_model(for_split=True), run, shape)
    total = sum(l.flops for l in layers)
    out_elems = (3 * frames * h * w) if decode else (2 * z_dim * lat_frames * (h // f) * (w // f))
    out_bytes = out_elems * BYTES_PER_ELEMENT
    pass_name = "decode" if decode else "encode"

    class _Rows:  # an `ExactTilingRunner`: the rows of each way a frame is split
        @staticmethod
        def layerwise(plan) -> list[Prediction]:
            return [_layerwise_row(arch, pass_name, size, n, layers, total, lat_frames, out_bytes * (n - 1) / n,
                                   assume) for n in ranks]

        @staticmethod
        def staged(plan) -> list[Prediction]:
            return [row for n in ranks for row in _staged_rows(arch, plan, decode, size, n, layers, total, h // f,
                                                               out_bytes * (n - 1) / n, assume, f)]

    return plan.run_with(_Rows())


def _layerwise_row(arch, pass_name, size, n, layers, total, lat_frames, gather_out, assume) -> Prediction:
    """The layer-by-layer split (halo rows exchanged before every conv, GroupNorm sums all-reduced)."""
    exchanged_convs = [l for l in layers if l.halo_bytes > 0]
    att = [l for l in layers if l.attention]
    flops = (total - sum(l.kv_flops for l in att)) / n + sum(l.kv_flops for l in att)
    halo = sum(l.halo_bytes for l in exchanged_convs)
    stats = 3 * len(exchanged_convs) * 2 * 32 * lat_frames * 8  # sums of 32 groups per frame, fp64
    frames_gathered = sum(l.frame_bytes for l in att) * (n - 1) / n
    coll = 3 * len(exchanged_convs) + len(att) + 1
    return _predict(arch, pass_name, size, n, "halo exchange", total, flops,
                    halo + stats + frames_gathered + gather_out, coll, assume)


def _staged_rows(arch, plan, decode, size, n, layers, total, h_lat, gather_out, assume, f) -> list[Prediction]:
    """Both ways a staged plan's band runs: the overlap recomputed, or each stage's halo exchanged."""
    from fractions import Fraction

    from ..tiling.exact import stage_halos, stage_resolutions
    from .band_chain import stage_halo

    res_in = Fraction(1) if decode else Fraction(f)
    halos, res = stage_halos(plan.local, res_in), stage_resolutions(plan.local, res_in)
    prefixes = [s.modules for s in plan.local]  # the module names each stage runs, as the plan declares them
    if not all(prefixes):
        raise ValueError(f"{arch}: its exact plan's stages name no modules (LocalStage.modules), so the cost model "
                         "cannot tell which traced layers each stage runs")

    def stage_of(name: str) -> Optional[int]:
        for k, owned in enumerate(prefixes):
            if any(name.startswith(p) or name == p.rstrip(".") for p in owned):
                return k
        return None

    local = [0.0] * len(prefixes)
    glob = 0.0
    for l in layers:
        k = stage_of(l.name)
        if k is None:  # the global part; its attention divides the queries (keys/values on every rank)
            glob += (l.flops - l.kv_flops) / n + l.kv_flops if l.attention else l.flops
        else:
            local[k] += l.flops
    recompute = glob + sum(fk * min(1.0, 1 / n + 2 * halos[k] / float(h_lat * res[k])) for k, fk in enumerate(local))
    attention = [l for l in layers if l.attention]
    # the attention output gathered back, and for encode the latent-resolution features gathered first
    mid_bytes = sum(l.frame_bytes for l in attention) * (n - 1) / n * (1 if decode else 2)
    ticks = 3 + len(attention)  # band tile + global part per slice (progress ticks), result gather, attention
    # per-stage exchange: each stage recomputes only its own radius; stages after the first receive it
    own = [stage_halo(s) for s in plan.local]
    exchange = glob + sum(fk * min(1.0, 1 / n + 2 * own[k] / float(h_lat * res[k])) for k, fk in enumerate(local))
    first_conv: dict[int, _Layer] = {}
    for l in layers:
        k = stage_of(l.name)
        if k is not None and l.row_bytes > 0 and not l.attention:
            first_conv.setdefault(k, l)
    halo_bytes = sum(2 * own[k] * first_conv[k].row_bytes for k in range(1, len(local)) if k in first_conv)
    return [
        _predict(arch, "decode" if decode else "encode", size, n, "overlap recomputed", total,
                 recompute, gather_out + mid_bytes, ticks, assume),
        _predict(arch, "decode" if decode else "encode", size, n, "halo exchange per stage", total,
                 exchange, gather_out + mid_bytes + halo_bytes, ticks + len(local) - 1, assume),
    ]
