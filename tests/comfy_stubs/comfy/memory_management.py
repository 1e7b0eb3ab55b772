"""TEST DOUBLE of ComfyUI's comfy/memory_management.py (only what TurboVAE reads). Not ComfyUI code.

Core's main.py sets `aimdo_enabled = True` once comfy-aimdo has initialised its devices (dynamic VRAM); tests
flip it with monkeypatch."""

aimdo_enabled = False
