"""TEST DOUBLE package standing in for ComfyUI's `comfy` (see tests/comfy_stubs/README.md)."""
