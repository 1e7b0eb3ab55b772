"""Guard against the torch 2.9 bf16/fp16 conv3d regression.

torch 2.9.0 stopped sending bf16/fp16 conv3d to cuDNN (a wrong-results bypass for old cuDNN,
pytorch #163539) and falls back to vol2col: ~17x the memory and many times slower (pytorch #166643,
nvidia-cosmos/cosmos-transfer2.5 PR #227). 2.9.1 re-enables cuDNN only when the loaded cuDNN is
>= 9.15 (pytorch #166643 comments, #177406); 2.10 ships cuDNN 9.15.1. Both VAEs are conv3d-bound, so
on an affected install we route around the fallback ourselves:

- ``cudnn``: call cuDNN explicitly (`torch.cudnn_convolution`) when the cuDNN is new enough not to
  have the wrong-results bug the bypass was for (>= 9.13 per #163539; unverified beyond that thread);
- ``conv2d``: otherwise, a conv with a single output frame (images) is computed exactly as the sum
  of k_t conv2d calls (cuDNN conv2d is unaffected), and
- ``fp32``: anything else runs that conv in fp32 (correct and on cuDNN; twice the bytes).

`choose_conv3d_route` is a pure function of (torch version, cuDNN version, dtype, device) so the
policy is testable without a GPU; `conv3d` applies it and logs the choice once per process.

On the CPU, `conv3d` also calls oneDNN where PyTorch would run its 3-D im2col kernel on an fp32 conv
(vae/memory/cpu_conv.py `onednn_instead` says when and why: the bands and tiles of exact passes), except while
tracing: an exported graph keeps `aten.conv3d`, which runs where the program is loaded.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

from .. import self_checks
from ...memory.cpu_conv import onednn_instead, pytorch_backend
from ...memory.oom import is_out_of_memory
from ...tracing import tracing

log = logging.getLogger("turbovae")

CUDNN_FIXED = 91500      # cuDNN 9.15.0: torch >= 2.9.1 uses cuDNN for half conv3d again
CUDNN_CORRECT = 91300    # cuDNN 9.13.0: no known half conv3d wrong-results bug (#163539)
ROUTES = ("native", "cudnn", "conv2d", "fp32")
CHECKED_ROUTES = ("cudnn", "conv2d")  # the fast routes; "fp32" is their fallback, "native" plain F.conv3d

IntOr3 = Union[int, Sequence[int]]


@dataclass(frozen=True)
class Conv3dRoute:
    """How half-precision conv3d is executed on this install, and why."""

    route: str  # one of ROUTES; "conv2d" means conv2d for single-output-frame convs, fp32 otherwise
    reason: str

    @property
    def affected(self) -> bool:
        return self.route != "native"


def parse_torch_version(version: str) -> tuple[int, int, int]:
    """'2.9.1+cu128' / '2.10.0a0+git…' -> (2, 9, 1)."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if not m:
        raise ValueError(f"cannot parse torch version {version!r}; expected e.g. '2.9.1+cu128'")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def cudnn_version_str(version: Optional[int]) -> str:
    if version is None:
        return "none"
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


def choose_conv3d_route(torch_version: str, cudnn_version: Optional[int], dtype: torch.dtype,
                        device_type: str = "cuda") -> Conv3dRoute:
    """The conv3d route for one (torch, cuDNN, dtype, device) combination; no side effects."""
    if device_type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return Conv3dRoute("native", f"{device_type}/{dtype} conv3d is not affected")
    tv = parse_torch_version(torch_version)
    cud = cudnn_version_str(cudnn_version)
    if tv < (2, 9, 0):
        return Conv3dRoute("native", f"torch {torch_version} predates the 2.9 conv3d regression")
    if cudnn_version is None:
        return Conv3dRoute("fp32", f"torch {torch_version} without cuDNN: half conv3d has no fast path")
    if tv >= (2, 9, 1) and cudnn_version >= CUDNN_FIXED:
        return Conv3dRoute("native", f"torch {torch_version} with cuDNN {cud} uses cuDNN for half conv3d")
    why = (f"torch {torch_version} routes {str(dtype).removeprefix('torch.')} conv3d to vol2col"
           + ("" if tv == (2, 9, 0) else f" with cuDNN {cud} < 9.15"))
    if cudnn_version >= CUDNN_CORRECT:
        return Conv3dRoute("cudnn", f"{why}; calling cuDNN {cud} directly")
    return Conv3dRoute("conv2d", f"{why}; cuDNN {cud} < 9.13 has a half conv3d correctness bug, so single-frame "
                                 "convs run as exact conv2d sums and the rest in fp32")


_LOGGED: set[str] = set()


def current_route(dtype: torch.dtype, device_type: str = "cuda") -> Conv3dRoute:
    cudnn = torch.backends.cudnn.version() if device_type == "cuda" and torch.backends.cudnn.is_available() else None
    return choose_conv3d_route(torch.__version__, cudnn, dtype, device_type)


def _triple(v: IntOr3) -> tuple[int, int, int]:
    return (v, v, v) if isinstance(v, int) else tuple(v)  # type: ignore[return-value]


def conv3d_as_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: IntOr3 = 1,
                     padding: IntOr3 = 0, dilation: IntOr3 = 1, groups: int = 1) -> torch.Tensor:
    """conv3d as a sum over the k_t temporal taps of conv2d on frames folded into the batch.

    Exact (up to summation order): the taps are accumulated in fp32 and rounded once. Used for
    single-output-frame convs, where it costs k_t conv2d calls on one frame each.
    """
    st, sh, sw = _triple(stride)
    pt, ph, pw = _triple(padding)
    dt, dh, dw = _triple(dilation)
    if pt:
        x = F.pad(x, (0, 0, 0, 0, pt, pt))
    b, c, t, h, w = x.shape
    kt = weight.shape[2]
    t_out = (t - dt * (kt - 1) - 1) // st + 1
    if t_out < 1:
        raise ValueError(f"conv3d input has {t} frames (after padding) for a temporal kernel of {kt}")
    acc = None
    for k in range(kt):
        start = k * dt
        frames = x[:, :, start:start + (t_out - 1) * st + 1:st]
        frames = frames.transpose(1, 2).reshape(b * t_out, c, h, w)
        y = F.conv2d(frames, weight[:, :, k], None, (sh, sw), (ph, pw), (dh, dw), groups).float()
        acc = y if acc is None else acc.add_(y)
    if bias is not None:
        acc = acc + bias.float().view(1, -1, 1, 1)
    out = acc.to(x.dtype)
    return out.view(b, t_out, *out.shape[1:]).transpose(1, 2)


def conv3d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, stride: IntOr3 = 1,
           padding: IntOr3 = 0, dilation: IntOr3 = 1, groups: int = 1,
           route: Optional[Conv3dRoute] = None) -> torch.Tensor:
    """`F.conv3d` with the regression guard applied (a plain F.conv3d where the install is unaffected); on the
    CPU, oneDNN where PyTorch would run its im2col kernel (module docstring)."""
    if route is None:
        route = current_route(x.dtype, x.device.type)
    if route.route == "native":
        if x.device.type == "cpu" and not isinstance(padding, str) and not tracing():
            s, p, d = _triple(stride), _triple(padding), _triple(dilation)
            if onednn_instead(pytorch_backend(x, weight, s, p, d, groups), weight.ndim, x.dtype, False, groups):
                return torch.ops.aten.mkldnn_convolution(x, weight, bias, p, s, d, groups)
        return F.conv3d(x, weight, bias, stride, padding, dilation, groups)
    if route.reason not in _LOGGED:
        _LOGGED.add(route.reason)
        log.info("turbovae conv3d guard: %s", route.reason)
    if route.route in CHECKED_ROUTES:
        # Under a tracer _route_trusted runs no probe: the route is traced where it was already checked on this
        # device, and fp32 conv3d (always right) is traced while it is undecided.
        args = (stride, padding, dilation, groups)
        if _route_trusted(route, x, weight, bias, *args):
            if tracing():
                return _routed(route, x, weight, bias, *args)
            try:
                out = _routed(route, x, weight, bias, *args)
            except Exception as exc:  # noqa: BLE001 - the route is switched off; fp32 conv3d is always right
                if is_out_of_memory(exc):  # transient: the route is kept, the pass retries by the tiler's rule
                    self_checks.out_of_memory("conv3d_route", x.device, exc)
                    raise
                self_checks.fail("conv3d_route", x.device, exc)
            else:
                self_checks.used("conv3d_route", x.device)
                return out
    return _fp32_conv3d(x, weight, bias, stride, padding, dilation, groups)


def _routed(route: Conv3dRoute, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
            stride: IntOr3, padding: IntOr3, dilation: IntOr3, groups: int) -> torch.Tensor:
    if route.route == "cudnn":
        y = torch.cudnn_convolution(x, weight, list(_triple(padding)), list(_triple(stride)),
                                    list(_triple(dilation)), groups, torch.backends.cudnn.benchmark,
                                    torch.backends.cudnn.deterministic, False)
        return y if bias is None else y + bias.view(1, -1, 1, 1, 1)
    if route.route == "conv2d" and _single_output_frame(x, weight, stride, padding, dilation):
        return conv3d_as_conv2d(x, weight, bias, stride, padding, dilation, groups)
    return _fp32_conv3d(x, weight, bias, stride, padding, dilation, groups)


def _fp32_conv3d(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: IntOr3,
                 padding: IntOr3, dilation: IntOr3, groups: int) -> torch.Tensor:
    y = F.conv3d(x.float(), weight.float(), bias.float() if bias is not None else None, stride, padding,
                 dilation, groups)
    return y.to(x.dtype)


def _route_trusted(route: Conv3dRoute, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                   stride: IntOr3, padding: IntOr3, dilation: IntOr3, groups: int) -> bool:
    """The route's self-check (vae/accel/self_checks): the routed conv against fp32 conv3d on a few pixels of `x`,
    once per (device, dtype, route, single-frame or not, kernel, stride)."""
    single = _single_output_frame(x, weight, stride, padding, dilation)
    kt, kh, kw = weight.shape[2:]
    (st, sh, sw), (dt, dh, dw) = _triple(stride), _triple(dilation)
    frames = x.shape[2] if single else min(x.shape[2], (kt - 1) * dt + 1 + st)
    h, w = min(x.shape[3], max(8, (kh - 1) * dh + 1 + sh)), min(x.shape[4], max(8, (kw - 1) * dw + 1 + sw))
    probe = lambda: x[:1, :, :frames, :h, :w].contiguous()  # noqa: E731
    args = (stride, padding, dilation, groups)
    key = (f"{str(x.dtype).removeprefix('torch.')} route={route.route} single_frame={single} "
           f"kernel={tuple(weight.shape[2:])} stride={_triple(stride)}")
    return self_checks.check("conv3d_route", x.device, key, lambda: _routed(route, probe(), weight, bias, *args),
                            lambda: _fp32_conv3d(probe(), weight, bias, *args))


def _single_output_frame(x: torch.Tensor, weight: torch.Tensor, stride: IntOr3, padding: IntOr3,
                         dilation: IntOr3) -> bool:
    st, pt, dt = _triple(stride)[0], _triple(padding)[0], _triple(dilation)[0]
    return (x.shape[2] + 2 * pt - dt * (weight.shape[2] - 1) - 1) // st + 1 == 1
