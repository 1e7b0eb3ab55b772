"""A causal pass streamed frame by frame through the model's stages: the least any one step holds.

Why: a temporal slice of one latent is the smallest step a whole decoder takes, and it still holds four output
frames at full resolution in every late layer (SeedVR2 at 1080p: 4 GB per 256-channel activation). But a causal
network is a chain of causal operators, each of which can be stepped on its own with any number of frames its
temporal stride allows, carrying its own history. So the model declares its stages (`VAEModel.frame_stages`):
runs of layers between which the frame rate changes (a temporal up- or downsampler starts a new stage), and how
many input frames each stage's first and later steps take. This driver pushes the input through them depth
first: a stage runs as soon as it has the frames for a step, its output goes straight to the next stage, and the
last stage's frames go to the output canvas. Every layer sees exactly the frames and history it would see in the
whole-clip pass, so the result equals it (fp32 within rounding); each stage keeps its own causal cache, under the
pass's placement (vae/memory/placement.py), so it can live in host memory.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..base import FrameStages, Progress
from ..memory.placement import Placement


def run_frame_stages(stages: FrameStages, x: torch.Tensor, *, out_frames: int,
                     canvas: Optional[Placement] = None, split: Optional[object] = None,
                     progress: Progress = None, tick: Optional[Callable[[], None]] = None,
                     sample: bool = False) -> torch.Tensor:
    """`x` [B, C, T, H, W] through every stage, frame chunk by frame chunk; returns the output canvas of `out_frames`
    frames (allocated by `canvas`, default where the output is made). `progress(done, total)` after each input
    chunk; `tick` after each layer-wise conv (`split`). `sample` (meta predictions, vae/planning): only the input
    chunks it takes until every stage has run its first step and a repeating one (SeedVR2: two for a decode, whose
    stages step a frame at a time; five for an encode, whose later stages take two frames a step): later steps
    repeat those on caches and canvas of the same shapes, so the peak is that of every step."""
    chain = list(stages.stages)
    ctxs = []
    for _ in chain:
        ctx = stages.open_context(split)
        ctx.tick = tick
        ctxs.append(ctx)
    pending: list[Optional[torch.Tensor]] = [None] * len(chain)
    runs = [0] * len(chain)  # steps each stage has run (`sample` stops once every stage has run two)
    canvas_t: list[Optional[torch.Tensor]] = [None]
    at = [0]

    def emit(y: torch.Tensor) -> None:
        if canvas_t[0] is None:
            shape = (*y.shape[:2], out_frames, *y.shape[3:])
            canvas_t[0] = canvas.empty(shape, y.dtype) if canvas is not None else \
                torch.empty(shape, dtype=y.dtype, device=y.device)
        frames = y.shape[2]
        start = min(at[0], out_frames - frames)
        canvas_t[0][:, :, start:start + frames].copy_(y)
        at[0] += frames

    def feed(i: int, y: torch.Tensor) -> None:
        pending[i] = y if pending[i] is None else stages.join([pending[i], y], split)
        stage, ctx = chain[i], ctxs[i]
        while pending[i] is not None:
            need = stage.first if ctx.first else stage.rest
            have = pending[i].shape[2]
            if have < need:
                return
            chunk = pending[i][:, :, :need]
            pending[i] = pending[i][:, :, need:] if have > need else None
            out = stage.run(chunk, ctx)
            ctx.advance()
            runs[i] += 1
            del chunk
            if i == len(chain) - 1:
                emit(out)
            else:
                feed(i + 1, out)
            del out

    first, rest = chain[0].first, chain[0].rest
    bounds = [(0, min(first, x.shape[2]))]
    while bounds[-1][1] < x.shape[2]:
        bounds.append((bounds[-1][1], min(bounds[-1][1] + rest, x.shape[2])))
    for n, (a, b) in enumerate(bounds):
        feed(0, x[:, :, a:b])
        if progress is not None:
            progress(n + 1, len(bounds))
        if sample and min(runs) >= 2:
            break
    leftover = [i for i, p in enumerate(pending) if p is not None]
    if leftover and not sample:
        raise ValueError(f"frames left in stage(s) {', '.join(chain[i].name for i in leftover)}: the input's "
                         f"{x.shape[2]} frames do not fit the stages' steps (1+{rest}k frames)")
    for ctx in ctxs:
        ctx.clear()
    return canvas_t[0]
