"""One pass measured by the CPU allocator beside its prediction: the check tests/test_peak_memory.py and
tests/test_prediction_accuracy.py both make (one loop, so both measure the same way)."""

from __future__ import annotations

from typing import Optional

import torch

from turbovae.vae.base import VAEModel
from turbovae.vae.memory.allocator import measure_peak
from turbovae.vae.planning.meta_pass import predict_pass


def measured_and_predicted(model: VAEModel, decode: bool, shape: tuple[int, ...],
                           temporal_slice: Optional[int]) -> tuple[int, int]:
    """(allocator-measured bytes, predicted bytes) of the model's pass over a random input of `shape` with its own
    fast paths. A call on the direction's smallest input runs first: what a first call alone allocates (the
    kernels' one-time set-up) is no part of a pass's peak; a first call of the case's own size measured the same."""
    fmt = model.latent_format

    def run(x: torch.Tensor):
        if decode:
            return model.decode_latents(x, temporal_slice=temporal_slice)
        return model.encode_moments(x, temporal_slice=temporal_slice)

    x = torch.randn(shape).clamp(-1, 1)
    smallest = (*shape[:2], 1, *(2 * (1 if decode else fmt.spatial_factor) for _ in shape[3:]))
    with torch.inference_mode():
        run(torch.randn(smallest).clamp(-1, 1))
        measured, _ = measure_peak(lambda: run(x), "cpu")
        predicted = predict_pass(model, shape, decode=decode, temporal_slice=temporal_slice).pass_bytes
    return measured.device_bytes, predicted
