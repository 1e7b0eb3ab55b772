"""TEST DOUBLE of comfy.model_patcher: holds the module, its devices, its size and its callbacks.

`detach` is what model management calls when it unloads a model to free memory; like the real one it
moves the module to the offload device and then runs the ON_DETACH callbacks. Core's accounting: `model_size()`
is `size`, `loaded_size()` the weight bytes core itself moved to the device (`model_loaded_weight_memory`,
set by a load, zeroed by a detach).
"""

from .patcher_extension import CallbacksMP


class ModelPatcher:
    def __init__(self, model, load_device, offload_device, size=0, weight_inplace_update=False):
        self.model = model
        self.load_device = load_device
        self.offload_device = offload_device
        self.size = size
        self.callbacks = {}
        if not hasattr(self.model, "model_loaded_weight_memory"):
            self.model.model_loaded_weight_memory = 0

    def loaded_size(self):
        return self.model.model_loaded_weight_memory

    def model_size(self):
        return self.size

    def is_dynamic(self):
        """Core's legacy patcher is never dynamic; ModelPatcherDynamic (dynamic VRAM) answers True."""
        return False

    def add_callback(self, call_type, callback):
        self.callbacks.setdefault(call_type, []).append(callback)

    def detach(self, unpatch_all=True):
        self.model.to(self.offload_device)
        self.model.model_loaded_weight_memory = 0
        for callback in self.callbacks.get(CallbacksMP.ON_DETACH, []):
            callback(self, unpatch_all)
        return self.model
