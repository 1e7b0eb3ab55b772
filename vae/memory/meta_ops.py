"""Answers for the ops whose meta kernels are slow Python, where a prediction needs only what they allocate.

Why: a prediction (vae/planning/predict.py) runs a pass's code on meta tensors under a counting mode
(`LiveBytes`, `WorkCounter`), and planning a shape runs it a few dozen times, so each meta op's own cost adds up.
Most meta kernels are C++ and take a few microseconds; a few are Python reference implementations that take
hundreds (measured on the 2-core CPU VM, torch 2.13: `clamp_` with scalar bounds about 0.75 ms, `linear` about 0.27
ms, an in-place `add_` about 13 µs against 2–3 µs for a C++ one), and a SeedVR2 or Qwen-Image plan calls them
hundreds to thousands of times. What the mode needs from them is known without running them:
- an in-place op (aten's `name_` ops that are not in-place *views*) writes into its first argument and returns it:
  nothing is allocated and no metadata changes;
- `linear` returns a new contiguous tensor of the input's leading dimensions and the weight's rows (every real
  kernel returns it so: a matrix product's row-major output, viewed back to the input's leading dimensions);
- `conv2d` / `conv3d` (their meta kernel works out the output's size and layout in Python, about 30 µs) return what
  their meta kernel returned for the same input and weight metadata and parameters, remembered (a pass calls each
  conv at a few band shapes, hundreds of times);
- `add`, `sub`, `mul`, `div` of two tensors of one shape and dtype, both contiguous or both channels-last (about
  90 µs of Python broadcasting, type promotion and layout on meta): a new tensor of that shape, dtype and layout.
Everything else runs its meta kernel. Only meta tensors take these answers (a measurement on real tensors runs the
real op); `tests/test_meta_ops.py` checks each answer against the meta kernel's own result.
"""

from __future__ import annotations

from typing import Optional

import torch

aten = torch.ops.aten

_IN_PLACE, _LINEAR, _CONV, _ALIKE = "in place", "linear", "conv", "alike"
# id(op) -> how a meta call of it is answered: _IN_PLACE, _LINEAR, _CONV, _ALIKE, or None (its kernel); keyed by
# id (an op lives for good, and OpOverload's own hash is Python, paid on every op of a pass)
_ANSWERS: dict = {}


def plain_in_place(func) -> bool:
    """Whether `func` is an in-place op that writes its first argument's values and returns it (`add_`, `clamp_`,
    `copy_`, `zero_`): aten's in-place naming and schema (first argument and only return written), and not an
    in-place view op (`unsqueeze_`, `as_strided_`, `resize_`, `set_`: those change metadata or storage)."""
    schema = func._schema
    first = schema.arguments[0].alias_info if schema.arguments else None
    ret = schema.returns[0].alias_info if len(schema.returns) == 1 else None
    return bool(schema.name.endswith("_") and not schema.name.endswith("__") and first is not None
                and first.is_write and ret is not None and ret.is_write and torch.Tag.inplace_view not in func.tags)


# elementwise ops of two tensors whose meta kernel (Python: broadcasting, type promotion, layout) is answered where
# both are alike (`_alike_output`)
_ELEMENTWISE = (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor)


def _answer(func) -> Optional[str]:
    if func is aten.linear.default:
        return _LINEAR
    if func in _ELEMENTWISE:
        return _ALIKE
    if func in (aten.conv2d.default, aten.conv3d.default):
        return _CONV
    return _IN_PLACE if plain_in_place(func) else None


# (op, input's and weight's shapes, strides and dtype, the conv's parameters) -> the meta kernel's output
# (shape, strides): a pass calls each conv at a few band shapes, hundreds of times
_CONV_OUTPUTS: dict = {}
CONV_OUTPUTS_KEPT = 4096


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _conv_output(func, args: tuple, kwargs: dict) -> torch.Tensor:
    x, w = args[0], args[1]
    key = (func, x.shape, x.stride(), x.dtype, w.shape, w.stride(), *map(_hashable, args[3:]),
           *((k, _hashable(v)) for k, v in sorted(kwargs.items())))
    found = _CONV_OUTPUTS.get(key)
    if found is None:
        out = func(*args, **kwargs)
        if len(_CONV_OUTPUTS) >= CONV_OUTPUTS_KEPT:  # a long-lived server plans many shapes: start again
            _CONV_OUTPUTS.clear()
        _CONV_OUTPUTS[key] = (out.shape, out.stride())
        return out
    return torch.empty_strided(found[0], found[1], dtype=x.dtype, device=x.device)


# the channels-last format by rank (vae/accel/tensor_layout.py has the same rule, but sits above this package)
_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def _alike_output(args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    """The result of an elementwise op of two meta tensors of one shape and floating dtype, both contiguous or both
    channels-last (and not contiguous), with no other argument than `alpha=1`: a new tensor of that shape, dtype and
    layout (what the meta kernel makes of them); None otherwise (the kernel answers)."""
    if len(args) != 2 or kwargs.get("alpha", 1) != 1 or len(kwargs) > ("alpha" in kwargs):
        return None
    x, y = args
    if not isinstance(y, torch.Tensor) or y.device.type != "meta" or x.dtype != y.dtype \
            or not x.dtype.is_floating_point or x.shape != y.shape:
        return None
    if x.is_contiguous() and y.is_contiguous():
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    fmt = _CHANNELS_LAST.get(x.dim())
    if fmt is not None and x.is_contiguous(memory_format=fmt) and y.is_contiguous(memory_format=fmt) \
            and not x.is_contiguous() and not y.is_contiguous():
        return torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=fmt)
    return None



def run_op(func, args: tuple, kwargs: dict):
    """`func(*args, **kwargs)`, answered without the meta kernel where the module docstring's rules say what it
    returns and its arguments are meta tensors."""
    try:
        how = _ANSWERS[id(func)]
    except KeyError:
        how = _ANSWERS[id(func)] = _answer(func)
    if how is not None and args and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
        if how is _IN_PLACE:
            return args[0]
        if how is _CONV:
            return _conv_output(func, args, kwargs)
        if how is _ALIKE:
            out = _alike_output(args, kwargs)
            if out is not None:
                return out
        elif how is _LINEAR:
            x, w = args[0], args[1]
            if isinstance(w, torch.Tensor) and w.device.type == "meta":
                return torch.empty((*x.shape[:-1], w.shape[0]), dtype=x.dtype, device=x.device)
    return func(*args, **kwargs)
