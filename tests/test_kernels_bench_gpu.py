"""The GPU ablation section runs its reduced CPU version (tiny configs) end to end."""

from __future__ import annotations

import math

import pytest
import torch

from turbovae.bench import gpu
from turbovae.bench.cases import AblationCase
from turbovae.bench.common import BenchOptions
from turbovae.bench.runner import SECTIONS


@pytest.mark.slow
def test_gpu_section_cpu_reduced_run_is_exact_in_fp32():
    assert SECTIONS["gpu"] == "gpu"
    rows = gpu.run(BenchOptions(device="cpu", quick=True, repeat=1, warmup=0))
    cpu_steps = [s.name for s in gpu.STEPS + gpu.ALONE_STEPS if not s.cuda_only]
    expected = [(c.name, s) for c in gpu.cases(False, True)
                for s in (["diffusers AutoencoderKLWan eager"] if c.baseline == "diffusers" else []) + cpu_steps]
    assert [(r.case, r.variant) for r in rows] == expected
    for r in rows:
        assert math.isfinite(r.ms) and r.ms > 0 and r.baseline_ms is not None
        assert r.max_abs_err <= 1e-4, f"{r.case} / {r.variant}: fast paths must be exact in fp32"
    assert all(s.cuda_only for s in gpu.STEPS + gpu.ALONE_STEPS if s.fused or s.compiled or s.graphs)
    assert "alone: channels-last" in cpu_steps  # the alone rows run on CPU too (channels-last is not CUDA-only)


@pytest.mark.slow
def test_ablation_ends_with_engines_built_for_each_case(monkeypatch):
    """`--ablation-engines`: the image decoder engine for the Qwen case, the video slice engines for the
    SeedVR2 clip; both serve the pass (no fallback) and match the fp32 reference. The Inductor compile is
    swapped for torch.export save/load (the AOTI compile itself is covered in test_engines_aoti.py)."""
    import torch

    from turbovae.trt.aoti import AOTIBackend

    monkeypatch.setattr(AOTIBackend, "compile_package", lambda self, program, f: torch.export.save(program, f))
    monkeypatch.setattr(AOTIBackend, "load_runner", lambda self, path: torch.export.load(str(path)).module())
    opts = BenchOptions(device="cpu", quick=True, repeat=1, warmup=0, ablation_engines=True, cases=("qwen", "seedvr2"))
    rows = [r for r in gpu.run(opts) if r.variant.startswith("+ engine")]
    assert [(r.case, r.variant) for r in rows] == [(c.name, "+ engine (aoti)") for c in gpu.selected_cases(opts, False)]
    assert len(rows) == 2
    for r in rows:
        assert r.section == "gpu" and math.isfinite(r.ms) and "FELL BACK" not in r.note
        assert r.max_abs_err <= 1e-4


def test_case_filter_and_engine_plan():
    assert [c.name for c in gpu.selected_cases(BenchOptions(quick=True, cases=("seedvr2",)), False)] == \
        ["seedvr2 5f decode 16² (tiny)"]
    from turbovae.vae.wan import TINY_WAN21, WanVAE

    clip = AblationCase("c", "decode", (1, 16, 3, 8, 8), family="qwen_image")
    assert gpu.engine_build_kwargs(WanVAE(TINY_WAN21), clip) == {"components": (), "video": True}  # causal steps
    assert gpu.engine_build_kwargs(torch.nn.Conv2d(1, 1, 1), clip) is None  # no causal-step contract: no engine
    assert gpu.engine_build_kwargs(None, AblationCase("e", "encode", (1, 3, 1, 64, 64))) == {"components": ("encoder",)}
