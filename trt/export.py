"""ONNX export (torch dynamo exporter) of the image graphs and the video slice graphs, and
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

from .interface import BuildSpec, ShapeRange
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


def onnx_dynamic_shapes(spec: BuildSpec) -> Optional[tuple]:
    from .aoti import export_dynamic_shapes

    return export_dynamic_shapes(spec, union_profile(spec))


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


# -- video slice graph (any VAE with decode_step + cache_layout) ----------------------------------
class DecodeSliceGraph(nn.Module):
    """One causal decode slice with the causal cache as explicit tensors.

    first=True: latents [B, C, n, h, w] -> (pixels, *memory); first=False: (latents, *memory) ->
    (pixels, *memory'). The memory layout is `model.cache_layout(decode=True, ...)` (one tensor per
    causal conv, a fixed number of frames each), so chaining first -> next -> next ... equals the
    eager sliced decode for any clip length.
    """

    def __init__(self, model: nn.Module, first: bool, clamp: bool = True):
        super().__init__()
        self.model = model
        self.first = first
        self.clamp = clamp

    def forward(self, latents: torch.Tensor, *memory: torch.Tensor):
        out, state = self.model.decode_step(latents, None if self.first else list(memory), collect=True,
                                            clamp=self.clamp)
        return (out, *state)


def slice_graph_names(n_memory: int) -> tuple[list[str], list[str]]:
    mem = [f"memory_{i}" for i in range(n_memory)]
    return ["latents", *mem], ["pixels", *[f"{m}_out" for m in mem]]


def export_decode_slice_graphs(model: nn.Module, latent_hw: tuple[int, int], folder: Path, *,
                               dtype: torch.dtype = torch.float32, first_frames: int = 2, frames: int = 1,
                               overwrite: bool = False, optimize: bool = False) -> tuple[Path, Path]:
    """Export the first-slice and next-slice graphs of a causal decoder (trt/video.py's contract) at a
    static latent size.

    The first graph takes `first_frames` latents (1 + k), the next graph `frames` latents per call.
    """
    h, w = latent_hw
    c = model.latent_format.channels
    layout = model.cache_layout(decode=True, batch=1, height=h, width=w, first_frames=first_frames)
    ins, outs = slice_graph_names(len(layout))
    cpu = torch.device("cpu")
    z0 = torch.randn(1, c, first_frames, h, w)
    first_spec = BuildSpec(("latents",), tuple(outs), dtype, cpu, ({"latents": (z0.shape,) * 3},), {})
    p_first = export_onnx(DecodeSliceGraph(model, True), [z0], first_spec, Path(folder) / "decode_slice_first.onnx",
                          overwrite=overwrite, optimize=optimize)
    z1 = torch.randn(1, c, frames, h, w)
    mem = [torch.randn(shape) for _name, shape in layout]
    next_spec = BuildSpec(tuple(ins), tuple(outs), dtype, cpu,
                          ({n: (tuple(t.shape),) * 3 for n, t in zip(ins, [z1, *mem])},), {})
    p_next = export_onnx(DecodeSliceGraph(model, False), [z1, *mem], next_spec,
                         Path(folder) / "decode_slice_next.onnx", overwrite=overwrite, optimize=optimize)
    return p_first, p_next
