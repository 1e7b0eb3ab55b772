"""A top-level package named like ComfyUI's `utils`: it must not outlive the bench's session."""

FROM_FAKE_COMFYUI = True
