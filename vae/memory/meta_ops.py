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
  kernel returns it so: a matrix product's row-major output, viewed back to the input's leading dimensions).
Everything else runs its meta kernel. Only meta tensors take these answers (a measurement on real tensors runs the
real op); `tests/test_meta_ops.py` checks each answer against the meta kernel's own result.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

_PLAIN_IN_PLACE: dict = {}  # op -> whether it is an in-place op that only writes its first argument's values


def plain_in_place(func) -> bool:
    """Whether `func` is an in-place op that writes its first argument's values and returns it (`add_`, `clamp_`,
    `copy_`, `zero_`): aten's in-place naming and schema (first argument and only return written), and not an
    in-place view op (`unsqueeze_`, `as_strided_`, `resize_`, `set_`: those change metadata or storage)."""
    known = _PLAIN_IN_PLACE.get(func)
    if known is None:
        schema = func._schema
        first = schema.arguments[0].alias_info if schema.arguments else None
        ret = schema.returns[0].alias_info if len(schema.returns) == 1 else None
        known = _PLAIN_IN_PLACE[func] = bool(
            schema.name.endswith("_") and not schema.name.endswith("__") and first is not None and first.is_write
            and ret is not None and ret.is_write and torch.Tag.inplace_view not in func.tags)
    return known


def _meta_tensor(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "meta"


def run_op(func, args: tuple, kwargs: dict):
    """`func(*args, **kwargs)`, answered without the meta kernel where module docstring's rules say what it
    returns and its arguments are meta tensors."""
    if args and _meta_tensor(args[0]):
        if plain_in_place(func):
            return args[0]
        if func is aten.linear.default and _meta_tensor(args[1]):
            x, w = args[0], args[1]
            return torch.empty((*x.shape[:-1], w.shape[0]), dtype=x.dtype, device=x.device)
    return func(*args, **kwargs)
