"""The tile executors below the planner: exact tiles (exact.py), fast blended tiles (fast.py), the tile grid
(grid.py) and out-of-memory retries (retry.py). The public tiled passes are vae/tiled.py."""
