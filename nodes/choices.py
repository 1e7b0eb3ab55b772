"""Validation of combo values, and the tile-mode help text.

ComfyUI does not check V3 combo values against their options (an out-of-list value from an API
prompt or an old workflow reaches `execute`), so every node checks its own. The option lists are the
library's tables (`vae.tiled.MODES`, `vae.dtypes.DTYPE_CHOICES`, `vae.accel.compile.BACKENDS`/`MODES`/
`DYNAMIC`, `vae.gpu_defaults.COMPILE_ARCHITECTURES`, `trt.backends.BACKEND_CHOICES`, `trt.buckets.MODES`),
imported by the nodes, so a node offers exactly what the library accepts.
"""

from __future__ import annotations

from typing import Sequence

TILE_MODE_HELP = ("auto: no tiling when the whole pass's predicted peak fits in ComfyUI's free memory, otherwise "
                  "exact tiles sized by the same prediction. exact: tiles whose result equals the untiled pass "
                  "(frame-wide statistics and attention are computed once at latent resolution); memory bounded by the tile. fast: "
                  "independent tiles blended across the overlap; least memory and time, small differences "
                  "from the untiled result are possible near seams. With Load TRT VAE, fast tiles of an engine's size "
                  "(set tile_size to it) and auto's untiled pass run on the engines.")


def choice_error(name: str, value: object, options: Sequence[str]) -> str | None:
    """None when `value` is one of `options`, else a message naming the valid values."""
    if value in options:
        return None
    return f"{name}={value!r} is not a valid choice; use one of: {', '.join(map(str, options))}"


def check_choice(name: str, value: object, options: Sequence[str]) -> str:
    err = choice_error(name, value, options)
    if err:
        raise ValueError(err)
    return value  # type: ignore[return-value]


def first_error(*errors: str | None) -> bool | str:
    """`validate_inputs` result: True, or the first error message."""
    for err in errors:
        if err:
            return err
    return True
