"""The executors below the planner: exact tiles and the two exact plans they run (exact.py), fast blended tiles
(fast.py), the model's frame stages streamed frame by frame (frame_stages.py), the tile grid (grid.py) and
out-of-memory retries (retry.py). The planner's one executor of a plan is vae/planning/execute.py; the public tiled
passes are vae/tiled.py."""
