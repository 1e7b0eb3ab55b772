"""The peak-memory prediction (vae/planning/meta_pass.py) against measured peaks: every GPU row of a GPU run's result files
that has a peak, and the same passes measured on this CPU at small sizes. Writes one JSON (docs/results/) of
predicted vs measured with the error; docs/memory.md reads its numbers from there.

    python -m turbovae.bench.peak_prediction --gpu-results DIR [--gpu-results DIR ...] --out FILE.json

GPU rows: `peak_mb` of bench/gpu.py is torch.cuda.max_memory_allocated above what was allocated before the pass
(weights, input, the fp32 reference), so it is compared with the prediction's pass bytes. Each ablation step is
predicted with the paths it ran (bench/gpu.py STEPS); compile and CUDA graphs are not modelled (their rows are
predicted as the fused-norms step and marked `modelled: false`). A public-decode file (`shape`, `run*_peak_mb`)
is compared with the total (pass + weights + input) at the slice that path took from free memory then.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Optional

import torch

from ..vae.accel.switches import FastPaths
from ..vae.memory.allocator import measure_peak
from ..vae.planning.meta_pass import MetaPasses, PassPaths
from .common import environment
from .cases import AUTO, for_section
from .gpu import cases as gpu_cases

MB = 2 ** 20

# bench/gpu.py STEPS -> (fast paths, fused norms, modelled)
STEP_PATHS = {
    "eager baseline": (FastPaths.plain(), False, True),
    "+ image path / arch fast paths": (replace(FastPaths(), channels_last=False), False, True),
    "+ channels-last": (FastPaths(), False, True),
    "+ fused norms (Triton)": (FastPaths(), True, True),
    "+ compile (per region)": (FastPaths(), True, False),
    "+ CUDA graphs": (FastPaths(), True, False),
}


def _meta(arch: str):
    """The real-config model of a registered family (a key or alias), on the meta device."""
    from ..vae.registry import family

    return family(arch).meta_model(real=True)


def _err(predicted: float, measured: float) -> float:
    return round(100.0 * (predicted - measured) / measured, 2)


def gpu_rows(path: Path, copies: dict) -> list[dict]:
    """Predicted vs measured for every ablation row with a peak in one bench result file."""
    data = json.loads(path.read_text())
    by_name = {c.name: c for c in gpu_cases(cuda=True, quick=False)}
    out = []
    for row in data.get("rows", []):
        case = by_name.get(row.get("case"))
        paths = STEP_PATHS.get(row.get("variant"))
        if case is None or paths is None or row.get("peak_mb") is None:
            continue
        m = re.search(r"temporal_slice=(\d+|None)", row.get("note") or "")
        k = case.temporal_slice if m is None else (None if m.group(1) == "None" else int(m.group(1)))
        if k == AUTO:
            continue
        fast, fused, modelled = paths
        model = copies.setdefault(case.family, MetaPasses(_meta(case.family)))
        p = model.predict(case.shape, decode=case.kind == "decode", dtype=torch.bfloat16, temporal_slice=k,
                          paths=PassPaths(fast, fused, "cuda"))
        out.append({"source": path.name, "case": case.name, "variant": row["variant"], "temporal_slice": k,
                    "compared": "pass", "modelled": modelled, "measured_mb": round(row["peak_mb"], 1),
                    "predicted_mb": round(p.pass_bytes / MB, 1), "error_pct": _err(p.pass_bytes / MB, row["peak_mb"])})
    return out


def seedvr2_decode_working_set(config, pixels_per_frame: int, frames: int, dtype: torch.dtype) -> int:
    """The hand estimate of a SeedVR2 decode's working set that chose the public decode's slice on the first GPU run
    (before the planner, vae/planning/, chose slices by predicted peak); a baseline of this bench only.

    Decode peaks in the last up block: a 2·C0-channel input, its normalised copy, the padded conv buffer and
    C0-channel outputs alive together ≈ 11·C0 values per output pixel and frame (2-byte dtype; fp32 doubles it), plus
    the mid block's per-frame attention for a 1080p frame with a memory-efficient kernel (256 MiB + 8·C_mid values
    per latent pixel), which does not shrink with tiles."""
    c0, cm = config.block_out_channels[0], config.block_out_channels[-1]
    per_px = 11 * c0 * 2 * torch.finfo(dtype).bits / 16
    return int(per_px * pixels_per_frame * frames + 256 * 2**20 + 8 * cm * 2 * (1920 * 1080 // 64))


def hand_estimate_slice(working_set, latent_frames: int, budget: int, temporal_factor: int = 4) -> Optional[int]:
    """The old slice rule: the largest slice (latent frames, halving from the whole clip) whose `working_set(frames)`
    (bytes for that many pixel frames in flight; the first slice's extra latent included) fits `budget`; None = the
    whole clip. On CUDA, where the first GPU run used it, no fastest-slice cap applied."""
    if latent_frames <= 1:
        return None

    def fits(k: int) -> bool:
        return working_set(1 + k * temporal_factor) <= budget

    k = latent_frames - 1
    if fits(k):
        return None
    while k > 1 and not fits(k):
        k //= 2
    return max(k, 1)


def public_decode_rows(path: Path, copies: dict, free_bytes: int) -> list[dict]:
    """A SeedVR2 public-decode file (the case table's `public_decode` case): measured max_memory_allocated (weights
    and input included) vs the total, at the slice the old rule took from the free memory of then
    (`hand_estimate_slice`)."""
    data = json.loads(path.read_text())
    shape = tuple(data["shape"])
    (case,) = for_section("public_decode")
    model = copies.setdefault(case.family, MetaPasses(_meta(case.family)))
    meta = _meta(case.family)
    f = meta.latent_format.spatial_factor
    pixels = shape[-1] * shape[-2] * f * f
    k = hand_estimate_slice(lambda frames: seedvr2_decode_working_set(meta.config, pixels, frames, torch.bfloat16),
                            shape[2], free_bytes)
    p = model.predict(shape, decode=True, dtype=torch.bfloat16, temporal_slice=k,
                      paths=PassPaths(FastPaths(), True, "cuda"))
    measured = max(v for key, v in data.items() if key.endswith("_peak_mb"))
    return [{"source": path.name, "case": case.name, "variant": "default paths",
             "temporal_slice": k, "compared": "total", "modelled": True, "measured_mb": round(measured, 1),
             "predicted_mb": round(p.total_bytes / MB, 1), "error_pct": _err(p.total_bytes / MB, measured)}]


def cpu_rows() -> list[dict]:
    """The same passes on the CPU (tiny configs, small sizes), their allocator peaks (vae/memory/allocator.py) vs the
    meta prediction, both layouts."""
    from ..vae.seedvr2 import SeedVR2Config, SeedVR2VAE
    from ..vae.wan import TINY_WAN21, WanVAE

    torch.manual_seed(0)
    out = []
    for model in (SeedVR2VAE(SeedVR2Config.tiny()).eval(), WanVAE(TINY_WAN21).eval()):
        c = model.latent_format.channels
        for channels_last in (False, True):
            model.fast = replace(FastPaths(), channels_last=channels_last)
            for decode, shape, k in [(True, (1, c, 1, 16, 16), None), (True, (1, c, 3, 12, 12), 1),
                                     (True, (1, c, 6, 16, 16), 2), (False, (1, 3, 1, 128, 128), None),
                                     (False, (1, 3, 9, 128, 128), 1)]:
                x = torch.randn(shape).clamp(-1, 1)

                def run():
                    with torch.inference_mode():
                        return (model.decode_latents if decode else model.encode_moments)(x, temporal_slice=k)

                run()
                measured = measure_peak(run, "cpu")[0].device_bytes
                p = MetaPasses(model).predict(shape, decode=decode, dtype=torch.float32, temporal_slice=k,
                                              paths=PassPaths(model.fast, False))
                out.append({"source": "cpu", "case": f"{model.kind} tiny {'decode' if decode else 'encode'} "
                                                      f"{'x'.join(map(str, shape))}",
                            "variant": "channels-last" if channels_last else "contiguous", "temporal_slice": k,
                            "compared": "pass", "modelled": True, "measured_mb": round(measured / MB, 3),
                            "predicted_mb": round(p.pass_bytes / MB, 3),
                            "error_pct": _err(p.pass_bytes, measured)})
    return out


def plans(budgets_mb: tuple[int, ...]) -> list[dict]:
    """What `plan` chooses for each of the case table's `peak_prediction` passes (clip and image cases of the
    issue's targets, planned on meta tensors for a CUDA pass in bf16: no GPU needed) under each budget (MB)."""
    from ..vae.memory.budget import BudgetTooSmall
    from ..vae.plan_pass import plan_dict, plan_pass

    out = []
    for case in for_section("peak_prediction"):
        for budget in budgets_mb:
            try:
                p = plan_pass(case.family, case.shape, decode=case.decode, dtype="bf16", device_type="cuda",
                              budget_bytes=budget * MB)
            except BudgetTooSmall as e:  # a row that says so, with the budget that works, not a failed run
                out.append({"family": case.shown, "shape": list(case.shape), "decode": case.decode,
                            "budget_mb": budget, "fits": False, "refused": str(e)})
            else:
                out.append(dict(plan_dict(p), family=case.shown))
    return out


def markdown(path: Path) -> str:
    """The committed comparison as the table docs/memory.md shows (a test keeps the two equal)."""
    rows = json.loads(Path(path).read_text())["rows"]
    lines = ["| where | case | paths | slice | compared | measured MB | predicted MB | error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        where = "CPU" if r["source"] == "cpu" else "H100"
        err = f"{r['error_pct']:+.2f} %" + ("" if r["modelled"] else " (not modelled)")
        lines.append(f"| {where} | {r['case']} | {r['variant']} | {r['temporal_slice'] or 'whole'} | {r['compared']} "
                     f"| {r['measured_mb']} | {r['predicted_mb']} | {err} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu-results", action="append", default=[], help="a GPU run's folder of result JSON files")
    ap.add_argument("--gpu-free-mb", type=float, default=80552,
                    help="free GPU memory when the public decode chose its slice (the doctor file's free_mb)")
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU measurements")
    ap.add_argument("--out", help="the JSON to write")
    ap.add_argument("--markdown", help="print the table of an existing comparison JSON instead")
    args = ap.parse_args(argv)
    if args.markdown:
        print(markdown(Path(args.markdown)))
        return 0
    if not args.out:
        ap.error("--out is required (or --markdown FILE)")
    copies: dict = {}
    rows: list[dict] = []
    for folder in map(Path, args.gpu_results):
        for path in sorted(folder.glob("*.json")):
            data = json.loads(path.read_text())
            if "rows" in data:
                rows += gpu_rows(path, copies)
            elif "shape" in data and any(k.endswith("_peak_mb") for k in data):
                rows += public_decode_rows(path, copies, int(args.gpu_free_mb * MB * 0.6))
    if not args.no_cpu:
        rows += cpu_rows()
    modelled = [abs(r["error_pct"]) for r in rows if r["modelled"]]
    from ..vae.memory.budget import DEFAULT_PASS_BUDGET_BYTES

    result = {"environment": environment(), "what": __doc__.split("\n\n")[0], "rows": rows,
              "plans": plans((DEFAULT_PASS_BUDGET_BYTES // MB, 24 * 1024)),
              "max_abs_error_pct_modelled": max(modelled) if modelled else None}
    Path(args.out).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    for r in rows:
        print(f"{r['source'][:28]:28} {r['case'][:40]:40} {r['variant'][:30]:30} k={r['temporal_slice']!s:4} "
              f"{r['compared']:5} measured {r['measured_mb']:>10} predicted {r['predicted_mb']:>10} "
              f"{r['error_pct']:+7.2f}%{'' if r['modelled'] else ' (not modelled)'}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
