"""Seeded weights for a model without a checkpoint: what the doctor's micro-bench and the benchmark run.

Why scaled by fan-in: plain N(0, 1) weights blow activations up through the real-size networks (inf/NaN long
before the output), which would time and compare nothing a real checkpoint runs.
"""

from __future__ import annotations

import torch


def fan_in_weights(shapes: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded weights for a key -> shape table, scaled by fan-in so activations stay O(1) through the
    real-size networks: biases small, 1-D norm scales near 1, everything else N(0, 1/fan_in)."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for key, shape in shapes.items():
        if key.endswith(".bias"):
            sd[key] = 0.02 * torch.randn(shape, generator=g)
        elif len(shape) == 1:
            sd[key] = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            t = torch.randn(shape, generator=g)
            sd[key] = t.div_(t[0].numel() ** 0.5)
    return sd
