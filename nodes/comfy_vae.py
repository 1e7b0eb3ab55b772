"""`ComfyTurboVAE`: a TurboVAE dressed as ComfyUI's `VAE` so core nodes (VAEDecode, VAEEncode,
VAEDecodeTiled, VAEEncodeTiled, SaveLatent, Wan/Qwen helpers) accept it unchanged.

Why a duck type and not a `comfy.sd.VAE` subclass: core never type-checks a VAE, and owning the calls lets us
keep our exact temporal streaming and tiling, real per-tile / per-slice progress and cancel (core passes no progress
bar there), and memory estimates that match our working set instead of core's full-tensor guesses. Every public
attribute of `comfy.sd.VAE` that core nodes read is provided with the meaning core gives it.

Layouts: IMAGE is [N, H, W, C] in 0..1 on the intermediate device; for these 3-D VAEs an IMAGE batch
is one clip (core's convention), so N frames encode to [1, C, T', h, w]. LATENT samples are what core's
own VAE of the same kind gives (core_contract.py: raw for Wan/Qwen-Image, scaled for SeedVR2).
C is the VAE's image channels (`output_channels`, core's name): 3, or 4 (RGBA) for Qwen-Image-Layered, whose
decode gives an RGBA IMAGE as core's does; encode fits the image to C channels as core does (extra channels
dropped, a missing alpha filled with 1.0 = opaque).
"""

from __future__ import annotations

from typing import Optional

import torch

import comfy.model_management as mm

from ..vae.api import TurboVAE
from ..vae.planning import PassPlan
from ..vae.input_rules import MIN_TILE_LATENT, PassShape, TilingArgs, tiling_args
from ..vae.tiled import decode_tiled_checked, encode_tiled_checked
from .core_contract import CoreLatents, core_overlap, frames_to_clips, image_frames, seedvr2_tiling_request
from .device_memory import vae_patcher
from .oom_retry import OOM_RETRY_OVERLAP_PX, unless_out_of_memory, warn_oom
from .pass_budget import item_shape, plan_item, tiled_plan
from .pass_report import PassReport, reported
from .progress import BatchProgress, progress_cap, progress_callback

# Missing alpha when an RGBA VAE encodes RGB: opaque, in 0..1 (core's Qwen/Wan 2.1 `pad_channel_value`).
ALPHA_PAD_VALUE = 1.0
WORKING_DTYPES = [torch.bfloat16, torch.float16, torch.float32]


class _PatcherModule(torch.nn.Module):
    """What ComfyUI's ModelPatcher manages: a plain container around our model, because the patcher
    writes bookkeeping attributes (`device`, `model_lowvram`, ...) onto the module it is given and our
    `VAEModel.device` is a read-only property."""

    def __init__(self, vae_model: torch.nn.Module):
        super().__init__()
        self.vae = vae_model


class ComfyTurboVAE:
    is_turbovae = True

    def __init__(self, turbo: TurboVAE, *, load_device: Optional[torch.device] = None,
                 offload_device: Optional[torch.device] = None):
        fmt = turbo.latent_format
        self.turbo = turbo
        self.first_stage_model = _PatcherModule(turbo.model)
        self.device = torch.device(load_device) if load_device is not None else mm.vae_device()
        self.offload_device = offload_device if offload_device is not None else mm.vae_offload_device()
        self.output_device = mm.intermediate_device()
        self.vae_dtype = turbo.dtype
        # weights, engines and CUDA-graph pools as model management sees them; released when it unloads us
        self.patcher, self._recount_memory = vae_patcher(turbo, self.first_stage_model, self.device,
                                                         self.offload_device)
        # Geometry, as core's Wan/Qwen VAE exposes it (ratios as plain ints: nodes such as
        # VAEEncodeForInpaint use `downscale_ratio` as a number).
        self.latent_channels = fmt.channels
        self.latent_dim = 3
        self.output_channels = fmt.image_channels
        self.pad_channel_value = ALPHA_PAD_VALUE if fmt.image_channels == 4 else None
        self.downscale_ratio = fmt.spatial_factor
        self.upscale_ratio = fmt.spatial_factor
        self.downscale_index_formula = (fmt.temporal_factor, fmt.spatial_factor, fmt.spatial_factor)
        self.upscale_index_formula = self.downscale_index_formula
        self.working_dtypes = list(WORKING_DTYPES)
        # Our modules are plain nn.Modules (no comfy cast-weight ops): they must be loaded whole.
        self.disable_offload = True
        self.not_video = False
        self.crop_input = True
        self.extra_1d_channel = None
        self.process_input = lambda image: image * 2.0 - 1.0
        self.process_output = lambda image: torch.clamp((image + 1.0) / 2.0, min=0.0, max=1.0)
        self.last_report: Optional[PassReport] = None  # what the last pass did (the nodes show it)
        self.core_latents = CoreLatents.for_kind(turbo.kind, fmt.scaling_factor, fmt.shift_factor)

    # -- what core nodes query --------------------------------------------------------------
    @property
    def kind(self) -> str:
        return self.turbo.kind

    def throw_exception_if_invalid(self) -> None:
        if self.first_stage_model is None:
            raise RuntimeError("TurboVAE: this VAE has been released; load it again")

    def get_sd(self) -> dict:
        return self.turbo.state_dict()

    def spacial_compression_decode(self) -> int:
        return self.turbo.spatial_factor

    def spacial_compression_encode(self) -> int:
        return self.turbo.spatial_factor

    def temporal_compression_decode(self) -> int:
        return self.turbo.temporal_factor

    def temporal_compression_encode(self) -> int:
        return self.turbo.temporal_factor

    # -- memory ---------------------------------------------------------------------------
    def memory_used_decode(self, shape, dtype) -> int:
        """The planned peak of decoding one batch item of latents `shape` (items decode one at a time) under the
        ComfyUI budget (nodes/pass_budget.py): what core asks model management for, so it does not tile on top."""
        return self._plan(item_shape(self.turbo, shape, decode=True), log_it=False).predicted.pass_bytes

    def memory_used_encode(self, shape, dtype) -> int:
        """The planned peak of encoding pixels `shape` (its clips together) under the ComfyUI budget."""
        return self._plan(item_shape(self.turbo, shape, decode=False), log_it=False).predicted.pass_bytes

    def _plan(self, shape: PassShape, *, log_it: bool = True) -> PassPlan:
        """The plan of core VAE Decode / Encode over validated input `shape`: output into ComfyUI's intermediate
        device, and a clip in about PROGRESS_STEPS steps (progress and Cancel between them; slicing is exact)."""
        frames = shape.dims[2]
        latents = frames if shape.decode else self.turbo.latent_format.latent_frames(frames)
        return plan_item(self.turbo, shape, self.device, log_it=log_it, output_device=self.output_device,
                         max_temporal_slice=progress_cap(latents))

    def _load(self, memory_required: int) -> None:
        mm.load_models_gpu([self.patcher], memory_required=memory_required, force_full_load=self.disable_offload)

    # -- layout conversions -----------------------------------------------------------------
    def vae_encode_crop_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """Centre-crop H and W down to multiples of the spatial factor, and fit the channels to the
        VAE's (core's behaviour: extra channels dropped, missing ones filled with `pad_channel_value`)."""
        f = self.turbo.spatial_factor
        for dim in (1, 2):
            size = pixels.shape[dim]
            keep = (size // f) * f
            if keep != size:
                pixels = pixels.narrow(dim, (size % f) // 2, keep)
        want, have = self.output_channels, pixels.shape[-1]
        if have > want:
            pixels = pixels[..., :want]
        elif have < want and self.pad_channel_value is not None:
            pixels = torch.nn.functional.pad(pixels, (0, want - have), value=self.pad_channel_value)
        return pixels

    def _image_to_clip(self, pixels: torch.Tensor) -> torch.Tensor:
        """IMAGE (0..1; one clip, or B clips for a video IMAGE) -> clips [B, C', T, H, W] (-1..1), C' the VAE's
        image channels."""
        frames, b, t = image_frames(pixels)
        frames = self.vae_encode_crop_pixels(frames)
        if frames.shape[1] == 0 or frames.shape[2] == 0:
            raise ValueError(f"image is smaller than {self.turbo.spatial_factor}x{self.turbo.spatial_factor} "
                             "pixels; nothing to encode")
        return self.process_input(frames_to_clips(frames, b, t).float())

    def clip_to_image(self, pixels: torch.Tensor, was_4d: bool) -> torch.Tensor:
        """[B, C, T, H, W] (-1..1) -> [B, T, H, W, C] (0..1); 4-D latents give [B, H, W, C]."""
        out = self.process_output(pixels.to(self.output_device).float())
        if was_4d and out.ndim == 5 and out.shape[2] == 1:
            out = out[:, :, 0]
        return out.movedim(1, -1)

    def to_comfy_latents(self, raw: torch.Tensor) -> torch.Tensor:  # our raw latents -> core's LATENT samples
        return self.core_latents.from_raw(raw)

    def _check_latents(self, samples: torch.Tensor) -> torch.Tensor:  # core's LATENT samples -> checked raw
        return self.core_latents.to_raw(self.turbo.check_latents(samples))

    # -- whole passes (core VAEDecode / VAEEncode) ----------------------------------------------
    def decode(self, samples_in: torch.Tensor, vae_options: Optional[dict] = None) -> torch.Tensor:
        """Core VAEDecode contract; `vae_options` may carry core's SeedVR2 `seedvr2_tiling` (our exact tiles)."""
        self.throw_exception_if_invalid()
        if (tiling := seedvr2_tiling_request(vae_options, MIN_TILE_LATENT * self.turbo.spatial_factor)) is not None:
            return self.decode_tiled_px(samples_in, self.tiling(tiling[0], tiling[1]))
        was_4d = samples_in.ndim == 4
        z = self._check_latents(samples_in)
        plan = self._plan(PassShape.of(z, decode=True))
        self._load(plan.predicted.pass_bytes)
        bar = BatchProgress(z.shape[0])  # core VAE Decode: progress and Cancel per batch item and step

        finished: list[torch.Tensor] = []  # batch items decoded whole; kept if a later one runs out of memory

        def whole() -> torch.Tensor:
            with reported(self.turbo, "decode", plan, self._keep):
                for i in range(len(finished), z.shape[0]):
                    px = self.turbo.decode_checked(z[i:i + 1], plan=plan, progress=bar.item(i),
                                                   output_device=self.output_device)  # z checked once, above
                    finished.append(px.to(self.output_device))  # items leave the device as they finish
                    bar.done(i)
                return torch.cat(finished)

        out = unless_out_of_memory(whole)
        if out is None:
            warn_oom("decoding")
            rest = self.decode_tiled_px(samples_in[len(finished):], self.tiling(None, OOM_RETRY_OVERLAP_PX))
            if not finished:
                return rest
            return torch.cat([self.clip_to_image(torch.cat(finished), was_4d), rest])
        return self.clip_to_image(out, was_4d)

    def encode(self, pixel_samples: torch.Tensor) -> torch.Tensor:
        self.throw_exception_if_invalid()
        x = self.turbo.pad_frames(self.turbo.check_pixels(self._image_to_clip(pixel_samples)))  # checked once
        plan = self._plan(PassShape.of(x, decode=False))
        self._load(plan.predicted.pass_bytes)
        bar = BatchProgress(1)  # the batch is one clip or one batch of images: progress per step
        mm.throw_exception_if_processing_interrupted()

        def whole() -> torch.Tensor:
            with reported(self.turbo, "encode", plan, self._keep):
                return self.turbo.encode_checked(x, plan=plan, progress=bar.item(0), output_device=self.output_device)

        out = unless_out_of_memory(whole)
        if out is None:
            warn_oom("encoding")
            return self.encode_tiled_px(pixel_samples, self.tiling(None, OOM_RETRY_OVERLAP_PX))
        bar.done(0)
        return self.to_comfy_latents(out.to(self.output_device).float())

    # -- tiled passes: ours in pixels (`*_tiled_px`); core's decode_tiled/encode_tiled contract converts ----
    def tiling(self, tile_px: Optional[int], overlap_px: Optional[int], mode="auto", temporal_slice=None) -> TilingArgs:
        """Tiling arguments in pixels, checked once (vae/input_rules.py) for a tiled pass of ours."""
        return tiling_args(mode, tile_px, overlap_px, temporal_slice, spatial_factor=self.turbo.spatial_factor)

    def decode_tiled_px(self, samples: torch.Tensor, tiling: TilingArgs, *, node_id: Optional[str] = None):
        """Our tiled decode (sizes in output pixels; `tiling` checked by `tiling`), the latents checked once."""
        self.throw_exception_if_invalid()
        out = self._tiled_pass(self._check_latents(samples), tiling, decode=True, node_id=node_id)
        return self.clip_to_image(out, samples.ndim == 4)

    def encode_tiled_px(self, pixels: torch.Tensor, tiling: TilingArgs, *, node_id: Optional[str] = None):
        """Our tiled encode (tile and overlap in input pixels), the clip checked once and padded to 1 + 4n frames."""
        clip = self.clip_for_pass(pixels)
        x = self.turbo.pad_frames(self.turbo.check_pixels(clip))
        out = self._tiled_pass(x, tiling, decode=False, node_id=node_id)
        return self.to_comfy_latents(out.to(self.output_device).float())

    def _tiled_pass(self, x: torch.Tensor, tiling: TilingArgs, *, decode: bool,
                    node_id: Optional[str]) -> torch.Tensor:
        """Both tiled passes over checked raw latents or a checked, padded clip: planned first under the ComfyUI
        budget, then model management is asked for the plan's peak; the plan logged is the plan run; its UI progress
        bar is also the cancel point."""
        shape = PassShape.of(x, decode=decode)
        plan = self.tiled_plan(shape, tiling)
        self._load(plan.predicted.pass_bytes)
        mm.throw_exception_if_processing_interrupted()
        run = decode_tiled_checked if decode else encode_tiled_checked
        with reported(self.turbo, "decode" if decode else "encode", plan, self._keep):
            return run(self.turbo, x, plan=plan, progress=progress_callback(node_id), output_device=self.output_device)

    def tiled_plan(self, shape: PassShape, tiling: TilingArgs) -> PassPlan:
        """The plan of a tiled pass of ours over validated input `shape` (nodes/pass_budget.py `tiled_plan`)."""
        return tiled_plan(self.turbo, shape, self.device, tiling=tiling, output_device=self.output_device)

    def load_for_parallel(self, shape: PassShape, tiling: TilingArgs) -> PassPlan:
        """Model management asked for what the single-device exact plan of these tiles needs (the multi-GPU nodes:
        the first device runs its share of it) for checked input `shape` and `tiling`; returns that plan."""
        plan = self.tiled_plan(shape, tiling)
        self._load(plan.predicted.pass_bytes)
        mm.throw_exception_if_processing_interrupted()
        return plan

    def latents_for_pass(self, samples: torch.Tensor) -> torch.Tensor:
        """Raw latents for the multi-GPU passes, checked (once: the plan and the pass take them as they are)."""
        self.throw_exception_if_invalid()
        return self._check_latents(samples)

    def clip_for_pass(self, pixels: torch.Tensor) -> torch.Tensor:
        """IMAGE -> the clip to encode, for a pass of ours that plans and loads itself."""
        self.throw_exception_if_invalid()
        return self._image_to_clip(pixels)

    def _keep(self, report: PassReport) -> None:
        self.last_report = report
        self._recount_memory()  # CUDA graphs captured by this pass count in the model's size

    def decode_tiled(self, samples, tile_x=None, tile_y=None, overlap=None, tile_t=None, overlap_t=None):
        """Core VAEDecodeTiled contract: sizes in LATENT units. Temporal overlap is not needed (our
        temporal slices carry the causal cache, so they are exact) and is ignored."""
        f = self.turbo.spatial_factor
        tile_px = max(tile_x or 0, tile_y or 0) * f or None
        return self.decode_tiled_px(samples, self.tiling(tile_px, core_overlap(tile_px, (overlap or 0) * f), "auto",
                                                         tile_t or None))

    def encode_tiled(self, pixel_samples, tile_x=None, tile_y=None, overlap=None, tile_t=None, overlap_t=None):
        """Core VAEEncodeTiled contract: sizes in PIXEL units (tile_t in frames)."""
        tile_px = max(tile_x or 0, tile_y or 0) or None
        slice_ = max(1, tile_t // self.turbo.temporal_factor) if tile_t else None
        return self.encode_tiled_px(pixel_samples, self.tiling(tile_px, core_overlap(tile_px, overlap or 0), "auto",
                                                               slice_))


def is_turbovae(vae: object) -> bool:
    return getattr(vae, "is_turbovae", False) is True
