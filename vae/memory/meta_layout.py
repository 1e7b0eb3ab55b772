"""The layout rules PyTorch's kernels give their outputs, as arithmetic on shapes and strides.

Why: `meta_ops` answers some meta kernels (PyTorch's Python reference implementations) without running them, and an
answer must be the tensor the kernel makes, strides included — a later op's layout, and so the copies it makes and
the memory a prediction counts, follow them. These functions work on plain tuples (no tensor is made); each rule is
PyTorch's documented behaviour, and `tests/test_meta_ops.py` compares every answer built on them with the kernel's
own result over random shapes and layouts. Sizes are taken as ≥ 1 where a rule says so (callers leave empty
tensors to the kernel).
"""

from __future__ import annotations

from typing import Optional, Sequence

Shape = Sequence[int]


def _dense(shape: Shape, innermost_first: Sequence[int]) -> tuple[int, ...]:
    """Strides of `shape` laid out densely with its dimensions in the order `innermost_first` (a dimension of size
    0 or 1 counts as 1 for the dimensions outside it)."""
    strides, step = [0] * len(shape), 1
    for d in innermost_first:
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def contiguous_strides(shape: Shape) -> tuple[int, ...]:
    """Row-major strides of `shape`."""
    return _dense(shape, range(len(shape) - 1, -1, -1))


def channels_last_strides(shape: Shape) -> tuple[int, ...]:
    """Strides of a 4-D or 5-D `shape` laid out channels-last (channels innermost, then width, height, depth,
    batch), as `torch.empty(..., memory_format=channels_last[_3d])` makes them."""
    return _dense(shape, (1, *range(len(shape) - 1, 1, -1), 0))


def is_contiguous(shape: Shape, strides: Shape) -> bool:
    """`Tensor.is_contiguous()`: row-major, ignoring the strides of size-1 dimensions; empty tensors are."""
    if 0 in shape:
        return True
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1:
            if stride != expected:
                return False
            expected *= size
    return True


def is_channels_last_2d(shape: Shape, strides: Shape) -> bool:
    """`Tensor.is_contiguous(memory_format=torch.channels_last)`: a 4-D tensor laid out N, H, W, C (size-1
    dimensions' strides ignored); never for other ranks."""
    if len(shape) != 4:
        return False
    expected = 1
    for d in (1, 3, 2, 0):
        if shape[d] != 1:
            if strides[d] != expected:
                return False
            expected *= shape[d]
    return True


def is_dense(shape: Shape, strides: Shape) -> bool:
    """Non-overlapping and dense: the elements fill one block of memory exactly, in some order of the dimensions
    (dimensions of size 0 or 1 ignored)."""
    if len(shape) == 1:
        return shape[0] < 2 or strides[0] == 1
    expected = 1
    for size, stride in sorted(((s, st) for s, st in zip(shape, strides) if s > 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def broadcast_shape(shapes: Sequence[Shape]) -> Optional[tuple[int, ...]]:
    """The shape `shapes` broadcast to, or None where they do not broadcast."""
    rank = max(len(s) for s in shapes)
    out = [1] * rank
    for shape in shapes:
        for i, size in enumerate(shape, rank - len(shape)):
            if size != 1:
                if out[i] not in (1, size):
                    return None
                out[i] = size
    return tuple(out)


def expanded_strides(shape: Shape, strides: Shape, out_shape: Shape) -> tuple[int, ...]:
    """Strides of a tensor of `shape` expanded to `out_shape` (`Tensor.expand`): 0 for every dimension stretched
    from size 1; a dimension it gains of size 1 takes the stride that would make it contiguous with the one inside."""
    lead = len(out_shape) - len(shape)
    out = [0] * len(out_shape)
    inner_size, inner_stride = 1, 1
    for i in reversed(range(len(out_shape))):
        size, stride = (shape[i - lead], strides[i - lead]) if i >= lead else (1, inner_size * inner_stride)
        if size != out_shape[i]:
            size, stride = out_shape[i], 0
        out[i] = stride
        inner_size, inner_stride = size, stride
    return tuple(out)


def _output_order(shape: Shape, operands: Sequence[Shape]) -> list[int]:
    """The dimensions of an elementwise op's output from outermost to innermost, read from its operands' strides
    (TensorIterator's rule): a dimension goes inside another where the first operand whose strides tell them apart
    (neither 0) has the smaller stride there; equal strides put the longer dimension inside."""
    def order(a: int, b: int) -> int:  # > 0: `a` belongs outside `b`
        for strides in operands:
            sa, sb = strides[a], strides[b]
            if sa == 0 or sb == 0:
                continue
            if sa == sb:
                if shape[b] >= shape[a]:
                    continue
                return 1
            return -1 if sb >= sa else 1
        return 0

    perm = list(reversed(range(len(shape))))  # innermost first, sorted by insertion
    for i in range(1, len(shape)):
        j = i
        for k in reversed(range(i)):
            c = order(perm[k], perm[j])
            if c > 0:
                perm[k], perm[j] = perm[j], perm[k]
                j = k
            elif c < 0:
                break
    return list(reversed(perm))


def elementwise_strides(shape: Shape, operands: Sequence[Shape]) -> tuple[int, ...]:
    """Strides of the output of an elementwise op over tensor operands with the strides `operands`, each already
    expanded to the output `shape`: operands all contiguous (and not all channels-last) give a contiguous output,
    all channels-last a channels-last one; otherwise the dimensions are ordered as `_output_order` reads them and
    laid out densely in that order (a lone operand's odd strides on size-1 dimensions are not kept)."""
    rank = len(shape)
    if rank <= 1:
        return contiguous_strides(shape)
    contiguous = all(is_contiguous(shape, s) for s in operands)
    channels_last = all(is_channels_last_2d(shape, s) for s in operands)
    if contiguous and not channels_last:
        return contiguous_strides(shape)
    if channels_last and not contiguous:
        return channels_last_strides(shape)
    return _dense(shape, list(reversed(_output_order(shape, operands))))


def dense_strides(shape: Shape, strides: Shape, channels_last: bool) -> tuple[int, ...]:
    """Strides of a tensor of `shape` and `strides` converted to another dtype (PyTorch's reference kernels convert
    half-precision operands to float32 before the op): its own where it is dense, else channels-last where
    `t.suggest_memory_format()` says so (`channels_last`), else contiguous (of rank 0 or 1: contiguous)."""
    if is_dense(shape, strides):
        return tuple(strides)
    if len(shape) <= 1:
        return contiguous_strides(shape)
    return channels_last_strides(shape) if channels_last else contiguous_strides(shape)


def suggests_channels_last(shape: Shape, strides: Shape) -> bool:
    """`Tensor.suggest_memory_format()` is channels-last (it has no Python binding): a 4-D or 5-D tensor whose
    strides grow from channels through width, height (and depth) to batch, each at least the extent of the one
    inside it; a zero channel stride, an empty dimension, or a batch stride no more than the channels' reach (the
    ambiguous N×1×1×1 cases) say contiguous."""
    rank = len(shape)
    if rank not in (4, 5) or strides[1] == 0:
        return False
    reach = 0
    for d in (1, *range(rank - 1, 1, -1), 0):
        if shape[d] == 0 or strides[d] < reach or (d == 0 and reach == strides[1]):
            return False
        reach = strides[d] * shape[d]
    return True
