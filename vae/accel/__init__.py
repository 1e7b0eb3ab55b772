"""Acceleration: everything that makes a pass faster without changing what it computes.

The switches (`switches.FastPaths`), the GPU self-check registry each fast path passes before its first use
(`self_checks`), the fused kernels and the conv3d guard (`kernels/`), the tensor and weight layouts
(`tensor_layout`, `weight_layout`, `channels_last`), CUDA graphs and `torch.compile`. The model code in
vae/ calls into this package; nothing here imports a model family.
"""
