"""TEST DOUBLE of comfy_api (see tests/comfy_stubs/README.md)."""
