"""The UI progress bar of a long pass, which is also its cancel point."""

from __future__ import annotations

from typing import Callable, Optional

import comfy.model_management as mm
import comfy.utils


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
