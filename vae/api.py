"""The public VAE object: input checks, clip-length policy, dtype/device handling, sampling.

Architectures (vae/seedvr2, vae/wan) only see validated tensors; everything a user can get wrong is
caught at a pass's entry with a `ValueError` that names the fix, once (the rules: vae/input_rules.py).
Loading a checkpoint into one is vae/loader.py.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import replace
from typing import Callable, Optional, Union

import torch

from .base import LatentFormat, Progress, VAEModel
from .checkpoint import StateDict
from .accel.cuda_graphs import CudaGraphRunner
from .dtypes import parse_dtype
from .input_rules import PassShape, TilingArgs, check_mode, check_temporal_slice, pass_shape, pass_tensor
from .accel.weight_layout import checkpoint_layout
from .memory.device import check_fits, process_rss_bytes
from .memory.budget import MemoryBudget
from .memory.peak import PeakPrediction
from .planning import PassPlan, PlanRequest, fastest_fitting_plan, run_plan
from .planning.meta_pass import MetaPasses, PassPaths

log = logging.getLogger("turbovae")

LOGVAR_CLAMP = (-30.0, 20.0)


class TurboVAE:
    """A loaded VAE. `encode` returns raw posterior-mean latents, `decode` returns pixels in [-1, 1].

    Pixels are [B, I, T, H, W] (or [B, I, H, W] for images; the output then has the same rank) with
    I = `image_channels` (3 RGB; 4 RGBA for the Qwen-Image-Layered VAE, alpha last),
    latents [B, C, T', H/f, W/f]. Outputs are on the model's device in the model's dtype.

    Clip length policy: a clip of T frames with T != 4n+1 is padded at the end by repeating its last
    frame up to the next 4n+1 (what the official SeedVR2 script does), so no frame is dropped; its
    latents decode to that padded length, and `decode(..., num_frames=T)` trims the result back.
    """

    def __init__(self, model: VAEModel, source: Optional[str] = None):
        self.model = model.eval().requires_grad_(False)
        self.source = source
        self._graphs: dict[bool, CudaGraphRunner] = {}  # decode? -> runner, once use_cuda_graphs() opts in
        self.budget = MemoryBudget()  # what automatic temporal slices may use (vae/memory/budget.py)
        self._meta_passes: Optional[MetaPasses] = None  # meta copies and predictions, made on first use

    # -- descriptive ---------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return self.model.kind

    @property
    def latent_format(self) -> LatentFormat:
        return self.model.latent_format

    @property
    def latent_channels(self) -> int:
        return self.latent_format.channels

    @property
    def image_channels(self) -> int:
        """Channels of the pixels this VAE reads and writes: 3 (RGB), 4 (RGBA, Qwen-Image-Layered)."""
        return self.latent_format.image_channels

    @property
    def spatial_factor(self) -> int:
        return self.latent_format.spatial_factor

    @property
    def temporal_factor(self) -> int:
        return self.latent_format.temporal_factor

    @property
    def scaling_factor(self) -> float:
        return self.latent_format.scaling_factor

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def device(self) -> torch.device:
        return self.model.device

    def to(self, device: Union[None, str, torch.device] = None, dtype: Union[None, str, torch.dtype] = None,
           non_blocking: bool = False) -> "TurboVAE":
        self.model.to(device=device, dtype=parse_dtype(dtype), non_blocking=non_blocking)
        for runner in self._graphs.values():
            runner.invalidate()
        return self

    # -- CUDA graphs -----------------------------------------------------------------------------
    def use_cuda_graphs(self, max_graphs: int = 4) -> None:
        """Opt in to CUDA graphs for whole encode/decode passes (0 opts out).

        Why opt-in: a graph removes the launch gaps of thousands of small kernels, but keeps its
        activation pool allocated and serves one input geometry each; at most `max_graphs` are kept
        per direction (one shared pool). Graphs are dropped when the weights move (ComfyUI offloading
        included); off CUDA, and after a failed capture, passes run eagerly.
        """
        for runner in self._graphs.values():
            runner.invalidate()
        self._graphs = {}
        if max_graphs:
            self._graphs = {decode: CudaGraphRunner(self._eager_pass(decode), max_graphs=max_graphs,
                                                    state_key=self._weights_key)
                            for decode in (True, False)}

    def _weights_key(self) -> tuple:
        """Where the weights live (every parameter's address, device and dtype): what a captured graph
        read them from. A few hundred integers per pass; a stale graph would read freed memory."""
        params = list(self.model.parameters())
        return (params[0].device, params[0].dtype, tuple(p.data_ptr() for p in params))

    def _eager_pass(self, decode: bool) -> Callable[..., torch.Tensor]:
        return self.model.decode_slices if decode else self.model.encode_slices  # input checked at the entry

    def graph_pool_bytes(self) -> int:
        """Device memory the captured CUDA graphs' private pools hold (0 without graphs): memory the
        caller's memory manager cannot see otherwise (the ComfyUI nodes count it in the model's size)."""
        return sum(runner.pool_bytes for runner in self._graphs.values())

    def release_graphs(self) -> None:
        """Drop the captured CUDA graphs and give their pools back (they are captured again on next use);
        the nodes call it when ComfyUI unloads the model."""
        for runner in self._graphs.values():
            runner.invalidate()

    def _model_pass(self, decode: bool, progress: Progress = None) -> Callable[..., torch.Tensor]:
        """The whole-pass callable: through the CUDA-graph runner once opted in, else the model's own.

        With `progress`, a pass of one step (one latent frame, or a temporal slice covering the clip) still
        replays its graph and reports (1, 1) after it; a pass of several slices runs eagerly, so progress
        and cancel come between slices (a graph replays the whole pass at once)."""
        runner = self._graphs.get(decode)
        if progress is None:
            return runner if runner is not None else self._eager_pass(decode)
        model_pass = self._eager_pass(decode)

        def with_progress(x: torch.Tensor, *, temporal_slice: Optional[int] = None) -> torch.Tensor:
            latents = x.shape[2] if decode else self.latent_format.latent_frames(x.shape[2])
            if runner is None or (latents > 1 and temporal_slice is not None and temporal_slice < latents - 1):
                return model_pass(x, progress=progress, temporal_slice=temporal_slice)
            out = runner(x, temporal_slice=temporal_slice)
            progress(1, 1)
            return out

        return with_progress

    def state_dict(self) -> StateDict:
        """The checkpoint's keys, shapes, values and layout (contiguous tensors, ready for safetensors).

        The model stores some weights in another memory layout (`vae/accel/weight_layout.py`); this returns
        contiguous copies of those, so it costs their size while the caller holds it. `model.state_dict()`
        returns the parameters themselves (same shapes and values, no copies)."""
        return checkpoint_layout(self.model.state_dict())

    def __repr__(self) -> str:
        return f"TurboVAE(kind={self.kind!r}, dtype={self.dtype}, device={self.device}, source={self.source!r})"

    # -- input checks (the rules: vae/input_rules.py) -------------------------------------------------
    def check_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """`pixels` checked as an encode's input and made 5-D (ValueError naming the fix)."""
        return pass_tensor(pixels, self.latent_format, self.kind, decode=False)

    def check_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """`latents` checked as a decode's input and made 5-D (ValueError naming the fix)."""
        return pass_tensor(latents, self.latent_format, self.kind, decode=True)

    def check_decoded_size(self, z: torch.Tensor, device: Optional[torch.device] = None) -> None:
        """InputTooLarge when the pixels of validated latents `z` could never fit on `device` (default: the
        model's), checked before the decode allocates anything."""
        b, _c, t, h, w = z.shape
        f = self.spatial_factor
        check_fits("the decoded pixels", (b, self.image_channels, self.latent_format.pixel_frames(t), h * f, w * f),
                   self.dtype, device if device is not None else self.device)

    def pad_frames(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pad a clip to 4n+1 frames by repeating the last frame (documented policy; never drops frames)."""
        t = pixels.shape[2]
        extra = self.latent_format.padded_frames(t) - t
        if extra == 0:
            return pixels
        tail = pixels[:, :, -1:].expand(-1, -1, extra, -1, -1)
        return torch.cat([pixels, tail], dim=2)

    def _prepare(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(device=self.device, dtype=self.dtype)

    def plan(self, shape: tuple[int, ...], *, decode: bool, mode: str = "auto", tile_px: Optional[int] = None,
             overlap_px: Optional[int] = None, temporal_slice: Optional[int] = None,
             budget_bytes: Optional[int] = None, device: Union[None, str, torch.device] = None,
             output_device: Union[None, str, torch.device] = None, allow_host: bool = True,
             max_temporal_slice: Optional[int] = None, host_budget_bytes: Optional[int] = None) -> PassPlan:
        """The plan of a pass over validated input `shape` (latents for decode, 1 + 4n-frame pixels for encode;
        5-D): the fastest way this VAE can run it whose predicted device peak fits `budget_bytes` (default
        `self.budget` on the pass's device) — untiled, temporal slices, exact tiles, frame stages, host memory
        (vae/planning). `mode`, `tile_px`, `overlap_px`, `temporal_slice`: what the caller fixed (`PlanRequest`);
        `device`: where the pass will run (default the model's; the nodes plan before ComfyUI loads the weights
        there); `output_device`: where the caller wants the output (a CPU output for a GPU pass is kept off the
        device as it is made); `allow_host`: whether the plan may keep caches and output in host memory;
        `max_temporal_slice`: at most that many latents per step (progress between steps); `host_budget_bytes`:
        what it may keep in host memory (default `self.budget`'s host side: the RAM available now less a margin;
        on a CPU pass host memory is the budgeted memory itself). BudgetTooSmall when no plan fits, naming the
        smallest budget that works."""
        checked = pass_shape(shape, self.latent_format, self.kind, decode=decode, pad=False)
        tiling = TilingArgs(check_mode(mode), tile_px, overlap_px, check_temporal_slice(temporal_slice))
        return self.plan_checked(checked, tiling, budget_bytes=budget_bytes, device=device, output_device=output_device,
                                 allow_host=allow_host, max_temporal_slice=max_temporal_slice,
                                 host_budget_bytes=host_budget_bytes)

    def plan_checked(self, shape: PassShape, tiling: TilingArgs = TilingArgs(), *, budget_bytes: Optional[int] = None,
                     device: Union[None, str, torch.device] = None,
                     output_device: Union[None, str, torch.device] = None, allow_host: bool = True,
                     max_temporal_slice: Optional[int] = None, host_budget_bytes: Optional[int] = None) -> PassPlan:
        """`plan` of an input and tiling arguments the input rules have passed (vae/input_rules.py: `pass_shape`,
        `tiling_args`, or a checked tensor's `PassShape.of`): for a pass that checks its input once at its entry
        (the API's passes, the tiled API, the nodes), so nothing is checked again."""
        dev = self.device if device is None else torch.device(device)
        budget = self.budget.resolve(dev) if budget_bytes is None else budget_bytes
        host_budget = None
        if dev.type != "cpu":
            host_budget = self.budget.resolve_host() if host_budget_bytes is None else host_budget_bytes
        on_host = None
        if output_device is not None:
            on_host = torch.device(output_device).type != dev.type
        request = PlanRequest(mode=tiling.mode, tile_px=tiling.tile_px, overlap_px=tiling.overlap_px,
                              temporal_slice=tiling.temporal_slice, max_temporal_slice=max_temporal_slice,
                              output_on_host=on_host, allow_host=allow_host)
        decode, dims = shape.decode, shape.dims

        def planned(pass_budget: int) -> PassPlan:
            return fastest_fitting_plan(self.model, dims, decode=decode, budget_bytes=max(1, pass_budget),
                                        paths=self._paths(dev), dtype=self.dtype, request=request, copies=self._meta(),
                                        host_budget_bytes=host_budget)

        if dev.type != "cpu":
            return planned(budget)
        # On the CPU the budget is the process's memory, which the planner itself uses too (meta copies, torch's
        # meta kernels loaded on a first plan): a plan fits beside what planning grew the process by, planned again
        # in the smaller budget where it does not (the headroom for memory outside PyTorch's allocator is the
        # planner's, `search.PREDICTED_SHARE`).
        before = process_rss_bytes()
        plan = planned(budget)
        grown = max(0, process_rss_bytes() - before) if before is not None else 0
        if grown and plan.predicted.pass_bytes + plan.predicted.host_bytes > budget - grown:
            plan = replace(planned(budget - grown), budget_bytes=budget)
        return plan

    def plan_temporal_slice(self, shape: tuple[int, ...], *, decode: bool, budget_bytes: Optional[int] = None,
                            device: Union[None, str, torch.device] = None) -> PassPlan:
        """Deprecated (one version): `plan(shape, decode=...)`, whose plan may also tile the frame or keep memory
        on the host; it keeps `temporal_slice`, `predicted`, `fits` and `describe()`."""
        warnings.warn("TurboVAE.plan_temporal_slice is deprecated: use TurboVAE.plan (a PassPlan: temporal "
                      "slice, tiles, frame stages, host memory)", DeprecationWarning, stacklevel=2)
        return self.plan(shape, decode=decode, budget_bytes=budget_bytes, device=device)

    def predict_peak(self, shape: tuple[int, ...], *, decode: bool, temporal_slice: Optional[int] = None,
                     device: Union[None, str, torch.device] = None) -> PeakPrediction:
        """The predicted peak of an untiled pass over validated input `shape` run `temporal_slice` latents per step
        (None: the whole clip) on `device` (default the model's): the model's pass on meta tensors
        (vae/planning/meta_pass.py), cached per shape."""
        dev = self.device if device is None else torch.device(device)
        return self._meta().predict(tuple(int(d) for d in shape), decode=decode, dtype=self.dtype,
                                    temporal_slice=temporal_slice, paths=self._paths(dev))

    def _meta(self) -> MetaPasses:
        if self._meta_passes is None:
            self._meta_passes = MetaPasses(self.model)
        return self._meta_passes

    def _paths(self, device: torch.device) -> PassPaths:
        return (PassPaths.of(self.model, self.device, self.dtype) if device == self.device
                else PassPaths.for_device_type(self.model, device.type, self.dtype))

    # -- passes --------------------------------------------------------------------------------
    def encode_moments(self, pixels: torch.Tensor, *, temporal_slice: Optional[int] = None,
                       progress: Progress = None, output_device: Union[None, str, torch.device] = None,
                       budget_bytes: Optional[int] = None, plan: Optional[PassPlan] = None) -> torch.Tensor:
        """Posterior moments [B, 2C, T', h, w] (mean ‖ log-variance) of a validated, padded clip, run as the plan
        for the budget (`plan`) takes it; on the model's device, or on `output_device` (where the plan may keep it
        off the device as it is made). `progress(done, total)` runs after each step; raising from it stops the
        pass (a cancel). `plan`: a `plan(...)` made for this input, run as it is."""
        check_temporal_slice(temporal_slice)
        return self._encode_checked(self.pad_frames(self.check_pixels(pixels)), plan, progress, output_device,
                                    temporal_slice, budget_bytes)

    def encode_checked(self, x: torch.Tensor, *, plan: PassPlan, progress: Progress = None,
                       output_device: Union[None, str, torch.device] = None) -> torch.Tensor:
        """`encode` (the posterior mean) of a 5-D clip that `check_pixels` has already passed and `pad_frames`
        padded, run as `plan` (made for `x`'s shape): for a caller that checks its input once before planning (the
        ComfyUI VAE, nodes/comfy_vae.py), so no pixel is checked twice."""
        return moments_to_latents(self._encode_checked(x, plan, progress, output_device, None, None))

    def _encode_checked(self, x: torch.Tensor, plan: Optional[PassPlan], progress: Progress, output_device,
                        temporal_slice: Optional[int], budget_bytes: Optional[int]) -> torch.Tensor:
        x = self._prepare(x)
        plan = self._given_or_new(plan, PassShape.of(x, decode=False), temporal_slice, output_device, budget_bytes)
        with torch.inference_mode():
            return self.run_encode(x, plan=plan, progress=progress, output_device=output_device)

    def encode(self, pixels: torch.Tensor, *, sample: bool = False, generator: Optional[torch.Generator] = None,
               temporal_slice: Optional[int] = None, progress: Progress = None,
               output_device: Union[None, str, torch.device] = None,
               budget_bytes: Optional[int] = None, plan: Optional[PassPlan] = None) -> torch.Tensor:
        """Raw latents: the posterior mean, or a posterior sample when `sample=True`; the rest as
        `encode_moments`."""
        squeeze = pixels.ndim == 4 if isinstance(pixels, torch.Tensor) else False
        moments = self.encode_moments(pixels, temporal_slice=temporal_slice, progress=progress,
                                      output_device=output_device, budget_bytes=budget_bytes, plan=plan)
        out = moments_to_latents(moments, sample=sample, generator=generator)
        return out.squeeze(2) if squeeze and out.shape[2] == 1 else out

    def decode(self, latents: torch.Tensor, *, temporal_slice: Optional[int] = None,
               num_frames: Optional[int] = None, progress: Progress = None,
               output_device: Union[None, str, torch.device] = None,
               budget_bytes: Optional[int] = None, plan: Optional[PassPlan] = None) -> torch.Tensor:
        """Pixels [B, I, 4(T'-1)+1, H, W], run as the plan for the budget (`plan`; `budget_bytes`, default
        `self.budget`) takes them: untiled when that fits, else exact tiles, frame stages or host memory — the same
        pixels; BudgetTooSmall when nothing fits. On the model's device, or on `output_device` (a GPU pass whose
        output does not fit beside it returns it in host memory). `num_frames` trims a padded clip back to its
        length. `progress(done, total)` runs after each step; raising from it stops the pass (a cancel). `plan`: a
        `plan(...)` made for these latents, run as it is."""
        check_temporal_slice(temporal_slice)
        squeeze = latents.ndim == 4 if isinstance(latents, torch.Tensor) else False
        out = self._decode_checked(self.check_latents(latents), plan, progress, output_device, temporal_slice,
                                   budget_bytes)
        if num_frames is not None:
            if num_frames < 1 or num_frames > out.shape[2]:
                raise ValueError(f"num_frames={num_frames} is outside 1..{out.shape[2]} decoded frames")
            out = out[:, :, :num_frames]
        return out.squeeze(2) if squeeze and out.shape[2] == 1 else out

    def decode_checked(self, z: torch.Tensor, *, plan: PassPlan, progress: Progress = None,
                       output_device: Union[None, str, torch.device] = None) -> torch.Tensor:
        """`decode` of 5-D latents that `check_latents` has already passed, run as `plan` (made for `z`'s shape):
        for a caller that checks a batch once and decodes it item by item (the ComfyUI VAE, nodes/comfy_vae.py),
        so no latent is checked twice. All decoded frames, no trimming."""
        return self._decode_checked(z, plan, progress, output_device, None, None)

    def _decode_checked(self, z: torch.Tensor, plan: Optional[PassPlan], progress: Progress, output_device,
                        temporal_slice: Optional[int], budget_bytes: Optional[int]) -> torch.Tensor:
        self.check_decoded_size(z, torch.device(output_device) if output_device is not None else None)
        z = self._prepare(z)
        plan = self._given_or_new(plan, PassShape.of(z, decode=True), temporal_slice, output_device, budget_bytes)
        with torch.inference_mode():
            return self.run_decode(z, plan=plan, progress=progress, output_device=output_device)

    def _given_or_new(self, plan: Optional[PassPlan], shape: PassShape, temporal_slice: Optional[int], output_device,
                      budget_bytes: Optional[int]) -> PassPlan:
        """The caller's plan, checked against the input (and alone: the arguments it replaces must not be given), or
        a new one for this input (checked once at the pass's entry: `temporal_slice` and the input)."""
        decode = shape.decode
        if plan is None:
            plan = self.plan_checked(shape, TilingArgs(temporal_slice=temporal_slice), output_device=output_device,
                                     budget_bytes=budget_bytes)
            log.debug("turbovae: %s", plan.describe())
            return plan
        if not isinstance(plan, PassPlan):
            raise ValueError(f"plan must be a PassPlan (TurboVAE.plan), got {type(plan).__name__}")
        if plan.decode != decode or tuple(plan.shape) != shape.dims:
            raise ValueError(f"the plan is for {'decoding' if plan.decode else 'encoding'} {plan.shape}, not "
                             f"{'decoding' if decode else 'encoding'} {shape.dims}; make it from this input")
        if temporal_slice is not None or budget_bytes is not None:
            raise ValueError("temporal_slice / budget_bytes given beside a plan, which already holds them; pass one")
        return plan

    def run_decode(self, z: torch.Tensor, *, plan: PassPlan, progress: Progress = None,
                   output_device: Union[None, str, torch.device] = None) -> torch.Tensor:
        """The decode pass alone: validated 5-D latents on the model's device/dtype -> all decoded frames, run as
        `plan` says. `decode` wraps it with the input checks, the plan, `num_frames` trimming and 4-D handling, so
        a subclass that runs the pass elsewhere (engines) overrides only this and keeps that policy."""
        return self._run(z, plan, progress, output_device)

    def run_encode(self, x: torch.Tensor, *, plan: PassPlan, progress: Progress = None,
                   output_device: Union[None, str, torch.device] = None) -> torch.Tensor:
        """The encode pass alone (moments), as `run_decode` for decode."""
        return self._run(x, plan, progress, output_device)

    def _run(self, x: torch.Tensor, plan: PassPlan, progress: Progress,
             output_device: Union[None, str, torch.device]) -> torch.Tensor:
        if plan.mode == "untiled" and not (plan.frame_stages or plan.on_host):
            # the model's own pass (through CUDA graphs once opted in)
            return self._model_pass(plan.decode, progress)(x, temporal_slice=plan.temporal_slice)
        out_dev = torch.device(output_device) if output_device is not None else None
        return run_plan(self.model, x, plan, progress=progress, output_device=out_dev,
                        whole=self.tile_pass(decode=plan.decode))

    def tile_pass(self, *, decode: bool) -> Callable[[torch.Tensor], torch.Tensor]:
        """The whole-clip pass fast tiles run on a tile that fits one temporal slice (validated 5-D input
        on the model's device/dtype -> pixels or moments). The model's own here (through CUDA graphs once
        opted in); an engine VAE returns one that runs tiles of an engine's size on the engine."""
        return self._model_pass(decode)


def moments_to_latents(moments: torch.Tensor, *, sample: bool = False,
                       generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Mean, or mean + σ·ε with the log-variance clamped to [-30, 20] as the references do."""
    mean, logvar = moments.chunk(2, dim=1)
    if not sample:
        return mean.contiguous()
    std = torch.exp(0.5 * logvar.float().clamp(*LOGVAR_CLAMP))
    eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=torch.float32)
    return (mean.float() + std * eps).to(mean.dtype)


def pad_to_multiple(pixels: torch.Tensor, multiple: int = 8) -> torch.Tensor:
    """Replicate-pad H and W (bottom/right) up to a multiple; crop the decoded result back yourself."""
    h, w = pixels.shape[-2:]
    ph, pw = (-h) % multiple, (-w) % multiple
    if not (ph or pw):
        return pixels
    x = pixels if pixels.ndim == 4 else pixels.flatten(1, 2)
    x = torch.nn.functional.pad(x, (0, pw, 0, ph), mode="replicate")
    return x if pixels.ndim == 4 else x.view(*pixels.shape[:3], h + ph, w + pw)
