"""Pure-PyTorch VAE implementations and the tiling engine. Never imports `comfy`."""
