"""Predicted CPU peaks against the allocator (issue 40 item 4, tightened to issue 49 item 3's bar): every family,
both directions, images and sliced clips, channels-last on and off, within 3 % either way of what PyTorch's CPU
allocator saw (vae/memory/allocator.py: the profiler's allocation events, buffers inside ops included; every case
here measured within 0.1 % on the CPU VM, 2026-11-29). The rules of vae/memory/cpu_conv.py are also
checked one convolution at a time, where they must hold to the byte (up to oneDNN's small constant), so a rule
that drifts with a PyTorch or oneDNN upgrade is named by the test that fails, not only by a pass's error."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Optional

import pytest
import torch
import torch.nn.functional as F

from turbovae.bench.models import seeded_init
from turbovae.vae.accel.channels_last import channels_last_in_cpu_fp32
from turbovae.vae.memory import cpu_conv as cpu_conv_memory
from turbovae.vae.accel.switches import FastPaths
from turbovae.vae.memory.allocator import measure_peak
from turbovae.vae.memory.op_rules import CpuOpMemory
from turbovae.vae.memory.peak import LiveBytes
from turbovae.vae.registry import family

from peak_checks import measured_and_predicted

LOW, HIGH = -0.03, 0.03  # issue 49 item 3: within 3 % of the allocator

_MODELS: dict = {}


def _model(key: str, real: bool):
    """The family's model, built once per module (memory does not depend on the weights' values: the real
    configs keep their default init, the tiny ones are seeded as the quick tests seed them)."""
    if (key, real) not in _MODELS:
        fam = family(key)
        model = fam.build_model(fam.config(real=real))
        _MODELS[key, real] = (model if real else seeded_init(model)).eval()
    return _MODELS[key, real]


def _error(key: str, real: bool, decode: bool, shape: tuple, temporal_slice: Optional[int],
           channels_last: bool) -> tuple[float, int, int]:
    """(relative error, predicted bytes, allocator bytes) of one pass; the model's own default paths, with
    channels-last run (it is off for fp32 on the CPU unless forced on: `channels_last_in_cpu_fp32`) or switched off."""
    model = _model(key, real)
    with channels_last_in_cpu_fp32() if channels_last else nullcontext():
        model.fast = FastPaths() if channels_last else FastPaths().without("channels_last")
        fmt = model.latent_format
        if shape[1] is None:
            shape = (shape[0], fmt.channels, *shape[2:])
        elif shape[1] == PX:  # sized in pixels: the family's latents of that image
            shape = (shape[0], fmt.channels, shape[2], shape[3] // fmt.spatial_factor, shape[4] // fmt.spatial_factor)
        measured, predicted = measured_and_predicted(model, decode, shape, temporal_slice)
    return (predicted - measured) / measured, predicted, measured


FAMILIES = ["seedvr2", "qwen_image", "wan2.2"]
# (decode, shape, temporal_slice): an image, a clip in slices of 1 and 2. A decode shape's channels: None, the
# family's latent channels; PX, the same and (latent frames, height px, width px) after them, so every family decodes
# the same pixels (Wan 2.2's latents are 16x smaller in space than the others')
PX = -1
TINY_CASES = [
    (True, (1, None, 1, 4, 8), None),
    (True, (1, None, 2, 4, 4), 1),
    (True, (1, None, 3, 4, 4), 2),
    (False, (1, 3, 1, 32, 64), None),
    (False, (1, 3, 5, 32, 32), 1),
    (False, (1, 3, 9, 32, 32), 2),
]


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
@pytest.mark.parametrize("key", FAMILIES)
@pytest.mark.slow
def test_tiny_configs_predict_the_allocator_peak(key, channels_last):
    """The quick tests' configs: few channels, so most convolutions take PyTorch's im2col kernels, whose columns
    buffers dominate these peaks."""
    for decode, shape, k in TINY_CASES:
        err, predicted, measured = _error(key, False, decode, shape, k, channels_last)
        assert LOW <= err <= HIGH, (key, decode, shape, k, channels_last, predicted, measured, f"{err:+.1%}")


REAL_FAST = [  # the real configs' cheapest passes: images, where oneDNN and channels-last copies show
    ("seedvr2", False, (1, 3, 1, 64, 128), None),
    ("qwen_image", False, (1, 3, 1, 64, 64), None),
    ("wan2.2", False, (1, 3, 1, 64, 64), None),
]


@pytest.mark.slow  # the full tier (issue 41): real configs; the quick tier predicts the tiny configs' peaks
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
@pytest.mark.parametrize("key,decode,shape,k", REAL_FAST)
def test_real_config_images_predict_the_allocator_peak(key, decode, shape, k, channels_last):
    err, predicted, measured = _error(key, True, decode, shape, k, channels_last)
    assert LOW <= err <= HIGH, (predicted, measured, f"{err:+.1%}")


REAL_SLOW = [(key, *case) for key in FAMILIES for case in [
    (True, (1, PX, 1, 128, 128), None),
    (True, (1, PX, 2, 64, 128), 1),
    (True, (1, PX, 3, 96, 64), 2),
    (True, (1, PX, 3, 64, 64), None),
    (False, (1, 3, 5, 64, 64), 1),
    (False, (1, 3, 9, 64, 64), 2),
    (False, (1, 3, 5, 128, 128), None),
]]


# The layout varies slowest (the decorator nearest the function comes first in the ids and the order): a model
# whose `fast` switches layout re-lays every conv weight (vae/accel/weight_layout.py), 1.5 s for Wan 2.2's real
# config, which alternating cases paid 42 times.
@pytest.mark.slow
@pytest.mark.parametrize("key,decode,shape,k", REAL_SLOW)
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
def test_real_configs_predict_the_allocator_peak(key, decode, shape, k, channels_last):
    """Real configs, decode and encode, whole and sliced clips."""
    err, predicted, measured = _error(key, True, decode, shape, k, channels_last)
    assert LOW <= err <= HIGH, (predicted, measured, f"{err:+.1%}")


# One convolution at a time: (input shape, weight shape, stride, padding, input layout, weight layout). 3-D convs
# run as this package runs them (vae/accel/kernels/conv_guard.py): oneDNN where PyTorch would pick its im2col kernel
# (Slow3d); `SLOW3D` rows run under `pytorch_kernels`, where Slow3d runs.
CL = "cl"
CONVS = [
    ((1, 64, 3, 32, 32), (64, 64, 3, 3, 3), 1, 0, None, None),    # Slow3d's shapes: oneDNN (plain)
    ((1, 64, 3, 32, 32), (64, 64, 3, 3, 3), 1, 0, CL, CL),        # Slow3d's shapes: oneDNN (channels-last)
    ((1, 128, 4, 32, 32), (256, 128, 1, 1, 1), 1, 0, None, None),  # Slow3d's 1x1x1: oneDNN
    ((1, 16, 32, 32), (16, 16, 3, 3), 1, 1, None, None),          # Slow2d: columns
    ((1, 16, 32, 32), (16, 16, 3, 3), 1, 1, None, CL),            # Slow2d: channels-last from the weight
    ((1, 64, 3, 128, 32), (64, 64, 3, 3, 3), 1, 0, None, None),   # oneDNN plain: reorders
    ((1, 64, 3, 128, 32), (128, 64, 1, 3, 3), 1, (0, 1, 1), None, None),  # oneDNN plain: blocked output
    ((1, 64, 3, 128, 32), (12, 64, 3, 3, 3), 1, 0, None, None),   # oneDNN plain: output channels padded
    ((1, 8, 8, 512, 4), (256, 8, 3, 3, 3), 1, 0, None, None),    # oneDNN plain, 8 input channels: not padded
    ((1, 8, 8, 512, 4), (256, 8, 3, 3, 3), 1, 0, CL, CL),        # oneDNN channels-last, likewise
    ((1, 64, 3, 128, 32), (64, 64, 3, 3, 3), 1, 0, CL, CL),       # oneDNN channels-last: weight reorder
    ((1, 64, 3, 128, 32), (64, 64, 3, 3, 3), 1, 0, CL, None),     # + the weight's channels-last copy
    ((1, 64, 128, 128), (64, 64, 3, 3), 2, 0, None, None),        # oneDNN 2-D plain, strided
    ((1, 8, 256, 256), (8, 8, 3, 3), 1, 1, None, None),           # oneDNN "first conv": input read as it is
    ((1, 64, 128, 128), (3, 64, 3, 3), 1, 1, CL, CL),             # oneDNN 2-D channels-last
]
SLOW3D = [
    ((1, 64, 3, 32, 32), (64, 64, 3, 3, 3), 1, 0, None, None),    # Slow3d: columns
    ((1, 64, 3, 32, 32), (64, 64, 3, 3, 3), 1, 0, CL, CL),        # Slow3d: + plain copies of input and weight
    ((1, 128, 4, 32, 32), (256, 128, 1, 1, 1), 1, 0, None, None),  # Slow3d 1x1x1: no columns
]


def _laid_out(t: torch.Tensor, layout: Optional[str]) -> torch.Tensor:
    if layout != CL:
        return t
    return t.contiguous(memory_format=torch.channels_last if t.ndim == 4 else torch.channels_last_3d)


@pytest.mark.parametrize("xs,ws,stride,padding,x_layout,w_layout,pytorchs",
                         [(*row, False) for row in CONVS] + [(*row, True) for row in SLOW3D])
@pytest.mark.slow
def test_one_convolution_predicts_the_allocator_peak_and_the_output_layout(xs, ws, stride, padding,
                                                                          x_layout, w_layout, pytorchs):
    """Each backend's rule alone: the meta op's output (restrided as the CPU kernel returns it) plus what the
    rule says the kernel holds inside equals the allocator's peak of the real op within 1 % + 16 KiB, and the
    predicted output layout is the real one. 3-D convs run through the package's conv3d, on its kernels or (the
    Slow3d rows) PyTorch's."""
    from turbovae.vae.accel.kernels.conv_guard import conv3d

    g = torch.Generator().manual_seed(0)
    x = _laid_out(torch.randn(xs, generator=g), x_layout)
    w = _laid_out(torch.randn(ws, generator=g), w_layout)
    b = torch.randn(ws[0], generator=g)
    conv = F.conv2d if len(xs) == 4 else conv3d
    with torch.inference_mode(), (cpu_conv_memory.pytorch_kernels() if pytorchs else nullcontext()):
        conv(x, w, b, stride, padding)
        measured, y = measure_peak(lambda: conv(x, w, b, stride, padding), "cpu")
        xm, wm, bm = (t.to("meta") for t in (x, w, b))
        tracker = LiveBytes(exclude=[xm, wm, bm], op_memory=CpuOpMemory())
        with tracker:
            ym = conv(xm, wm, bm, stride, padding)
        op = torch.ops.aten.conv3d.default if len(xs) == 5 else torch.ops.aten.conv2d.default
        backend = cpu_conv_memory.cpu_backend(cpu_conv_memory.conv_params(op, (xm, wm, bm, stride, padding), {}))
    assert ym.stride() == y.stride()
    assert abs(tracker.peak - measured.device_bytes) <= 0.01 * measured.device_bytes + 16 * 1024, \
        (tracker.peak, measured.device_bytes)
    if len(xs) == 5:  # every 3-D row runs oneDNN, on PyTorch's choice or this package's, but the Slow3d rows
        assert backend == (torch._C._ConvBackend.Slow3d if pytorchs else torch._C._ConvBackend.Mkldnn)


@pytest.mark.parametrize("xs,ws", [((1, 64, 3, 128, 32), (64, 64, 3, 3, 3)), ((1, 48, 3, 128, 64), (48, 48, 3, 3, 3)),
                                   ((1, 64, 32, 32), (64, 64, 1, 1)), ((1, 16, 32, 32), (16, 16, 3, 3)),
                                   ((1, 64, 3, 32, 32), (64, 64, 3, 3, 3))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backend_is_asked_without_memory_and_answers_as_for_real_tensors(xs, ws, dtype):
    """The kernel choice asked with stride-0 tensors (no memory) is the one PyTorch makes for real tensors of
    the shapes (`torch.empty` of the shapes: pages never written, so only address space); the package's choice
    differs from it only where it runs oneDNN instead of the 3-D im2col kernel."""
    xm, wm = torch.empty(xs, device="meta", dtype=dtype), torch.empty(ws, device="meta", dtype=dtype)
    dims = len(xs) - 2
    p = cpu_conv_memory.conv_params(torch.ops.aten.convolution.default,
                                    (xm, wm, None, [1] * dims, [0] * dims, [1] * dims, False, [0] * dims, 1), {})
    real = torch._C._select_conv_backend(torch.empty(xs, dtype=dtype), torch.empty(ws, dtype=dtype), None,
                                         [1] * dims, [0] * dims, [1] * dims, False, [0] * dims, 1, None)
    assert cpu_conv_memory.pytorch_backend(xm, wm, [1] * dims, [0] * dims, [1] * dims, 1) == real
    B = torch._C._ConvBackend
    ours = cpu_conv_memory.cpu_backend(p)
    assert ours == (B.Mkldnn if real == B.Slow3d and dtype == torch.float32 else real)


def test_channels_last_group_norm_is_predicted_in_place():
    """The CPU's channels-last GroupNorm writes into its input when the caller allows it (vae/norms.py); a meta
    pass for the CPU takes the same path (vae/memory/meta_device.py), so a norm that allocates nothing beyond its
    chunked statistics is predicted so, not as a new activation-sized output."""
    from turbovae.vae import norms
    from turbovae.vae.planning.meta_pass import meta_pass_for

    x = torch.randn(1, 64, 2, 250, 256).contiguous(memory_format=torch.channels_last_3d)  # chunks: 15×16+10 rows
    w, b = torch.ones(64), torch.zeros(64)
    with torch.inference_mode():
        measured, _ = measure_peak(lambda: norms.group_norm_silu(x.clone(memory_format=torch.channels_last_3d),
                                                                 32, w, b, 1e-6, inplace=True), "cpu")
        xm = x.to("meta")
        tracker = LiveBytes(exclude=[xm], op_memory=CpuOpMemory())
        with meta_pass_for("cpu"), tracker:
            norms.group_norm_silu(xm.clone(memory_format=torch.channels_last_3d), 32, w.to("meta"), b.to("meta"),
                                  1e-6, inplace=True)
    activation = x.numel() * x.element_size()
    assert abs(tracker.peak - measured.device_bytes) <= 0.02 * measured.device_bytes
    assert measured.device_bytes < 1.25 * activation  # the clone and a 2 MiB chunk buffer, no second output


def test_group_norm_of_a_strided_view_is_predicted_with_its_copy():
    """`F.group_norm` of a frame-major view of a contiguous clip (what the contiguous path normalises per frame)
    copies its input densely first (vae/memory/op_rules.py): output plus that copy, as the allocator sees it."""
    x = torch.randn(1, 16, 5, 64, 64)
    frames = x.transpose(1, 2).reshape(5, 16, 64, 64)  # a view: no copy yet
    assert frames.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    with torch.inference_mode():
        measured, y = measure_peak(lambda: F.group_norm(frames, 4), "cpu")
        fm = frames.to("meta").as_strided(frames.shape, frames.stride())
        tracker = LiveBytes(exclude=[fm], op_memory=CpuOpMemory())
        with tracker:
            ym = F.group_norm(fm, 4)
    assert ym.stride() == y.stride()
    assert abs(tracker.peak - measured.device_bytes) <= 0.01 * measured.device_bytes, \
        (tracker.peak, measured.device_bytes)
