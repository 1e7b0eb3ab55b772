"""Exact decode/encode with the frame split into row bands across devices (one process) or the ranks of a
torch.distributed process group: bands.py (geometry), collectives.py (the two transports), sharded.py
(one rank's pass), api.py (`decode_parallel` / `encode_parallel`)."""

from .passes import decode_parallel, encode_parallel, parse_devices
from .collectives import ParallelPassError

__all__ = ["decode_parallel", "encode_parallel", "parse_devices", "ParallelPassError"]
