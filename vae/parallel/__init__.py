"""Exact decode/encode with the frame split into row bands across devices (one process) or the ranks of a
torch.distributed process group: bands.py (geometry), collectives.py (the two transports), sharded.py
(one rank's pass), predict.py and plan.py (`tile_px=0`: the tile whose predicted per-rank peak fits),
passes.py (`decode_parallel` / `encode_parallel` / `plan_parallel`)."""

from .passes import (decode_parallel, decode_parallel_checked, encode_parallel, encode_parallel_checked, parse_devices,
                     plan_parallel)
from .collectives import ParallelPassError
from .plan import ShardedPlan

__all__ = ["decode_parallel", "decode_parallel_checked", "encode_parallel", "encode_parallel_checked", "parse_devices",
           "plan_parallel", "ParallelPassError", "ShardedPlan"]
