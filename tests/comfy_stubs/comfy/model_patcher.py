"""TEST DOUBLE of comfy.model_patcher: holds the module and its devices."""


class ModelPatcher:
    def __init__(self, model, load_device, offload_device, size=0, weight_inplace_update=False):
        self.model = model
        self.load_device = load_device
        self.offload_device = offload_device
