"""The answers vae/memory/meta_ops.py gives for slow meta kernels equal the kernels' own results (shape, strides,
dtype, storage), only meta tensors take them, and a pass counted through them predicts the same peak."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from turbovae.vae.memory import meta_ops
from turbovae.vae.memory.peak import LiveBytes

aten = torch.ops.aten


def _meta(*shape, dtype=torch.bfloat16, channels_last=False):
    t = torch.empty(shape, device="meta", dtype=dtype)
    if channels_last:
        t = t.contiguous(memory_format=torch.channels_last_3d if t.ndim == 5 else torch.channels_last)
    return t


IN_PLACE = [
    (aten.clamp_.default, lambda: (_meta(1, 4, 2, 8, 8), -1.0, 1.0)),
    (aten.add_.Tensor, lambda: (_meta(1, 4, 2, 8, 8, channels_last=True), _meta(1, 4, 1, 8, 8))),
    (aten.mul_.Scalar, lambda: (_meta(3, 5)[:, 1:], 2.0)),  # a view: written in place, not copied
    (aten.copy_.default, lambda: (_meta(2, 3, 4).transpose(0, 2), _meta(4, 3, 2))),
    (aten.zero_.default, lambda: (_meta(6, 7),)),
    (aten.silu_.default, lambda: (_meta(2, 8, dtype=torch.float32),)),
]


@pytest.mark.parametrize("func,make", IN_PLACE, ids=[str(f) for f, _ in IN_PLACE])
def test_an_in_place_op_on_meta_tensors_returns_its_first_argument_as_its_kernel_does(func, make):
    args = make()
    before = (args[0].shape, args[0].stride(), args[0].storage_offset())
    assert meta_ops.plain_in_place(func)
    assert meta_ops.run_op(func, args, {}) is args[0]
    real = func(*make())  # the meta kernel: also its first argument, metadata unchanged
    assert (real.shape, real.stride(), real.storage_offset()) == before


@pytest.mark.parametrize("func", [aten.unsqueeze_.default, aten.as_strided_.default, aten.resize_.default,
                                  aten.set_.source_Tensor, aten.transpose_.default, aten.add.Tensor,
                                  aten.linear.default, aten.empty_like.default])
def test_ops_that_change_metadata_or_allocate_are_not_taken_for_plain_in_place_ones(func):
    assert not meta_ops.plain_in_place(func)


@pytest.mark.parametrize("x_shape,w_shape,bias,transposed", [
    ((1, 8100, 512), (512, 512), True, False),
    ((7, 64), (32, 64), False, False),
    ((64,), (16, 64), True, False),
    ((2, 3, 40, 24), (24, 24), True, True),  # a non-contiguous input
])
def test_linear_on_meta_tensors_is_answered_as_its_kernel_answers(x_shape, w_shape, bias, transposed):
    x = _meta(*x_shape)
    if transposed:
        x = _meta(*x_shape[:-2], x_shape[-1], x_shape[-2]).transpose(-1, -2)
    w, b = _meta(*w_shape), (_meta(w_shape[0]) if bias else None)
    ours = meta_ops.run_op(aten.linear.default, (x, w, b), {})
    theirs = aten.linear.default(x, w, b)
    assert (ours.shape, ours.stride(), ours.dtype, ours.device) == \
        (theirs.shape, theirs.stride(), theirs.dtype, theirs.device)
    assert ours.untyped_storage().nbytes() == theirs.untyped_storage().nbytes()


@pytest.mark.parametrize("x_cl,w_cl,stride,padding", [(False, False, [1, 1, 1], [0, 0, 0]),
                                                       (True, True, [1, 2, 2], [0, 1, 1]),
                                                       (False, True, [1, 1, 1], [0, 1, 1]),
                                                       (True, False, [2, 2, 2], [1, 1, 1])])
def test_a_conv_on_meta_tensors_is_answered_as_its_kernel_answers_first_and_remembered(x_cl, w_cl, stride, padding):
    x, w, b = _meta(1, 16, 3, 20, 24, channels_last=x_cl), _meta(8, 16, 3, 3, 3, channels_last=w_cl), _meta(8)
    meta_ops._CONV_OUTPUTS.clear()
    args = (x, w, b, stride, padding)
    theirs = aten.conv3d.default(x, w, b, stride, padding)
    for _ in range(2):  # the kernel's own answer, then the remembered one
        ours = meta_ops.run_op(aten.conv3d.default, args, {})
        assert (ours.shape, ours.stride(), ours.dtype) == (theirs.shape, theirs.stride(), theirs.dtype)
        assert ours.untyped_storage().nbytes() == theirs.untyped_storage().nbytes()
    assert len(meta_ops._CONV_OUTPUTS) == 1
    frames = _meta(3, 16, 20, 24, channels_last=x_cl)  # the same sizes as a 2-D conv: another entry
    flat = meta_ops.run_op(aten.conv2d.default, (frames, _meta(8, 16, 3, 3), None, [1, 1], [1, 1]), {})
    assert flat.shape == (3, 8, 20, 24) and len(meta_ops._CONV_OUTPUTS) == 2


@pytest.mark.parametrize("func", [aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor])
@pytest.mark.parametrize("make", [
    lambda: (_meta(2, 3, 4), _meta(2, 3, 4)),
    lambda: (_meta(1, 8, 2, 6, 5, channels_last=True), _meta(1, 8, 2, 6, 5, channels_last=True)),
    lambda: (_meta(1, 1, 2, 6, 5, channels_last=True), _meta(1, 1, 2, 6, 5)),  # one channel: both layouts at once
    lambda: (_meta(1, 8, 2, 6, 5)[:1], _meta(1, 8, 1, 6, 5, channels_last=True)[:, :, :1].expand(1, 8, 2, 6, 5)),
    lambda: (_meta(4, 6).t(), _meta(4, 6).t()),  # dense, transposed: the kernel answers
    lambda: (_meta(4, 6)[:, :3], _meta(4, 6)[:, :3]),  # not dense: the kernel answers
    lambda: (_meta(1, 8, 2, 6, 5), _meta(1, 8, 2, 6, 5, channels_last=True)),  # two layouts: the kernel answers
    lambda: (_meta(2, 1, 4), _meta(2, 3, 4)),  # broadcast: the kernel answers
    lambda: (_meta(3, 3, dtype=torch.int32), _meta(3, 3, dtype=torch.int32)),  # integer division promotes
], ids=["contiguous", "channels-last", "one-channel", "expanded", "transposed", "gappy", "mixed", "broadcast", "int"])
def test_an_elementwise_op_of_alike_tensors_is_answered_as_its_kernel_answers(func, make):
    args = make()
    ours = meta_ops.run_op(func, args, {})
    theirs = func(*make())
    assert (ours.shape, ours.stride(), ours.dtype) == (theirs.shape, theirs.stride(), theirs.dtype)
    assert ours.untyped_storage().nbytes() == theirs.untyped_storage().nbytes()
    assert meta_ops.run_op(func, args, {"alpha": 2}).shape == theirs.shape if func in (aten.add.Tensor,
                                                                                       aten.sub.Tensor) else True


def test_real_tensors_run_the_real_op():
    x = torch.ones(3)
    assert meta_ops.run_op(aten.add_.Tensor, (x, torch.ones(3)), {}) is x
    assert torch.equal(x, torch.full((3,), 2.0))  # added, not skipped
    y = meta_ops.run_op(aten.linear.default, (torch.ones(2, 3), torch.ones(4, 3), None), {})
    assert torch.equal(y, torch.full((2, 4), 3.0))


def test_a_counted_pass_has_the_same_peak_through_the_answers_as_through_the_kernels(monkeypatch):
    """A small attention-like block (linears, in-place adds and clamps) counted by `LiveBytes` on meta tensors: the
    same peak and the same live bytes at the end whether the slow kernels run or are answered."""
    def block(x, w):
        q = F.linear(x, w)
        k = F.linear(x, w)
        q.add_(k).clamp_(-1.0, 1.0)
        del k
        y = F.linear(q, w) * 2.0
        return y.add_(x)

    def counted() -> tuple[int, int]:
        x, w = _meta(1, 4096, 256), _meta(256, 256)
        tracker = LiveBytes(exclude=[x, w])
        with torch.inference_mode(), tracker:
            y = block(x, w)
        return tracker.peak, y.untyped_storage().nbytes()

    answered = counted()
    monkeypatch.setattr(meta_ops, "run_op", lambda func, args, kwargs: func(*args, **kwargs))
    monkeypatch.setattr("turbovae.vae.memory.peak.run_op", meta_ops.run_op)
    assert counted() == answered
    assert answered[0] == 3 * 4096 * 256 * 2  # q, k, then q and the product's output beside it
