"""No bench case may abort the GPU run (issue 33 item 3): the fp32 reference runs in the public path's slices
and halves them after an out-of-memory; an out-of-memory in a step or the diffusers baseline is a row with
the error and the case goes on; the dry run injects both (bench/gpu_run.py DRY_RUN_OOM). On CPU with the
tiny cases and simulated `torch.OutOfMemoryError`s (decided by type)."""

from __future__ import annotations

import math

import pytest
import torch

from turbovae.bench import gpu, gpu_run
from turbovae.bench.common import BenchOptions

KEY = "seedvr2-decode-720p21"


def _rows(*inject: str, cases=(KEY,)):
    return gpu.run(BenchOptions(device="cpu", quick=True, repeat=1, warmup=0, cases=cases, inject_oom=inject))


def test_a_step_out_of_memory_is_a_row_and_the_case_goes_on():
    rows = _rows(f"{KEY}:+ channels-last", f"{KEY}:eager baseline")
    cpu_steps = [s.name for s in gpu.STEPS + gpu.ALONE_STEPS if not s.cuda_only]
    assert [r.variant for r in rows] == cpu_steps  # every step has its row, in order
    by = {r.variant: r for r in rows}
    for failed in ("eager baseline", "+ channels-last"):
        assert math.isnan(by[failed].ms) and by[failed].note.startswith("out of memory: InjectedOutOfMemory")
    ok = by["+ image path / arch fast paths"]
    assert math.isfinite(ok.ms) and ok.baseline_ms == ok.ms  # the first step that ran is the baseline
    assert ok.max_abs_err <= 1e-4


def test_reference_out_of_memory_retries_in_smaller_slices():
    key = "wan21-decode-720p81"  # 3 latents: the whole clip is slice 2, the retry runs at 1
    rows = [r for r in _rows(f"{key}:fp32 reference", cases=(key,)) if r.variant != gpu.DIFFUSERS]
    assert rows and all(math.isfinite(r.ms) and r.max_abs_err <= 1e-4 for r in rows)  # slices: exact
    assert all("fp32 reference out of memory at slice 2, ran at 1" in r.note for r in rows)


def test_reference_that_never_fits_leaves_rows_without_errors(monkeypatch):
    from turbovae.bench.gpu import InjectedOutOfMemory

    class Always(gpu._Faults):
        def wrap(self, variant, fn):
            if variant != gpu.REFERENCE:
                return fn

            def fail():
                raise InjectedOutOfMemory("never fits")
            return fail

    monkeypatch.setattr(gpu, "_Faults", Always)
    rows = _rows()
    assert rows and all(math.isfinite(r.ms) and r.max_abs_err is None and r.psnr_db is None for r in rows)
    assert "no fp32 reference: out of memory at 1 latent(s) per slice" in rows[0].note


def test_diffusers_baseline_out_of_memory_is_a_row():
    pytest.importorskip("diffusers")
    key = "wan21-decode-720p81"
    rows = _rows(f"{key}:{gpu.DIFFUSERS}", cases=(key,))
    assert rows[0].variant == gpu.DIFFUSERS and math.isnan(rows[0].ms) and "out of memory" in rows[0].note
    assert all(math.isfinite(r.ms) for r in rows[1:]) and len(rows) > 1


def test_a_case_that_fails_outside_its_steps_is_a_row_and_the_next_case_runs(monkeypatch):
    real = gpu._ablate

    def ablate(opts, model, case, *a):
        if case.key == "qwen-decode-1024":
            raise torch.OutOfMemoryError("simulated: moving the model")
        return real(opts, model, case, *a)

    monkeypatch.setattr(gpu, "_ablate", ablate)
    rows = gpu.run(BenchOptions(device="cpu", quick=True, repeat=1, warmup=0, cases=("qwen-decode-1024", KEY)))
    assert rows[0].variant == "case" and rows[0].note.startswith("out of memory: OutOfMemoryError")
    assert {r.case for r in rows[1:]} == {c.name for c in gpu.cases(False, True) if c.key == KEY}


def test_out_of_memory_is_decided_by_type_not_text():
    assert gpu.failure_note(RuntimeError("out of memory (but not an allocation failure type)")).startswith("failed")
    assert gpu.failure_note(torch.OutOfMemoryError("x")).startswith("out of memory")
    assert gpu.failure_note(gpu.InjectedOutOfMemory("x")).startswith("out of memory")


def test_injected_names_are_checked():
    with pytest.raises(ValueError, match="CASE_KEY:VARIANT"):
        gpu.parse_injected(["no-colon"])
    with pytest.raises(ValueError, match="eager baseline"):
        gpu.parse_injected([f"{KEY}:no such step"])
    assert gpu.parse_injected([f"{KEY}:fp32 reference", f"{KEY}:+ channels-last"]) == \
        {KEY: ("fp32 reference", "+ channels-last")}


def test_the_dry_run_injects_the_out_of_memory_rows():
    """The dry run's cases carry the faults (the end-to-end dry run then writes the rows): a step of the
    SeedVR2 clip, and the Wan clip's reference."""
    faults = gpu.parse_injected(gpu_run.DRY_RUN_OOM)  # names real variants
    assert faults == {KEY: ("+ channels-last",), "wan21-decode-720p81": (gpu.REFERENCE,)}
    injected = []
    for task in gpu_run.plan(dry_run=True):
        injected += [task.argv[i + 1] for i, a in enumerate(task.argv) if a == "--inject-oom"]
        assert all(task.argv[i + 1].startswith(task.key + ":") for i, a in enumerate(task.argv) if a == "--inject-oom")
    assert sorted(injected) == sorted(gpu_run.DRY_RUN_OOM)
    assert all("--inject-oom" not in t.argv for t in gpu_run.plan(dry_run=False))
