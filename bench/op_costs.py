"""Where a pass spends its work: FLOPs, tensor bytes and time per kind of operation.

Both the roofline section (bench/roofline.py) and the per-layer-type profile (bench/profile_layers.py) read
a pass through the same lens: every ATen operation it runs falls into one `CATEGORIES` kind (convolution,
copies and pads, concatenation, upsampling, norms and activations, attention, elementwise arithmetic).

- `count(fn)` runs `fn` once under a dispatch mode and adds up, per kind, the FLOPs (torch's own formulas in
  `torch.utils.flop_counter`, read off the real shapes of the call) and the bytes of every tensor an
  operation reads or writes (inputs + outputs; views move nothing and are skipped). A composite operation
  is counted through the operations it decomposes into, each under the composite's kind where it has one. The bytes are what the
  operations touch, an upper bound on memory traffic when caches hold nothing, used to say whether a pass
  could be limited by memory bandwidth rather than arithmetic.
- `time_by_kind(fn, device)` runs `fn` once under torch.profiler and sums each operation's *self* time
  (host time on CPU, kernel time on CUDA) per kind, so nested calls are not counted twice.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import conv_flop_count, flop_registry, shape_wrapper

# Kind of work -> ATen operation names (overload packet names, as the profiler prints them without "aten::").
CATEGORIES: dict[str, tuple[str, ...]] = {
    "conv": ("convolution", "_convolution", "mkldnn_convolution", "conv2d", "conv3d", "cudnn_convolution",
             "convolution_overrideable", "_slow_conv2d_forward", "slow_conv3d_forward", "_nnpack_spatial_convolution",
             "conv_depthwise3d", "_conv_depthwise2d"),
    "copy/pad": ("copy_", "clone", "constant_pad_nd", "_to_copy", "replication_pad3d", "replication_pad2d",
                 "reflection_pad2d", "reflection_pad3d", "pad", "contiguous", "fill_", "zero_", "index_select",
                 "index", "index_copy_", "index_put_", "_unsafe_index", "flip", "roll", "narrow_copy",
                 "slice_scatter", "select_scatter", "masked_fill", "where", "_reshape_copy"),
    "concat": ("cat", "stack", "_cat"),
    "upsample": ("upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact2d",
                 "_upsample_nearest_exact3d", "pixel_shuffle", "pixel_unshuffle", "repeat_interleave", "repeat"),
    "norm/act": ("native_group_norm", "group_norm", "native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm",
                 "silu", "silu_", "gelu", "sigmoid", "sigmoid_", "linalg_vector_norm", "norm", "rsqrt", "sqrt",
                 "var_mean", "mean", "pow", "clamp_min", "clamp", "clamp_"),
    "attention": ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                  "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_cudnn_attention", "bmm", "baddbmm", "mm", "addmm", "matmul", "linear",
                  "softmax", "_softmax", "_safe_softmax"),
    "add/mul": ("add", "add_", "mul", "mul_", "div", "div_", "sub", "sub_", "addcmul", "addcmul_", "neg", "exp",
                "lerp", "lerp_", "sum"),
}
OTHER = "other"
KINDS = tuple(CATEGORIES) + (OTHER,)
_KIND_OF = {name: kind for kind, names in CATEGORIES.items() for name in names}


def kind_of(op_name: str) -> str:
    """The kind of an ATen operation given as "aten::name", "aten.name.overload" or "name"."""
    name = op_name.split("::")[-1]
    if name.startswith("aten."):
        name = name.split(".")[1]
    return _KIND_OF.get(name, OTHER)


@dataclass
class Costs:
    """FLOPs and touched bytes per kind of operation for one pass."""

    flops: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    bytes: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    @property
    def total_flops(self) -> float:
        return sum(self.flops.values())

    @property
    def total_bytes(self) -> float:
        return sum(self.bytes.values())


def _onednn_conv_flop(x_shape, w_shape, _bias, _padding, _stride, _dilation, _groups, *, out_shape, **_kw) -> int:
    return conv_flop_count(x_shape, w_shape, out_shape)


# FLOP formulas of ops this package's passes run that torch.utils.flop_counter has none for: oneDNN's convolution,
# which vae/accel/kernels/conv_guard.py calls on the CPU where PyTorch would run its im2col kernel (ungrouped, not
# transposed). `FlopCounterMode(custom_mapping=EXTRA_FLOP_FORMULAS)` counts them too.
EXTRA_FLOP_FORMULAS = {torch.ops.aten.mkldnn_convolution: _onednn_conv_flop}
_FLOPS = {**flop_registry, **{op: shape_wrapper(f) for op, f in EXTRA_FLOP_FORMULAS.items()}}

# Operations that move no data: an allocation returns memory nobody has written yet (the op that fills it counts).
_NO_DATA = frozenset({"lift_fresh", "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"})


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _Counter(TorchDispatchMode):
    def __init__(self, costs: Costs):
        super().__init__()
        self.costs = costs
        self.outer: list[str] = []  # kinds of the composites being decomposed, innermost last

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func._overloadpacket
        if packet not in _FLOPS:  # a composite (conv3d, group_norm, pad): count the ops it is made of
            self.outer.append(kind_of(packet.__name__))
            try:
                with self:  # the mode is off inside its own handler: re-enter it so the parts are seen
                    out = func.decompose(*args, **kwargs)
            finally:
                self.outer.pop()
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        if func.is_view or torch.Tag.inplace_view in func.tags or packet.__name__ in _NO_DATA:
            return out  # a view moves no data, nor does an allocation
        # The parts of a composite count as the composite's kind (upsample_nearest3d's _unsafe_index is
        # upsampling, not a copy; rms_norm's mul is a norm); a composite of no known kind leaves them theirs.
        kind = next((k for k in self.outer if k != OTHER), kind_of(packet.__name__))
        if packet in _FLOPS:
            self.costs.flops[kind] += float(_FLOPS[packet](*args, **kwargs, out_val=out))
        seen: set[int] = set()
        for t in tree_flatten((args, kwargs, out))[0]:
            if isinstance(t, torch.Tensor) and id(t) not in seen:  # an in-place op's output is its input
                seen.add(id(t))
                self.costs.bytes[kind] += _nbytes(t)
        return out


def count(fn: Callable[[], object]) -> Costs:
    """FLOPs and touched bytes per kind of one run of `fn` (it runs for real; the result is dropped)."""
    costs = Costs()
    with torch.inference_mode(), _Counter(costs):
        fn()
    return costs


def time_by_kind(fn: Callable[[], object], device: torch.device) -> dict[str, float]:
    """Milliseconds of self time per kind for one run of `fn` (CPU host time, or CUDA kernel time)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.inference_mode(), profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize(device)
    ms: dict[str, float] = {k: 0.0 for k in KINDS}
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue
        us = event.self_device_time_total if cuda else event.self_cpu_time_total
        ms[kind_of(event.key)] += us / 1e3
    return ms
