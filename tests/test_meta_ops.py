"""The answers vae/memory/meta_ops.py gives for slow meta kernels equal the kernels' own results (shape, strides,
dtype, storage), only meta tensors take them, and a pass counted through them predicts the same peak."""

from __future__ import annotations

import random
import subprocess
import sys

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


def _same(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert (ours.shape, ours.stride(), ours.dtype, ours.device) == \
        (theirs.shape, theirs.stride(), theirs.dtype, theirs.device)
    assert ours.untyped_storage().nbytes() == theirs.untyped_storage().nbytes()


@pytest.mark.parametrize("func", [aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor])
@pytest.mark.parametrize("make", [
    lambda: (_meta(2, 3, 4), _meta(2, 3, 4)),
    lambda: (_meta(1, 8, 2, 6, 5, channels_last=True), _meta(1, 8, 2, 6, 5, channels_last=True)),
    lambda: (_meta(1, 1, 2, 6, 5, channels_last=True), _meta(1, 1, 2, 6, 5)),  # one channel: both layouts at once
    lambda: (_meta(1, 8, 2, 6, 5)[:1], _meta(1, 8, 1, 6, 5, channels_last=True)[:, :, :1].expand(1, 8, 2, 6, 5)),
    lambda: (_meta(4, 6).t(), _meta(4, 6).t()),  # dense, transposed
    lambda: (_meta(4, 6)[:, :3], _meta(4, 6)[:, :3]),  # not dense: half precision is laid out densely first
    lambda: (_meta(4, 6, dtype=torch.float32)[:, :3], _meta(4, 6, dtype=torch.float32)[:, :3]),
    lambda: (_meta(1, 8, 2, 6, 5), _meta(1, 8, 2, 6, 5, channels_last=True)),  # two layouts
    lambda: (_meta(2, 1, 4), _meta(2, 3, 4)),  # broadcast
    lambda: (_meta(8, 1, 1), _meta(2, 8, 6, 5, channels_last=True)),  # a bias against channels-last
    lambda: (_meta(3, 3, dtype=torch.int32), _meta(3, 3, dtype=torch.int32)),
    lambda: (_meta(3, 3), 2.5),  # a plain number
], ids=["contiguous", "channels-last", "one-channel", "expanded", "transposed", "gappy", "gappy-fp32", "mixed",
        "broadcast", "bias", "int", "number"])
def test_an_elementwise_op_is_answered_as_its_kernel_answers(func, make):
    args = make()
    ours = meta_ops.run_op(func, args, {})
    _same(ours, func(*make()))
    answered = meta_ops._pointwise_output(func, args, {})
    integer_division = func is aten.div.Tensor and not args[0].dtype.is_floating_point
    assert (answered is None) == integer_division  # true division of integers promotes: the kernel's business
    if func in (aten.add.Tensor, aten.sub.Tensor):
        _same(meta_ops.run_op(func, args, {"alpha": 2}), func(*make(), alpha=2))


def _random_tensor(rng: random.Random, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    """A meta tensor of `shape` in one of the layouts a pass makes: contiguous, channels-last, permuted, sliced
    (a band or every other element), expanded from size 1, or with odd strides on its size-1 dimensions."""
    kind = rng.choice(["contiguous", "channels-last", "permuted", "sliced", "expanded", "odd size-1"])
    if kind == "channels-last" and len(shape) in (4, 5):
        return _meta(*shape, dtype=dtype, channels_last=True)
    if kind == "permuted" and len(shape) > 1:
        order = list(range(len(shape)))
        rng.shuffle(order)
        return _meta(*[shape[i] for i in order], dtype=dtype).permute([order.index(i) for i in range(len(shape))])
    if kind == "sliced" and shape:
        d = rng.randrange(len(shape))
        bigger = _meta(*shape[:d], 2 * shape[d], *shape[d + 1:], dtype=dtype)
        every_other = bigger[(slice(None),) * d + (slice(None, None, 2),)]
        return bigger.narrow(d, 0, shape[d]) if rng.random() < 0.5 else every_other
    if kind == "expanded" and shape:
        d = rng.randrange(len(shape))
        return _meta(*shape[:d], 1, *shape[d + 1:], dtype=dtype).expand(shape)
    t = _meta(*shape, dtype=dtype)
    if kind == "odd size-1" and 1 in shape:
        strides = list(t.stride())
        strides[shape.index(1)] = rng.randint(1, 50)
        return t.as_strided(shape, strides)
    return t


def _random_shape(rng: random.Random, rank: int) -> list[int]:
    return [rng.choice([1, 1, 2, 3, 4, 5]) for _ in range(rank)]


def _random_calls(seed: int, count: int):
    """(name, op, args[, kwargs]) for `count` random calls of every answered op but the convs and linear (tested above)."""
    rng = random.Random(seed)
    for _ in range(count):
        for func in meta_ops.POINTWISE:
            dtype = rng.choice([torch.float32, torch.bfloat16, torch.int64])
            rank = rng.randint(0, 5)
            shape = _random_shape(rng, rank)
            a = _random_tensor(rng, shape, dtype)
            if func in (aten.exp.default, aten.neg.default):
                yield str(func), func, (a,)
            elif func in (aten.remainder.Scalar, aten.clamp_min.default) or (
                    func not in (aten.maximum.default, aten.minimum.default, aten.remainder.Tensor)
                    and rng.random() < 0.25):
                yield str(func), func, (a, rng.choice([2, 3.5, True]))
            else:  # a second tensor of a shape that broadcasts with the first, in either order
                tail = rng.randint(0, rank)
                b = _random_tensor(rng, [rng.choice([1, s]) for s in shape[rank - tail:]], dtype)
                yield str(func), func, ((a, b) if rng.random() < 0.5 else (b, a))
        for func, functional in meta_ops.POINTWISE_OUT.items():  # into an `out` of the result's shape, or not
            dtype = rng.choice([torch.float32, torch.bfloat16, torch.int64])
            rank = rng.randint(0, 4)
            shape = _random_shape(rng, rank)
            a, b = _random_tensor(rng, shape, dtype), _random_tensor(rng, [rng.choice([1, s]) for s in shape], dtype)
            out_shape = shape if rng.random() < 0.8 else [*shape, 2]
            out = a if rng.random() < 0.2 else _random_tensor(rng, out_shape, rng.choice([dtype, dtype, torch.float64]))
            yield str(func), func, (a, b), {"out": out}
        dtype = rng.choice([torch.float32, torch.bfloat16])
        rank = rng.randint(1, 5)
        shape, dim = _random_shape(rng, rank), rng.randrange(-rank, rank)
        parts = [_random_tensor(rng, [*shape[:dim % rank], rng.randint(0, 4), *shape[dim % rank + 1:]], dtype)
                 for _ in range(rng.randint(1, 3))]
        yield "cat", aten.cat.default, (parts, dim)
        rank = rng.randint(1, 6)
        shape = _random_shape(rng, rank)
        dims = list({d % rank: d for d in rng.sample(range(-rank, rank), rng.randint(1, rank))}.values())
        yield "mean", aten.mean.dim, (_random_tensor(rng, shape, dtype), dims, rng.random() < 0.5)
        x = _random_tensor(rng, shape, dtype)
        order = rng.choice([2, 2, 1, 3.0, 0.5])
        yield "linalg_vector_norm", aten.linalg_vector_norm.default, (x, order, dims, rng.random() < 0.5)
        m, k, n = (rng.randint(1, 6) for _ in range(3))
        bias = _random_tensor(rng, rng.choice([[n], [1, n], [m, n], [m, 1], [1]]), dtype)
        m1, m2 = _random_tensor(rng, [m, k], dtype), _random_tensor(rng, [k, n], dtype)
        yield "addmm", aten.addmm.default, (bias, m1, m2)
        x = _random_tensor(rng, [rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 9), rng.randint(1, 9)], dtype)
        kernel, dilation = [rng.randint(1, 3), rng.randint(1, 3)], [rng.randint(1, 2)] * 2
        padding, stride = [rng.randint(0, 1), rng.randint(0, 2)], [rng.randint(1, 2), rng.randint(1, 3)]
        yield "im2col", aten.im2col.default, (x, kernel, dilation, padding, stride)
        rank = rng.randint(2, 5)
        shape, groups = _random_shape(rng, rank), rng.choice([1, 2])
        shape[1] = groups * rng.randint(1, 3)
        weight = _meta(shape[1], dtype=dtype) if rng.random() < 0.8 else None
        yield "group_norm", aten.group_norm.default, (_random_tensor(rng, shape, dtype), groups, weight, weight, 1e-6)


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized:UserWarning")  # out= of a shape
def test_every_answer_equals_its_meta_kernel_over_random_shapes_and_layouts():
    """Broadcasting, half precision laid out densely first, size-1 dimensions with odd strides, empty inputs to
    `cat`, kept dimensions of `mean`: wherever a rule answers, the answer is the kernel's tensor; where the kernel
    raises, the call raises. Most calls are answered (the rules are not left unused)."""
    answered, calls = {}, {}
    for name, func, args, *options in _random_calls(seed=2026, count=150):
        kwargs = options[0] if options else {}
        calls[name] = calls.get(name, 0) + 1
        try:
            theirs = func(*args, **kwargs)
        except RuntimeError:
            with pytest.raises(RuntimeError):
                meta_ops.run_op(func, args, kwargs)
            continue
        ours = meta_ops._OUTPUTS[meta_ops._answer(func)](func, args, kwargs)
        if ours is not None:
            answered[name] = answered.get(name, 0) + 1
            _same(ours, theirs)
            assert "out" not in kwargs or ours is kwargs["out"]
        _same(meta_ops.run_op(func, args, kwargs), theirs)
    for name, n in calls.items():
        assert answered.get(name, 0) > n // 4, (name, answered.get(name, 0), n)


def test_a_group_norm_of_a_frame_of_a_clip_is_answered_and_one_value_per_channel_is_left_to_its_kernel():
    """A frame of a clip (a band view of a CPU plan's reference norm: batch of 1, channels strided by the clip's
    frames) is answered; where each channel holds one value and its size-1 dimensions have odd strides, the meta
    kernel's output carries them and the rule leaves the call to it."""
    frame = _meta(1, 8, 2, 6, 5, dtype=torch.float32)[:, :, 1]
    args = (frame, 2, None, None, 1e-6)
    assert meta_ops._group_norm_output(aten.group_norm.default, args, {}) is not None
    _same(meta_ops.run_op(aten.group_norm.default, args, {}), aten.group_norm.default(*args))
    single = _meta(2, 8, 1, dtype=torch.float32).as_strided((2, 8, 1), (8, 1, 999))
    args = (single, 2, None, None, 1e-6)
    assert meta_ops._group_norm_output(aten.group_norm.default, args, {}) is None
    assert aten.group_norm.default(*args).stride() != (8, 1, 1)  # what a contiguous answer would have got wrong
    _same(meta_ops.run_op(aten.group_norm.default, args, {}), aten.group_norm.default(*args))


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


_PLANS_WITHOUT_DYNAMO = r"""
import runpy, sys
from turbovae.bench.plans_table import TARGETS, budget_bytes, pixel_shape
from turbovae.vae.plan_pass import plan_pass
GB = 2**30
rows = [("seedvr2", True, 0), ("seedvr2", False, 0), ("seedvr2", True, 3), ("seedvr2", False, 7),
        ("wan2.2", True, 1), ("wan2.2", False, 1), ("qwen_image", True, 5), ("qwen_image", False, 5)]
for key, decode, t in rows:
    target = TARGETS[t]
    plan_pass(key, pixel_shape(key, target), decode=decode, dtype="bf16", device_type="cuda",
              budget_bytes=budget_bytes(target), host_budget_bytes=int(target.host_gb * GB))
plan_pass("qwen_image", (1, 16, 5, 90, 160), decode=True, dtype="fp16", device_type="cuda", mode="fast",
          budget_bytes=4 * GB)
plan_pass("wan2.2", (1, 48, 5, 45, 80), decode=True, dtype="fp32", device_type="cuda", budget_bytes=GB)
# CPU targets: the reference norms (group norm of a frame or band, RMS norm with its out= division)
for key, shape, decode, budget in [("seedvr2", (1, 16, 3, 32, 48), True, None), ("seedvr2", (1, 3, 5, 256, 384), False, GB),
                                   ("qwen_image", (1, 16, 21, 90, 160), True, None),
                                   ("wan2.2", (1, 3, 81, 720, 1280), False, 2 * GB)]:
    plan_pass(key, shape, decode=decode, dtype="fp32", device_type="cpu", budget_bytes=budget,
              host_budget_bytes=24 * GB)
sys.argv = ["turbovae", "plan", "seedvr2", "--shape", "1x16x21x90x160", "--budget-mb", "4096"]
try:
    runpy.run_module("turbovae", run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
print("torch._dynamo imported:", "torch._dynamo" in sys.modules)
"""


def test_planning_imports_no_dynamo():
    """Planning runs no meta kernel PyTorch implements in Python behind its Dynamo-disable decorator, whose first
    call imports `torch._dynamo` (most of a fresh `python -m turbovae plan`'s planning time, docs/memory.md): every
    family, decode and encode, the upscaler sizes and plans table's rows, bf16, fp16 and fp32, exact and fast, CPU
    targets too, and the command itself, in a fresh process."""
    done = subprocess.run([sys.executable, "-c", _PLANS_WITHOUT_DYNAMO], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch._dynamo imported: False" in done.stdout, done.stdout[-2000:]


def test_calls_the_kernel_refuses_are_refused_not_answered():
    """Where an op's arguments are wrong (a dimension named twice, shapes that do not broadcast or concatenate), the
    kernel's error reaches the caller: no rule answers for it."""
    x = _meta(2, 3, 4, dtype=torch.float32)
    for func, args in [(aten.mean.dim, (x, [1, -2])), (aten.add.Tensor, (x, _meta(5, 4, dtype=torch.float32))),
                       (aten.cat.default, ([x, _meta(2, 5, 5, dtype=torch.float32)], 1)),
                       (aten.neg.default, (x, x))]:
        with pytest.raises((RuntimeError, TypeError)):
            meta_ops.run_op(func, args, {})
