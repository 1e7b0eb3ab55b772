"""TEST DOUBLE of comfy.model_management: CPU devices, recorded load_models_gpu / unload_all_models, the
interrupt flag."""

import torch


class InterruptProcessingException(Exception):
    pass


OOM_EXCEPTION = torch.OutOfMemoryError
interrupt_processing = False
load_calls: list = []
unload_all_calls: list = []


def get_torch_device():
    return torch.device("cpu")


def vae_device():
    return torch.device("cpu")


def vae_offload_device():
    return torch.device("cpu")


def intermediate_device():
    return torch.device("cpu")


def vae_dtype(device=None, allowed_dtypes=()):
    return torch.float32


def module_size(module):
    """Bytes of the module's state dict, as the real one counts them."""
    return sum(t.nelement() * t.element_size() for t in module.state_dict().values())


def unload_all_models():
    unload_all_calls.append(True)


def soft_empty_cache(force=False):
    pass


def load_models_gpu(models, memory_required=0, force_patch_weights=False, minimum_memory_required=None,
                    force_full_load=False):
    load_calls.append({"models": list(models), "memory_required": memory_required,
                       "force_full_load": force_full_load})
    for patcher in models:
        patcher.model.to(patcher.load_device)
        patcher.model.model_loaded_weight_memory = module_size(patcher.model)  # a full load counts the weights


class LoadedModel:
    """Core's per-model accounting: its whole memory is the patcher's size, and what is still to load
    (what a load asks free memory for when the model already sits on the device) is size minus loaded size."""

    def __init__(self, model):
        self.model = model

    def model_memory(self):
        return self.model.model_size()

    def model_loaded_memory(self):
        return self.model.loaded_size()

    def model_offloaded_memory(self):
        return self.model.model_size() - self.model.loaded_size()


def interrupt_current_processing(value=True):
    global interrupt_processing
    interrupt_processing = value


def processing_interrupted():
    return interrupt_processing


def throw_exception_if_processing_interrupted():
    global interrupt_processing
    if interrupt_processing:
        interrupt_processing = False
        raise InterruptProcessingException()


free_memory_bytes = 8 * 2**30  # what get_free_memory reports; tests set it


def get_free_memory(dev=None, torch_free_too=False):
    if dev is not None and torch.device(dev).type == "cpu" and cpu_free_memory_bytes is not None:
        return cpu_free_memory_bytes
    return free_memory_bytes


cpu_free_memory_bytes = None  # what get_free_memory reports for the CPU device (None: as for any device)
total_memory_bytes = 24 * 2**30  # what get_total_memory reports; tests set it


def get_total_memory(dev=None, torch_total_too=False):
    return total_memory_bytes


def extra_reserved_memory():
    return 400 * 1024 * 1024
