"""The UI progress bar of a long pass, which is also its cancel point (tiles, devices, temporal slices)."""

from __future__ import annotations

from typing import Callable, Optional


import comfy.model_management as mm
import comfy.utils


def running_node_id(node_cls) -> Optional[str]:
    """The id of the node ComfyUI is running (its hidden `unique_id`), which the progress bar is drawn on;
    None outside a prompt (tests, direct calls)."""
    hidden = getattr(node_cls, "hidden", None)
    return getattr(hidden, "unique_id", None) if hidden is not None else None


def progress_callback(node_id: Optional[str]) -> Callable[[int, int], None]:
    """`progress(done, total)` for the tiling engine and the multi-device passes: drives the node's UI bar,
    and raises ComfyUI's interrupt exception from inside the loop when the user presses Cancel."""
    bar: list = []

    def progress(done: int, total: int) -> None:
        if not bar:
            bar.append(comfy.utils.ProgressBar(total, node_id=node_id))
        bar[0].update_absolute(done, total)
        mm.throw_exception_if_processing_interrupted()

    return progress


PROGRESS_STEPS = 8  # core VAE Decode/Encode of a clip: about this many progress (and cancel) steps


class BatchProgress:
    """The node's bar over a batch whose items each run in temporal slices: `item(i)` is the `progress(done,
    total)` one item's pass calls after each slice (it also raises ComfyUI's interrupt exception there when the
    user presses Cancel); `done(i)` marks an item finished (an image pass reports no slices), also a
    cancel point."""

    def __init__(self, items: int):
        self.items, self.steps = items, 1
        self.bar = comfy.utils.ProgressBar(items)

    def item(self, i: int) -> Callable[[int, int], None]:
        def progress(done: int, total: int) -> None:
            self.steps = total
            self.bar.update_absolute(i * total + done, self.items * total)
            mm.throw_exception_if_processing_interrupted()

        return progress

    def done(self, i: int) -> None:
        self.bar.update_absolute((i + 1) * self.steps, self.items * self.steps)
        mm.throw_exception_if_processing_interrupted()


def progress_cap(latent_frames: int) -> Optional[int]:
    """The most latent frames per step for core VAE Decode/Encode of a clip of `latent_frames` latents: about
    1/PROGRESS_STEPS of it, so the bar moves and Cancel is honoured between steps (slicing carries the causal
    memory: the result is the whole-clip pass's); None for an image (one step)."""
    if latent_frames < 2:
        return None
    return max(1, -(-latent_frames // PROGRESS_STEPS))
