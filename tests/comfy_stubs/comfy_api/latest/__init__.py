"""TEST DOUBLE of comfy_api.latest: ComfyExtension and the `io` schema types the nodes use."""

from . import io


class ComfyExtension:
    async def on_load(self):
        pass

    async def get_node_list(self):
        raise NotImplementedError
