"""ONNX export (torch dynamo exporter) of the image graphs and the SeedVR2 video slice graph, and
onnxruntime validation.

Divisibility is declared in the graph (`16*Dim` pixels / `2*Dim` latents for Qwen-Image/Wan), the
graph is exported in the engine dtype (TensorRT's strongly typed networks take precision from it),
and the `.onnx` + `.onnx.data` pair is written together, atomically.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Mapping, Optional, Sequence

import torch
from torch import nn

from .backend import BuildSpec, ShapeRange
from .fileio import refuse_existing

log = logging.getLogger(__name__)


def union_profile(spec: BuildSpec) -> dict[str, ShapeRange]:
    """One range covering every profile (an ONNX graph is shared by all of an engine's profiles)."""
    out = {}
    for name in spec.input_names:
        rngs = [p[name] for p in spec.profiles]
        lo = tuple(min(r[0][i] for r in rngs) for i in range(len(rngs[0][0])))
        hi = tuple(max(r[2][i] for r in rngs) for i in range(len(rngs[0][0])))
        out[name] = (lo, rngs[0][1], hi)
    return out


def onnx_dynamic_shapes(spec: BuildSpec) -> tuple:
    from .aoti import dynamic_shapes

    return dynamic_shapes(spec, union_profile(spec))


def data_path(onnx_path: Path) -> Path:
    return onnx_path.with_name(onnx_path.name + ".data")


def export_onnx(module: nn.Module, example: Sequence[torch.Tensor], spec: BuildSpec, path: Path, *,
                overwrite: bool = False, optimize: bool = True) -> Path:
    """Write `path` (+ `path.data`) with dynamic axes from `spec`; both files appear or neither.

    The exporter names the weight file after the graph file, so both are written under their final
    names in a private temporary folder and then moved in (weights first).
    """
    path = Path(path)
    refuse_existing(path, overwrite)
    module = module.to(device=spec.device, dtype=spec.dtype).eval()
    example = tuple(x.to(device=spec.device, dtype=spec.dtype) for x in example)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{path.stem}.partial.", dir=path.parent))
    try:
        tmp = tmpdir / path.name
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, example, str(tmp), input_names=list(spec.input_names),
                              output_names=list(spec.output_names), dynamic_shapes=onnx_dynamic_shapes(spec),
                              dynamo=True, external_data=True, verbose=False, optimize=optimize)
        if not tmp.is_file():
            raise RuntimeError(f"ONNX export wrote no {tmp.name}")
        if data_path(tmp).is_file():
            refuse_existing(data_path(path), overwrite)
            os.replace(data_path(tmp), data_path(path))
        elif data_path(path).exists() and overwrite:
            data_path(path).unlink()  # a stale weight file must not pair with the new graph
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return path


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float((a @ b) / (a.norm() * b.norm()).clamp_min(1e-30))


def run_onnxruntime(path: Path, inputs: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    feeds = {k: v.detach().cpu().numpy() for k, v in inputs.items()}
    return [torch.from_numpy(o) for o in sess.run(None, feeds)]


def validate_onnx(path: Path, module: nn.Module, inputs: Mapping[str, torch.Tensor],
                  reference: Optional[Sequence[torch.Tensor]] = None) -> list[dict]:
    """onnxruntime (CPU) vs PyTorch: cosine and max abs error per output.

    `reference` defaults to the fp32 PyTorch module on the same inputs (cast to fp32). bf16 graphs
    cannot be checked this way: onnxruntime's CPU provider has no bf16 kernels.
    """
    if reference is None:
        m = module.float().eval()
        with torch.no_grad():
            out = m(*[v.float() for v in inputs.values()])
        reference = (out,) if isinstance(out, torch.Tensor) else tuple(out)
    got = run_onnxruntime(path, inputs)
    return [{"cosine": cosine(g.float(), r.float()), "max_abs": float((g.float() - r.float()).abs().max())}
            for g, r in zip(got, reference)]
