"""`python -m turbovae build-engines`: options -> a bucket table and build settings; trt/build.py exports and builds
the engine set for one checkpoint."""

from __future__ import annotations

import argparse
import sys

from ..trt.backends import AUTO_BACKEND, BACKEND_CHOICES, resolve_backend
from ..trt.buckets import Bucket, multi_profile_table, multi_ratio_table, static_table
from ..trt.identity import COMPONENTS
from ..vae.dtypes import DTYPE_NAMES
from ..vae.registry import titles

DESCRIPTION = ("Export a VAE's encoder/decoder and build engines. Defaults: backend auto (TensorRT where it can build, "
               "else AOTInductor, which needs only PyTorch), fp16 engines, encoder and decoder, on CUDA when "
               "available.")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("build-engines", help="export and build engines for a VAE checkpoint",
                            description=DESCRIPTION)
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vae", required=True, help="VAE checkpoint (file or diffusers folder)")
    parser.add_argument("--out", required=True, help="engine folder to create")
    shape = parser.add_mutually_exclusive_group(required=True)
    shape.add_argument("--static", nargs="+", metavar="WxH",
                       help="static bucket(s); several form a multi-ratio set of exactly these sizes")
    shape.add_argument("--multi-ratio", nargs="*", metavar="WxH",
                       help="multi-ratio static set of these sizes (default when given without sizes: Qwen-Image "
                            "ratios + 512², 1024²)")
    shape.add_argument("--multi-profile", action="store_true", help="dynamic engines for ≤1 MP, ≤2.8 MP, ≤4 MP")
    parser.add_argument("--backend", choices=BACKEND_CHOICES, default=AUTO_BACKEND,
                        help="auto (tensorrt where it can build here, else aoti; it prints which and why), tensorrt "
                             "(needs a GPU, the tensorrt package, onnx and onnxscript) or aoti (AOTInductor, "
                             "PyTorch only; on CPU it can be slower than eager PyTorch at small sizes, so time it "
                             "with `bench --sections engines`) (default: auto)")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default="fp16", help="engine precision (default: fp16)")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--components", default=",".join(COMPONENTS),
                        help=f"comma list of {', '.join(COMPONENTS)} (empty with --video: only the video engines; "
                             f"default: {','.join(COMPONENTS)})")
    parser.add_argument("--video", action="store_true",
                        help="also build video slice engines (decode_slice_first/next, one pair per static bucket) so "
                             f"clips decode on engines: {titles()}; static/multi-ratio tables only")
    parser.add_argument("--slice-latents", type=int, default=None, metavar="K",
                        help="with --video: latents per next-slice engine call (the first slice takes 1 + K; a clip "
                             "that does not fill its last slice is padded and cropped, exactly). Larger K runs "
                             "faster where small slices underuse the device and holds more memory (default: the "
                             "eager decode's fastest slice measured on this device type, else 1)")
    parser.add_argument("--opt-level", type=int, default=3, help="TensorRT builder optimization level 0-5 (default: 3)")
    parser.add_argument("--overwrite", action="store_true", help="replace engines already in --out")
    parser.add_argument("--pad-to-bucket", action="store_true",
                        help="let sizes between buckets run padded into the next bucket (approximate: differs "
                             "from PyTorch near the edges and through attention); default: they run on PyTorch")


def table_from_args(args: argparse.Namespace):
    if args.static:
        buckets = [Bucket.parse(s) for s in args.static]
        return static_table(buckets[0]) if len(buckets) == 1 else multi_ratio_table(buckets)
    if args.multi_ratio is not None:
        return multi_ratio_table([Bucket.parse(s) for s in args.multi_ratio]) if args.multi_ratio \
            else multi_ratio_table()
    return multi_profile_table()


def run(args: argparse.Namespace) -> int:
    """Build the set. A bad argument, checkpoint, device, unusable backend or an existing output raises its typed
    error (`python -m turbovae` prints it in one line, exit code 2; `--verbose` shows the traceback); a failed
    build prints one line and returns 1. Everything that needs no model (table, components, backend, output
    folder) is checked before the checkpoint is loaded."""
    import torch

    from ..vae.loader import load_checkpoint, resolve_device
    from ..vae.dtypes import parse_dtype
    from ..trt.build import build_engine_set, preflight
    from ..trt.interface import EngineError

    components = [c.strip() for c in args.components.split(",") if c.strip()]
    table = table_from_args(args)
    device = resolve_device(args.device)
    dtype = parse_dtype(args.dtype)
    backend, why = resolve_backend(args.backend, device)
    if args.backend == AUTO_BACKEND:
        print(f"backend: {backend} ({why})")
    preflight(args.out, table, backend=backend, device=device, components=components, video=args.video,
              overwrite=args.overwrite, slice_latents=args.slice_latents)
    vae = load_checkpoint(args.vae, dtype=torch.float32, device=device)
    try:
        paths = build_engine_set(vae, args.out, table, backend=backend, dtype=dtype, device=device,
                                 components=components, video=args.video, overwrite=args.overwrite, source=args.vae,
                                 optimization_level=args.opt_level, pad_to_bucket=args.pad_to_bucket,
                                 slice_latents=args.slice_latents)
    except (EngineError, OSError, ValueError) as e:
        if getattr(args, "verbose", False):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    for p in paths:
        print(p)
    return 0
