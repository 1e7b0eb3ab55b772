"""Scaled-dot-product attention as the mid blocks call it, with its memory visible to the meta-tensor prediction.

Why a function of ours: on real tensors it is `F.scaled_dot_product_attention`, whose fused kernels (flash or
memory-efficient on CUDA, flash on the CPU) never hold the tokens × tokens score matrix. On meta tensors PyTorch
takes its math path instead, which materialises that matrix (4 GB for a 1080p frame's 32,400 tokens), so a pass
predicted on meta tensors would be predicted to need memory the real pass never allocates. Here a meta call runs
the fused kernel's own op for the device type the prediction is made for (`vae.memory.meta_device.predicting_for`),
whose meta kernel allocates what the real kernel returns; vae/memory/op_rules.py adds what it holds inside.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .memory.meta_device import path_device_type


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q·kᵀ/√d)·v over the last two dims of [..., tokens, d] tensors (no mask, no dropout)."""
    if q.device.type != "meta":
        return F.scaled_dot_product_attention(q, k, v)
    if path_device_type(q) == "cuda":
        return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, False)[0]
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[0]
