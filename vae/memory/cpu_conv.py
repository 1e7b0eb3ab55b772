"""What a CPU convolution allocates inside itself, and how it lays out its output, per kernel PyTorch picks.

Why: on meta tensors a convolution allocates its output only, contiguous (torch/_meta_registrations.py,
`meta_conv`: "Memory format is left as contiguous"). On the CPU, PyTorch picks a kernel per call by a shape
heuristic (aten/src/ATen/native/Convolution.cpp: `_select_conv_backend`, `ConvParams::use_mkldnn`: oneDNN for
fp32 only when N·C·D·H > 20480 or the kernel is larger than 3×3 or …, else PyTorch's own im2col kernels), and
the kernels differ by tens of times the output in what they hold while they run. The choice is PyTorch's own
(`torch._C._select_conv_backend`, asked with stride-0 CPU tensors of the call's shapes: it reads shapes, dtype,
parameters and the thread count, never the data, so nothing is allocated), and so is the output's layout
(`torch._C._conv_determine_backend_memory_format`). One exception is this package's: an fp32 3-D convolution
PyTorch would give its im2col kernel runs on oneDNN (`onednn_instead`, vae/accel/kernels/conv_guard.py), and is
priced as oneDNN's. Measured with vae/memory/allocator.py on one AMD EPYC
(AVX-512), torch 2.13 CPU, fp32, 2 threads, single convs (tests/test_prediction_accuracy.py keeps checking them):

- `Slow3d` / `Slow2d` (ConvolutionMM3d.cpp, ConvolutionMM2d.cpp): a contiguous copy of the input and of the
  weight where they are not contiguous in the kernel's layout (Slow3d: always plain; Slow2d: channels-last when
  either is), plus the im2col "columns" buffer, C_in·k_t·k_h·k_w × N·T_out·H_out·W_out elements, skipped for a
  1×1(×1) kernel of stride 1 and no padding. Measured to the byte (e.g. 64→64 ch 3×3×3 on 3×32×32: 5.933 MiB
  columns; channels-last input adds its 0.750 MiB copy and the weight's 0.422 MiB).
- `Mkldnn` (mkldnn/Conv.cpp): the input and weight made contiguous in the kernel's layout (channels-last when
  either is, else plain). Channels-last: oneDNN reorders only the weight into its blocked layout (+ the weight,
  channels padded to 16; e.g. 0.434 MiB for a 0.422 MiB weight). Plain: it reorders the input, the weight and
  its output into blocked layouts, then copies the output back to a plain tensor: extra = the most of
  (input + weight + output blocked − the plain output, output blocked), e.g. 3.422 MiB for a 3 MiB input and a
  0.422 MiB weight; 6.0 MiB (the blocked output) for a 1×3×3 conv doubling 64 channels on 3 MiB.
  Channels are rounded up to 16 (AVX-512's block; AVX2's is 8, so there this is an upper bound), except that an
  input of fewer than 16 channels is read as it is (oneDNN's "first convolution" kernels: 8 → 8 channels on
  256×256 holds 4.0 MiB, the padded output alone), and so are the weight's input channels (8 → 256 channels
  3×3×3: 256·8·27 weights blocked, not 256·16·27). A channels-last call also holds 12 KiB more (12,336 B at 64
  and 256 channels, 2-D and 3-D; nothing like it in plain calls).

Not modelled (no model here runs them): transposed and grouped convolutions, other backends (NNPACK, XNNPACK).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Iterator, Optional, Sequence

import torch

aten = torch.ops.aten

_CONVS = {aten.conv1d.default, aten.conv2d.default, aten.conv3d.default, aten.convolution.default,
          aten._convolution.default}

_ONEDNN_BLOCK = 16  # channels per block of oneDNN's blocked layouts on AVX-512
_ONEDNN_EXTRA = 12 * 1024  # held by every channels-last oneDNN convolution beyond its layouts (module docstring)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _round_up(n: int, block: int) -> int:
    return -(-n // block) * block


def is_conv(func) -> bool:
    """Whether `func` is one of the conv ops `conv_params` reads."""
    return func in _CONVS


def conv_params(func, args: tuple, kwargs: dict) -> Optional[dict]:
    """The convolution's input, weight and parameters from any of the conv ops a dispatch mode sees
    (`aten.conv3d` under inference mode, `aten.convolution` outside it), or None for another op."""
    if func not in _CONVS:
        return None
    names = ("input", "weight", "bias", "stride", "padding", "dilation")
    names += ("groups",) if func in (aten.conv1d.default, aten.conv2d.default, aten.conv3d.default) \
        else ("transposed", "output_padding", "groups")
    p = dict(zip(names, args))
    p.update({k: v for k, v in kwargs.items() if k in names})
    dims = p["weight"].ndim - 2
    p.setdefault("bias", None)
    for key, default in (("stride", 1), ("padding", 0), ("dilation", 1), ("output_padding", 0)):
        v = p.get(key, default)
        v = [int(i) for i in v] if isinstance(v, (list, tuple)) else [int(v)]
        p[key] = v * dims if len(v) == 1 else v
    p.setdefault("transposed", False)
    p["groups"] = int(p.get("groups", 1))
    return p


@functools.lru_cache(maxsize=4096)
def _backend(x_shape: tuple, w_shape: tuple, dtype: torch.dtype, stride: tuple, padding: tuple, dilation: tuple,
             transposed: bool, output_padding: tuple, groups: int, _threads: int, _mkldnn: bool):
    """PyTorch's own kernel choice for these shapes on the CPU (the last two arguments only key the cache: the
    choice reads the thread count and whether oneDNN is enabled)."""
    x = torch.empty((), dtype=dtype).expand(x_shape)  # stride 0: a CPU tensor of the shape, no memory
    w = torch.empty((), dtype=dtype).expand(w_shape)
    return torch._C._select_conv_backend(x, w, None, list(stride), list(padding), list(dilation), transposed,
                                         list(output_padding), groups, None)


# Whether `onednn_instead` may answer yes (`pytorch_kernels` turns it off for a block of code).
_ONEDNN_INSTEAD = [True]


@contextlib.contextmanager
def pytorch_kernels() -> Iterator[None]:
    """CPU convolutions run, and are predicted, on the kernel PyTorch picks (no oneDNN in place of its 3-D im2col
    kernel, `onednn_instead`): the baseline the plan-costs bench times beside this package's choice, and the
    kernels an exported program runs (its graph holds `aten.conv3d`). Process-wide while it lasts, like
    `torch.backends.mkldnn.flags`: the worker threads of a multi-device pass see it too."""
    was = _ONEDNN_INSTEAD[0]
    _ONEDNN_INSTEAD[0] = False
    try:
        yield
    finally:
        _ONEDNN_INSTEAD[0] = was


def kernel_choice() -> str:
    """Whose CPU convolution kernels run now: "turbovae" (oneDNN where `onednn_instead` says) or "pytorch" (inside
    `pytorch_kernels`). Predictions differ between the two, so what memoizes them keys by it."""
    return "turbovae" if _ONEDNN_INSTEAD[0] else "pytorch"


def onednn_instead(backend, weight_dims: int, dtype: torch.dtype, transposed: bool, groups: int) -> bool:
    """Whether this package runs a CPU convolution on oneDNN where PyTorch would pick its 3-D im2col kernel
    (`Slow3d`): an fp32 3-D convolution, not transposed or grouped, with oneDNN built in and enabled, outside
    `pytorch_kernels`.

    Why: PyTorch sends a batch-1 conv3d to oneDNN only above a size (N·C·D·H > 20480, among others), and the bands
    and tiles of exact passes fall below it: a band of a few rows is as wide as the frame but short. On those
    shapes its im2col kernel takes several times oneDNN's time (the plan-costs bench times both) and holds a
    columns buffer of C_in·27 × the output, so vae/accel/kernels/conv_guard.py calls oneDNN itself. This is the one
    place that says when, so the prediction prices the kernel that runs."""
    return (_ONEDNN_INSTEAD[0] and backend == torch._C._ConvBackend.Slow3d and weight_dims == 5
            and dtype == torch.float32 and not transposed and groups == 1 and torch.backends.mkldnn.is_available()
            and torch.backends.mkldnn.enabled)


def pytorch_backend(x: torch.Tensor, weight: torch.Tensor, stride: Sequence[int], padding: Sequence[int],
                    dilation: Sequence[int], groups: int, transposed: bool = False,
                    output_padding: Optional[Sequence[int]] = None):
    """The `torch._C._ConvBackend` PyTorch itself picks for a convolution of these tensors' shapes on the CPU."""
    return _backend(tuple(x.shape), tuple(weight.shape), x.dtype, tuple(stride), tuple(padding), tuple(dilation),
                    transposed, tuple(output_padding or (0,) * (weight.ndim - 2)), groups, torch.get_num_threads(),
                    torch.backends.mkldnn.enabled)


def cpu_backend(p: dict):
    """The `torch._C._ConvBackend` a CPU convolution of `p`'s shapes runs in this package: PyTorch's choice, or
    oneDNN where this package calls it instead (`onednn_instead`; every conv3d of the models goes through
    vae/accel/kernels/conv_guard.py, a test holds that)."""
    x, w = p["input"], p["weight"]
    backend = pytorch_backend(x, w, p["stride"], p["padding"], p["dilation"], p["groups"], bool(p["transposed"]),
                              p["output_padding"])
    if onednn_instead(backend, w.ndim, x.dtype, bool(p["transposed"]), p["groups"]):
        return torch._C._ConvBackend.Mkldnn
    return backend


def cpu_layout(p: dict, backend) -> torch.memory_format:
    """The layout the kernel computes in and returns: channels-last for oneDNN and the 2-D im2col kernel when
    the input or weight is channels-last (the rule PyTorch applies to both; asked of oneDNN's, which needs no
    CPU tensor), plain for everything else."""
    B = torch._C._ConvBackend
    if backend in (B.Mkldnn, B.Slow2d):
        return torch._C._conv_determine_backend_memory_format(p["input"], p["weight"], B.Mkldnn)
    return torch.contiguous_format


def _copy_bytes(t: torch.Tensor, fmt: torch.memory_format) -> int:
    return 0 if t.is_contiguous(memory_format=fmt) else _nbytes(t)


def _is_pointwise(p: dict) -> bool:
    w = p["weight"]
    return all(k == 1 for k in w.shape[2:]) and all(s == 1 for s in p["stride"]) \
        and all(q == 0 for q in p["padding"])


def transient_bytes(p: dict, out: torch.Tensor) -> int:
    """Bytes the CPU convolution holds beyond its inputs and `out` (module docstring: the measurements)."""
    if p["transposed"] or p["groups"] != 1:
        return 0
    B = torch._C._ConvBackend
    backend = cpu_backend(p)
    x, w = p["input"], p["weight"]
    fmt = cpu_layout(p, backend)
    copies = _copy_bytes(x, fmt) + _copy_bytes(w, fmt)
    esize = x.element_size()
    if backend in (B.Slow3d, B.Slow2d):
        columns = 0 if _is_pointwise(p) else \
            x.shape[0] * w.shape[1] * math.prod(w.shape[2:]) * math.prod(out.shape[2:]) * esize
        return copies + columns
    if backend == B.Mkldnn:
        # an input of fewer channels than a block is read as it is, and the weight's input channels likewise
        c_out = _round_up(w.shape[0], _ONEDNN_BLOCK)
        c_in = w.shape[1] if w.shape[1] < _ONEDNN_BLOCK else _round_up(w.shape[1], _ONEDNN_BLOCK)
        w_blocked = c_out * c_in * math.prod(w.shape[2:]) * esize
        if fmt != torch.contiguous_format:
            return copies + w_blocked + _ONEDNN_EXTRA
        x_blocked = 0 if w.shape[1] < _ONEDNN_BLOCK else x.shape[0] * c_in * math.prod(x.shape[2:]) * esize
        y_blocked = out.shape[0] * c_out * math.prod(out.shape[2:]) * esize
        return copies + max(x_blocked + w_blocked + y_blocked - _nbytes(out), y_blocked)
    return 0


def real_output(p: dict, out: torch.Tensor) -> torch.Tensor:
    """`out` (the meta kernel's plain output) in the layout the CPU kernel returns."""
    if p["transposed"] or out.ndim not in (4, 5):
        return out
    fmt = cpu_layout(p, cpu_backend(p))
    if out.is_contiguous(memory_format=fmt):
        return out
    return torch.empty_like(out, memory_format=fmt)
