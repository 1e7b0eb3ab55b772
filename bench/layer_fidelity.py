"""Which op of a SeedVR2 decode loses fp32 accuracy in which layout: every causal convolution and GroupNorm of the
pass, each run alone in fp32 on the float64 pass's own input, contiguous and channels-last, against float64.

Why per layer: bench/fidelity.py measures whole passes, where one path's error is the sum of every op it changes.
Here each op gets the same exact input in both layouts, so a layout's own rounding shows, op kind by op kind
(issue 51: channels-last cost a decode 3x the plain path's error; this names the convolutions, not the norms).

    python -m turbovae.bench.layer_fidelity --out docs/results/<date>-cpu-layer-fidelity-seedvr2.json --threads 2
    python -m turbovae.bench.layer_fidelity --markdown docs/results/<date>-cpu-layer-fidelity-seedvr2.json

An error is max |fp32 - float64| over max |float64| of that op's output. The float64 pass runs the plain paths
(3-D convs over the replicate-padded input); each conv is measured as that conv3d and as the image path's conv2d
with the summed temporal taps (what the default runs on an image), and each norm as `F.group_norm` on contiguous
input, as `vae.norms.group_norm_channels_last` (the stable statistics channels-last passes run) and as PyTorch's
own channels-last kernel.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ..trt.fileio import atomic_write_text
from ..vae.accel.switches import FastPaths
from ..vae.norms import group_norm_channels_last, observing_norm_inputs
from .common import environment
from .cases import FidelityCase, for_section
from .fidelity import build_models, photo

CL2, CL3 = torch.channels_last, torch.channels_last_3d
_NORM_EPS = 1e-6  # SeedVR2's GroupNorm eps (the statistics are what is measured; the affine is per channel)


@dataclass
class LayerRow:
    """One op of the pass: `layer` (module name, or the norm's call index), `op` ("conv3d", "conv2d, summed
    taps" or "group_norm"), its input shape, and its error in each layout (`native_channels_last`: norms only,
    PyTorch's one-pass channels-last kernel)."""

    layer: str
    op: str
    input_shape: tuple[int, ...]
    contiguous: float
    channels_last: float
    native_channels_last: Optional[float] = None


def _error(out: torch.Tensor, truth: torch.Tensor) -> float:
    return ((out.double() - truth).abs().max() / truth.abs().max().clamp_min(1e-30)).item()


def conv_rows(name: str, conv: torch.nn.Module, x: torch.Tensor) -> list[LayerRow]:
    """The conv3d and the folded conv2d of a SeedVR2 `CausalConv3d` on a first-slice input `x` (float64)."""
    padded = conv.cat_padded(x, None)
    w64, b64 = conv.weight.contiguous(), conv.bias
    truth = F.conv3d(padded, w64, b64, conv.stride, conv.padding)
    xp, w, b = padded.float(), w64.float(), b64.float()
    rows = [LayerRow(name, "conv3d", tuple(padded.shape),
                     _error(F.conv3d(xp.contiguous(), w.contiguous(), b, conv.stride, conv.padding), truth),
                     _error(F.conv3d(xp.contiguous(memory_format=CL3), w.contiguous(memory_format=CL3), b,
                                     conv.stride, conv.padding), truth))]
    if x.shape[2] == 1:  # every window is [f0] * k_t: the image path's conv2d with the summed taps
        frame = x[:, :, 0].float()
        if conv.pad_right_bottom:
            frame = F.pad(frame, (0, 1, 0, 1))
        folded = w64.sum(2).float()
        stride, pad = conv.stride[1:], conv.padding[1:]

        def conv2d(layout: torch.memory_format) -> float:
            out = F.conv2d(frame.contiguous(memory_format=layout), folded.contiguous(memory_format=layout), b,
                           stride, pad)
            return _error(out.unsqueeze(2), truth)

        rows.append(LayerRow(name, "conv2d, summed taps", tuple(frame.shape), conv2d(torch.contiguous_format),
                             conv2d(CL2)))
    return rows


def norm_rows(index: int, x: torch.Tensor, groups: int) -> list[LayerRow]:
    """GroupNorm of each frame of `x` (float64, 4-D or 5-D) in the three implementations."""
    frames = x if x.ndim == 4 else x.transpose(1, 2).flatten(0, 1)
    truth = F.group_norm(frames.contiguous(), groups, None, None, _NORM_EPS)
    x32 = frames.float()
    cl = x32.contiguous(memory_format=CL2)
    return [LayerRow(f"norm {index}", "group_norm", tuple(frames.shape),
                     _error(F.group_norm(x32.contiguous(), groups, None, None, _NORM_EPS), truth),
                     _error(group_norm_channels_last(cl, groups, None, None, _NORM_EPS), truth),
                     _error(F.group_norm(cl, groups, None, None, _NORM_EPS), truth))]


def run(case: FidelityCase, *, init: str = "reference", bias_shift: float = 0.0, seed: int = 0,
        models: Optional[tuple[torch.nn.Module, torch.nn.Module]] = None) -> list[LayerRow]:
    """Every conv and norm of `case` (a SeedVR2 pass), measured alone in both layouts (module docstring).
    `models`: an (fp32, float64) pair of one SeedVR2 model to measure instead of `build_models`' real-config one."""
    from ..vae.seedvr2.layers import CausalConv3d

    m32, m64 = models if models is not None else build_models(case.family, bias_shift, seed, init)
    rows: list[LayerRow] = []
    names = {module: name for name, module in m64.named_modules()}

    def measure(module: torch.nn.Module, args: tuple) -> None:
        rows.extend(conv_rows(names[module], module, args[0]))

    hooks = [module.register_forward_pre_hook(measure) for module in m64.modules() if isinstance(module, CausalConv3d)]
    norm_calls = [0]

    def observe(x: torch.Tensor, groups: int) -> None:
        rows.extend(norm_rows(norm_calls[0], x, groups))
        norm_calls[0] += 1

    pixels = photo(case.frames, case.height, case.width, seed)
    try:
        with torch.inference_mode():
            m32.fast = FastPaths()
            if case.direction == "decode":
                x = m32.encode_moments(pixels)[:, :m32.latent_format.channels].double()
            else:
                x = pixels.double()
            del m32
            m64.fast = FastPaths.plain()
            with observing_norm_inputs(observe):
                m64.decode_latents(x) if case.direction == "decode" else m64.encode_moments(x)
    finally:
        for hook in hooks:
            hook.remove()
    return rows


def results(case: FidelityCase, rows: Sequence[LayerRow], init: str, bias_shift: float) -> dict:
    """The results file's content (what `markdown` reads): the environment, the case, the weights, every row."""
    return {"environment": environment(), "section": "layer_fidelity", "case": case.name, "init": init,
            "bias_shift": bias_shift, "rows": [asdict(r) for r in rows]}


def summary(rows: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Per op kind: how many ops, and the median and largest error in each layout."""
    out: dict[str, dict[str, float]] = {}
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        entry: dict[str, float] = {"ops": len(mine)}
        for layout in ("contiguous", "channels_last", "native_channels_last"):
            errs = [r[layout] for r in mine if r.get(layout) is not None]
            if errs:
                entry[f"{layout}_median"] = statistics.median(errs)
                entry[f"{layout}_max"] = max(errs)
        out[op] = entry
    return out


def markdown(path: Path) -> str:
    """The docs table of a results file: per op kind, median and largest error of each layout."""
    data = json.loads(Path(path).read_text())
    lines = [f"{data['case']}, {data['init']} weights: each op alone in fp32 against float64 "
             "(max abs error / max abs output)", "",
             "| op | ops | contiguous: median | contiguous: max | channels-last: median | channels-last: max | "
             "channels-last / contiguous (medians) | PyTorch's channels-last kernel: median |",
             "|---|---|---|---|---|---|---|---|"]
    for op, s in summary(data["rows"]).items():
        native = s.get("native_channels_last_median")
        lines.append(f"| {op} | {s['ops']:.0f} | {s['contiguous_median']:.1e} | {s['contiguous_max']:.1e} | "
                     f"{s['channels_last_median']:.1e} | {s['channels_last_max']:.1e} | "
                     f"{s['channels_last_median'] / s['contiguous_median']:.1f} | "
                     f"{'' if native is None else format(native, '.1e')} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m turbovae.bench.layer_fidelity",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON file to write")
    parser.add_argument("--markdown", type=Path, help="print the docs table of a results file written by --out")
    parser.add_argument("--height", type=int, default=None, help="default: the case table's (bench/cases.py)")
    parser.add_argument("--width", type=int, default=None, help="default: the case table's")
    parser.add_argument("--init", choices=("fan_in", "reference"), default="reference")
    parser.add_argument("--bias-shift", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(args.markdown))
        return 0
    if args.out is None:
        parser.error("--out FILE is required (or --markdown FILE)")
    if args.threads:
        torch.set_num_threads(args.threads)
    (case,) = for_section("layer_fidelity")
    case = replace(case, height=args.height or case.height, width=args.width or case.width)
    rows = run(case, init=args.init, bias_shift=args.bias_shift)
    atomic_write_text(args.out, json.dumps(results(case, rows, args.init, args.bias_shift), indent=2), overwrite=True)
    print(markdown(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
