"""TEST DOUBLE of comfy.patcher_extension: the callback-type names the nodes register for."""


class CallbacksMP:
    ON_LOAD = "on_load_after"
    ON_DETACH = "on_detach_after"
