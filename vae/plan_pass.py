"""`plan_pass`: the plan a pass would run and what it will need, for a family or a checkpoint and a clip of any
length, without running anything heavy (`python -m turbovae plan` prints it).

Why: a user deciding whether a 720p clip decode fits their card, or a node deciding how much ComfyUI must free,
should know before minutes of sampling; the model's pass on meta tensors answers it in seconds on any machine.
"""

from __future__ import annotations

import os
import re
from typing import Optional, Sequence, Union

import torch

from .base import VAEModel
from .dtypes import parse_dtype
from .input_rules import check_mode, pass_shape
from .memory.budget import DEFAULT_PASS_BUDGET_BYTES, default_budget_bytes, default_host_budget_bytes
from .planning.meta_pass import MetaPasses, PassPaths
from .planning import PassPlan, PlanRequest
from .planning.search import fastest_fitting_plan


class PlanError(ValueError):
    """A plan request that cannot be answered: unknown family, malformed shape, sizes the VAE cannot take."""


def family_names() -> tuple[str, ...]:
    """The names `plan` takes for a family: every registered family's key and aliases (vae/registry.py)."""
    from .registry import families

    return tuple(name for fam in families() for name in fam.names)


def meta_model(source: Union[str, os.PathLike, VAEModel]) -> VAEModel:
    """The architecture of a registered family's real config (`family_names()`) or of a checkpoint (loaded once on
    the CPU, its config kept), on the meta device: no weights in memory."""
    from .registry import UnknownFamily, family

    if isinstance(source, VAEModel):
        return source if source.device.type == "meta" else source.meta_copy()
    try:
        return family(str(source)).meta_model(real=True)  # the registry matches "Wan-2.1" or "wan21" to "wan2.1"
    except UnknownFamily:
        pass
    if os.path.exists(source):
        from .loader import load_checkpoint

        return load_checkpoint(source, dtype=torch.float32, device="cpu").model.meta_copy()
    raise PlanError(f"{source!r} is neither a family or a checkpoint: use one of {', '.join(family_names())}, or the "
                    "path of a VAE checkpoint file or diffusers folder")


def parse_shape(shape: Union[str, Sequence[int]]) -> Union[str, Sequence[int]]:
    """'1x16x21x90x160' -> (1, 16, 21, 90, 160) (a sequence as it is; the rules of a valid shape are
    vae/input_rules.py's); PlanError for a string that is not a list of integers."""
    if not isinstance(shape, str):
        return shape
    try:
        return tuple(int(p) for p in re.split(r"[x×, ]+", shape.strip()) if p)
    except ValueError:
        raise PlanError(f"shape {shape!r} is not a list of integers; write it as BxCxTxHxW, e.g. 1x16x21x90x160") \
            from None


def plan_pass(source: Union[str, os.PathLike, VAEModel], shape: Union[str, Sequence[int]], *, decode: bool,
              dtype: Union[None, str, torch.dtype] = None, device_type: str = "cuda",
              budget_bytes: Optional[int] = None, mode: str = "auto", copies: Optional[MetaPasses] = None,
              host_memory: Optional[bool] = None, host_budget_bytes: Optional[int] = None) -> PassPlan:
    """The plan a pass would run under `budget_bytes` (vae/planning/search.py `fastest_fitting_plan`): what runs
    (untiled, temporal slices, exact tiles, frame stages, host memory), its predicted peak and expected time.

    `source`: a family (`family_names()`) or a checkpoint. `shape`: latents [B, C, T, h, w] or pixels [B, I, T, H, W]
    (for decode, pixels are turned into their latents; for encode, latents into their pixels; clips are padded to
    1+4n frames as the public path pads). `dtype` default bf16 on CUDA, fp32 elsewhere. `device_type`: the device
    the pass would run on (its default paths: fused norms on CUDA where Triton is installed). `mode`: "auto" (any
    exact plan, untiled where it fits), "exact" or "fast" (tiles of that kind, of the size the planner chooses;
    one tile may cover the frame). `budget_bytes`
    default: the default budget on this machine's device of that type, or DEFAULT_PASS_BUDGET_BYTES for a device
    this machine lacks. `host_memory`: whether the plan may keep caches and output in host memory (default: where
    host memory is apart from the device's, i.e. not on the CPU); `host_budget_bytes`: how much (default: this
    machine's RAM available now less a margin, `default_host_budget_bytes`). Nothing fits: BudgetTooSmall, naming
    the smallest budget that works."""
    model = meta_model(source)
    fmt = model.latent_format
    check_mode(mode, PlanError)
    dims = parse_shape(shape)
    try:
        channels = int(dims[1])
    except (TypeError, ValueError, IndexError):
        channels = fmt.channels  # the rules name what is wrong with it
    if channels not in (fmt.channels, fmt.image_channels):
        raise PlanError(f"shape {tuple(dims)}: {channels} channels is neither the latents' ({fmt.channels}) nor the "
                        f"pixels' ({fmt.image_channels}) of a {model.kind} VAE")
    given = pass_shape(dims, fmt, model.kind, decode=channels == fmt.channels, pad=True, error=PlanError)
    b, _c, t, h, w = x_shape = given.dims
    f = fmt.spatial_factor
    if given.decode and not decode:  # latents: the pixels they decode to
        x_shape = (b, fmt.image_channels, fmt.pixel_frames(t), h * f, w * f)
    elif decode and not given.decode:  # pixels: their latents
        x_shape = (b, fmt.channels, fmt.latent_frames(t), h // f, w // f)
    try:
        resolved = parse_dtype(dtype) or (torch.bfloat16 if device_type == "cuda" else torch.float32)
    except ValueError as e:
        raise PlanError(str(e)) from None
    if budget_bytes is None:
        have = torch.cuda.is_available() if device_type == "cuda" else device_type == "cpu"
        budget_bytes = default_budget_bytes(device_type) if have else DEFAULT_PASS_BUDGET_BYTES
    separate = device_type != "cpu"
    # exact or fast tiles of the size the planner chooses (tile_px 0), as in auto mode: not only the default tile
    request = PlanRequest(mode=mode, tile_px=None if mode == "auto" else 0,
                          allow_host=separate if host_memory is None else host_memory,
                          host_is_separate=True if host_memory else None)
    if host_budget_bytes is None:
        host_budget_bytes = default_host_budget_bytes()
    return fastest_fitting_plan(model, x_shape, decode=decode, budget_bytes=int(budget_bytes),
                                paths=PassPaths.for_device_type(model, device_type, resolved), dtype=resolved, request=request,
                                copies=copies or MetaPasses(model), host_budget_bytes=int(host_budget_bytes))


def plan_dict(plan: PassPlan) -> dict:
    """The plan as plain JSON-ready values (MB = 2**20 bytes)."""
    mb = 2 ** 20
    p = plan.predicted
    return {"shape": list(plan.shape), "decode": plan.decode, "dtype": str(plan.dtype).removeprefix("torch."),
            "device_type": plan.device_type, "mode": plan.mode, "exact": plan.exact,
            "temporal_slice": plan.temporal_slice, "tile_px": plan.tile_px, "tiles": plan.tiles,
            "frame_stages": plan.frame_stages, "cache_on_host": plan.cache_on_host,
            "output_on_host": plan.output_on_host, "layout": plan.layout(),
            "pass_mb": round(p.pass_bytes / mb, 1), "host_mb": round(p.host_bytes / mb, 1),
            "frames_on_host": plan.frames_on_host,
            "weights_mb": round(p.weight_bytes / mb, 1), "input_mb": round(p.input_bytes / mb, 1),
            "total_mb": round(p.total_bytes / mb, 1), "budget_mb": round(plan.budget_bytes / mb, 1),
            "expected_s": round(plan.cost_s, 3) if plan.cost_s is not None else None, "fits": plan.fits}
