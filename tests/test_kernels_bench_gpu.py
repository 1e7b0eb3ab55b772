"""The GPU ablation section runs its reduced CPU version (tiny configs) end to end."""

from __future__ import annotations

import math

from turbovae.bench import gpu
from turbovae.bench.common import BenchOptions
from turbovae.cli import BENCH_SECTIONS


def test_gpu_section_cpu_reduced_run_is_exact_in_fp32():
    assert BENCH_SECTIONS["gpu"] == "gpu"
    rows = gpu.run(BenchOptions(device="cpu", quick=True, repeat=1, warmup=0))
    cpu_steps = [s.name for s in gpu.STEPS if not s.cuda_only]
    assert [(r.case, r.variant) for r in rows] == [(c.name, s) for c in gpu.cases(False, True) for s in cpu_steps]
    for r in rows:
        assert math.isfinite(r.ms) and r.ms > 0 and r.baseline_ms is not None
        assert r.max_abs_err <= 1e-4, f"{r.case} / {r.variant}: fast paths must be exact in fp32"
    assert all(s.cuda_only for s in gpu.STEPS if s.fused or s.compiled or s.graphs)
