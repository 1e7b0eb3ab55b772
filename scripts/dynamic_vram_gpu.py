#!/usr/bin/env python3
"""Set up a ComfyUI core as its main.py does (arguments, the CUDA allocator choice, comfy-aimdo's dynamic VRAM),
before torch is imported, then run the pack's dynamic VRAM checks (bench/dynamic_vram.py) in this process.

Why a script and not `python -m turbovae...`: importing the package imports torch, and core sets up its allocator
(`cuda_malloc`, PYTORCH_CUDA_ALLOC_CONF) and comfy-aimdo before torch is imported; a check that ran otherwise would
not be the process ComfyUI runs.

    python scripts/dynamic_vram_gpu.py --comfyui /path/to/ComfyUI --out DIR              # on a GPU
    python scripts/dynamic_vram_gpu.py --comfyui /path/to/ComfyUI --out DIR --dry-run    # CPU, small sizes

`turbovae` must be importable (installed, or a link named turbovae to this checkout on PYTHONPATH), and core's
requirements with comfy-aimdo installed. Arguments after `--` go to core (e.g. `-- --vram-headroom 2`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

log = logging.getLogger("turbovae.dynamic_vram")


def set_up_core(comfyui: Path, core_args: list[str]) -> None:
    """What ComfyUI's main.py does before it loads custom nodes, in its order, for the parts that decide memory:
    parse core's arguments, choose the CUDA allocator (`cuda_malloc`), initialise comfy-aimdo and its devices, and
    switch core's default patcher to the dynamic one."""
    sys.path.insert(0, str(comfyui))
    sys.argv = [str(comfyui / "main.py"), *core_args]
    import comfy.options

    comfy.options.enable_args_parsing()
    from comfy.cli_args import args, enables_dynamic_vram

    import cuda_malloc  # noqa: F401 - sets PYTORCH_CUDA_ALLOC_CONF before torch is imported, as main.py does

    import comfy_aimdo.control

    if enables_dynamic_vram():
        headroom = None if args.reserve_vram is None else int(args.reserve_vram * 1024 ** 3)
        comfy_aimdo.control.init(simple_vram_headroom=headroom, nvml_pressure=not args.disable_nvml_pressure)

    import comfy.memory_management
    import comfy.model_management
    import comfy.model_patcher

    supported = comfy.model_management.is_nvidia() or (
        comfy.model_management.is_amd() and comfy.model_management.rocm_version >= (7, 14))
    if args.enable_dynamic_vram or (enables_dynamic_vram() and supported):
        devices = comfy.model_management.get_all_torch_devices()
        if comfy_aimdo.control.init_devices((d.index, int(args.vram_headroom * 1024 ** 3)) for d in devices):
            if logging.getLogger().isEnabledFor(logging.DEBUG):  # main.py sets aimdo's log level from core's
                comfy_aimdo.control.set_log_debug()
            else:
                comfy_aimdo.control.set_log_info()
            comfy.model_patcher.CoreModelPatcher = comfy.model_patcher.ModelPatcherDynamic
            comfy.memory_management.aimdo_enabled = True
            log.info("dynamic VRAM enabled (comfy-aimdo initialised the devices)")
        else:
            log.warning("comfy-aimdo did not initialise the devices: dynamic VRAM off")


def main() -> int:
    argv = sys.argv[1:]
    core_args: list[str] = []
    if "--" in argv:
        core_args = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--comfyui", type=Path, required=True, help="a ComfyUI tree with dynamic VRAM (0.33.0+)")
    parser.add_argument("--out", type=Path, required=True, help="folder for dynamic-vram.json")
    parser.add_argument("--dry-run", action="store_true", help="CPU (core's --cpu), a small clip and stand-in")
    parser.add_argument("--stand-in-gb", type=float, help="the dynamic stand-in's size (default: the case's)")
    parser.add_argument("--free-gb", type=float, help="device memory left free beside it (default: the case's)")
    parser.add_argument("--debug", action="store_true", help="debug logging, comfy-aimdo's included")
    opts = parser.parse_args(argv)
    if not (opts.comfyui / "comfy" / "model_management.py").is_file():
        parser.error(f"--comfyui {opts.comfyui} is not a ComfyUI tree (no comfy/model_management.py)")
    logging.basicConfig(level=logging.DEBUG if opts.debug else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    set_up_core(opts.comfyui.resolve(), (["--cpu"] if opts.dry_run else []) + core_args)

    import dataclasses

    from turbovae.bench.dynamic_vram import default_case, run

    case = default_case(opts.dry_run)
    for field, value in (("stand_in_gb", opts.stand_in_gb), ("free_gb", opts.free_gb)):
        if value is not None:
            case = dataclasses.replace(case, **{field: value})
    return run(opts.out, dry=opts.dry_run, case=case)


if __name__ == "__main__":
    sys.exit(main())
