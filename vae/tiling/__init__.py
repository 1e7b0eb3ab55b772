"""Spatial tiling and temporal slicing over any `VAEModel` (fast, exact and auto modes)."""

from .tiler import decode_tiled, encode_tiled

__all__ = ["decode_tiled", "encode_tiled"]
