"""Peak memory known before a pass runs (vae/planning/meta_pass.py, its storages counted by vae/memory/peak.py):
predictions against the same passes measured on the CPU, the sampled prediction of long clips against whole-clip
meta passes, the budget, and the `plan` command (the planner's own tests: tests/test_planner.py)."""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch

from turbovae.vae.api import TurboVAE
from turbovae.vae.accel.channels_last import channels_last_in_cpu_fp32
from turbovae.vae.accel.switches import FastPaths
from turbovae.vae.memory.budget import BudgetTooSmall, MemoryBudget, default_budget_bytes, DEFAULT_PASS_BUDGET_BYTES
from turbovae.vae.memory.peak import LiveBytes
from turbovae.vae.planning.meta_pass import MetaPasses, PassPaths, meta_pass_peak, predict_pass
from turbovae.vae.seedvr2 import SeedVR2Config, SeedVR2VAE
from turbovae.vae.wan import TINY_WAN21, WanVAE

from peak_checks import measured_and_predicted


def _models():
    torch.manual_seed(0)
    return [SeedVR2VAE(SeedVR2Config.tiny()).eval(), WanVAE(TINY_WAN21).eval()]


def test_live_bytes_counts_creations_and_frees_and_ignores_views_and_excluded():
    a = torch.ones(1000)  # 4000 bytes, made before: excluded
    with LiveBytes(exclude=[a]) as t:
        v = a[:10]  # a view of an excluded storage: not counted
        b = a * 2  # 4000
        c = b.view(10, 100)  # same storage
        d = torch.empty(500)  # 2000
        assert t.live == 6000
        del b, c
        assert t.live == 2000  # b's storage is freed once its last view is gone
        e = d.add_(1)  # in place: no new storage
        assert t.live == 2000 and e is d
    assert t.peak == 6000
    del v, d, e


CASES = [  # (decode, shape, temporal_slice): images and clips, whole and sliced, both directions
    (True, (1, None, 1, 16, 16), None),
    (True, (1, None, 3, 12, 12), 1),
    (False, (1, 3, 1, 128, 128), None),
    (False, (1, 3, 5, 96, 96), None),
]


@pytest.mark.slow
def test_prediction_matches_the_measured_cpu_peak():
    """The meta pass predicts the real CPU pass's peak as the allocator measures it (buffers inside ops included:
    vae/memory/op_rules.py) within -5 % .. +10 %, channels-last on and off (tests/test_prediction_accuracy.py checks
    every family at more sizes)."""
    for model in _models():
        for channels_last in (False, True):
            # channels-last runs in these fp32 CPU passes only where forced on (vae/accel/channels_last.py)
            with channels_last_in_cpu_fp32() if channels_last else nullcontext():
                model.fast = replace(FastPaths(), channels_last=channels_last)
                for decode, shape, k in CASES:
                    shape = tuple(model.latent_format.channels if d is None else d for d in shape)
                    measured, predicted = measured_and_predicted(model, decode, shape, k)
                    assert -0.05 * measured <= predicted - measured <= 0.10 * measured, \
                        (model.kind, channels_last, decode, shape, k, predicted, measured)


def test_long_clip_sampled_prediction_equals_the_whole_clip_meta_pass():
    """Clips of more than three slices are predicted from a run of the first two slices and the last into the
    whole output canvas; the result equals running every slice (exactly, for both architectures, both
    directions, several slices)."""
    for model in _models():
        copies = MetaPasses(model)
        clone = copies.copy(torch.float32, PassPaths.of(model, model.device, torch.float32).fast)  # the paths it runs
        c = model.latent_format.channels
        for decode, shape, k in [(True, (1, c, 12, 4, 4), 2), (False, (1, 3, 29, 32, 32), 1)]:
            predicted = predict_pass(model, shape, decode=decode, temporal_slice=k, copies=copies).pass_bytes
            every = meta_pass_peak(clone, shape, decode=decode, dtype=torch.float32, temporal_slice=k,
                                   fused_norms=False, sample=False)
            assert predicted == every, (model.kind, shape, k)


def test_prediction_grows_with_the_slice_and_counts_weights_and_input_apart():
    model = WanVAE(TINY_WAN21)
    shape = (1, 4, 9, 8, 8)
    peaks = [predict_pass(model, shape, decode=True, temporal_slice=k).pass_bytes for k in (1, 2, 4, None)]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]
    p = predict_pass(model, shape, decode=True, dtype=torch.bfloat16)
    assert p.input_bytes == 4 * 9 * 8 * 8 * 2
    assert p.weight_bytes == sum(t.numel() for t in model.parameters()) * 2 + sum(
        t.numel() * 2 for t in model.buffers() if t.is_floating_point())
    assert p.total_bytes == p.pass_bytes + p.input_bytes + p.weight_bytes
    half = predict_pass(model, shape, decode=True, dtype=torch.bfloat16).pass_bytes
    assert half < predict_pass(model, shape, decode=True, dtype=torch.float32).pass_bytes


def test_fused_norms_are_predicted_as_one_output_per_norm():
    """On a GPU the fused kernels replace the PyTorch norm's fp32 copy and intermediates by one output: the meta
    pass with them predicts less for a bf16 Wan decode (its RMS norms upcast), never more."""
    model = WanVAE(TINY_WAN21)
    shape = (1, 4, 3, 8, 8)
    plain = predict_pass(model, shape, decode=True, dtype=torch.bfloat16, paths=PassPaths(model.fast, False, "cuda"))
    fused = predict_pass(model, shape, decode=True, dtype=torch.bfloat16, paths=PassPaths(model.fast, True, "cuda"))
    assert fused.pass_bytes < plain.pass_bytes


# -- the budget ------------------------------------------------------------------------------------------


def test_budget_default_and_typed_errors():
    assert 0 < default_budget_bytes("cpu") <= DEFAULT_PASS_BUDGET_BYTES
    assert MemoryBudget(123).resolve("cpu") == 123
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ValueError, match="positive number of bytes"):
            MemoryBudget(bad)


# -- plan: the function and the command --------------------------------------------------------------------


def test_plan_function_for_a_family_and_a_clip_of_any_length():
    from turbovae.vae.plan_pass import plan_pass

    short = plan_pass("wan2.1", (1, 16, 21, 90, 160), decode=True, dtype="bf16", device_type="cuda",
                      budget_bytes=12 * 2**30)
    assert short.fits and short.predicted.pass_bytes <= 12 * 2**30
    long = plan_pass("wan2.1", "1x16x61x90x160", decode=True, dtype="bf16", device_type="cuda",
                     budget_bytes=12 * 2**30)
    assert long.fits and long.predicted.pass_bytes >= short.predicted.pass_bytes - 2**20
    pixels = plan_pass("wan2.1", (1, 3, 81, 720, 1280), decode=True, dtype="bf16", device_type="cuda",
                       budget_bytes=12 * 2**30)
    assert pixels.shape == (1, 16, 21, 90, 160)  # a pixel shape is turned into its latents for decode


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_plan_in_a_tiled_mode_chooses_the_tile_that_fits(mode):
    """`plan --mode exact|fast` (and `plan_pass`) search tile sizes as auto mode does: a 1 GB budget that the default
    512 px tiles of a 720p clip exceed gets smaller tiles of that kind, not a refusal naming the 512 px floor."""
    from turbovae.vae.plan_pass import plan_pass

    budget = 2**30
    plan = plan_pass("qwen_image", (1, 16, 5, 90, 160), decode=True, dtype="fp16", device_type="cuda", mode=mode,
                     budget_bytes=budget)
    assert plan.mode == mode and plan.tile_px < 512 and plan.fits and plan.predicted.pass_bytes <= budget


def test_plan_function_typed_errors():
    from turbovae.vae.plan_pass import PlanError, plan_pass

    with pytest.raises(PlanError, match="family or a checkpoint"):
        plan_pass("no-such-family", (1, 16, 1, 8, 8), decode=True)
    with pytest.raises(PlanError, match="shape"):
        plan_pass("wan2.1", "1x16x8", decode=True)
    with pytest.raises(PlanError, match="multiples of 8"):
        plan_pass("wan2.1", (1, 3, 5, 100, 100), decode=False)
    with pytest.raises(BudgetTooSmall):
        plan_pass("wan2.1", (1, 16, 21, 90, 160), decode=True, dtype="bf16", device_type="cuda", budget_bytes=2**20)


@pytest.mark.slow
def test_plan_command_prints_the_prediction_and_the_choice(capsys):
    from turbovae.cli import main

    assert main(["plan", "seedvr2", "--shape", "1x16x6x90x160", "--dtype", "bf16", "--target", "cuda",
                 "--budget-mb", "20000"]) == 0
    out = capsys.readouterr().out
    assert "temporal slice" in out and "predicted peak" in out and "budget of 20000 MB" in out
    assert main(["plan", "qwen_image", "--shape", "1x3x1x1024x1024", "--encode", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["decode"] is False and data["pass_mb"] > 0 and data["temporal_slice"] is None
    assert main(["plan", "wan2.1", "--shape", "1x16x21x90x160", "--dtype", "bf16", "--target", "cuda",
                 "--budget-mb", "1"]) == 2
    err = capsys.readouterr().err
    assert "no plan fits the budget of 1 MB on the device and" in err and "MB of host memory; the smallest needs" in err
    assert "budget of at least that" in err


def test_gpu_bench_rows_predict_the_peak_they_measure():
    """bench/gpu.py puts the prediction beside every measured peak: the step's paths, the case's slice."""
    from turbovae.bench import gpu
    from turbovae.bench.cases import AblationCase

    model = WanVAE(TINY_WAN21)
    case = AblationCase("t", "decode", (1, 4, 3, 4, 4), 1, family="qwen_image")
    copies = MetaPasses(model)
    by_step = {s.name: gpu.predicted_peak_mb(copies, case, torch.bfloat16, 1, s, model) for s in gpu.STEPS[2:4]}
    plain = predict_pass(model, case.shape, decode=True, dtype=torch.bfloat16, temporal_slice=1,
                         paths=PassPaths(model.fast, False, "cuda")).pass_bytes / 2**20
    assert by_step["+ channels-last"] == plain
    assert 0 < by_step["+ fused norms (Triton)"] < plain
    clip = replace(case, shape=(1, 4, 5, 4, 4), temporal_slice=gpu.AUTO)  # CPU: the fastest slice, memory allowing
    assert gpu.resolve_slice(model, clip, torch.float32, torch.device("cpu")) == 2


def test_docs_table_is_rendered_from_the_committed_comparison():
    """docs/memory.md's prediction-vs-measured table is what `python -m turbovae.bench.peak_prediction --markdown`
    prints for the committed JSON, so the doc cannot claim an error the results do not hold."""
    from pathlib import Path

    from turbovae.bench.peak_prediction import markdown

    root = Path(__file__).resolve().parent.parent
    results = root / "docs" / "results" / "2026-11-26-peak-memory-prediction.json"
    table = markdown(results)
    assert table.count("\n") > 40 and table in (root / "docs" / "memory.md").read_text()
    data = json.loads(results.read_text())
    assert {p["family"] for p in data["plans"]} >= {"wan2.1", "wan2.2", "seedvr2"}


def test_the_cuda_conv_rule_holds_under_inference_mode():
    """The CUDA rule (a half-precision conv3d on contiguous tensors holds transposed copies of its input and output)
    is read off the op a prediction sees: under inference mode that is `aten.conv3d` itself, not its
    `convolution` (the rule named only `convolution`, so a prediction never applied it)."""
    from turbovae.vae.memory.op_rules import op_memory_for
    from turbovae.vae.memory.peak import LiveBytes

    x = torch.empty(1, 8, 3, 16, 16, device="meta", dtype=torch.bfloat16)
    w = torch.empty(8, 8, 3, 3, 3, device="meta", dtype=torch.bfloat16)
    nbytes = x.numel() * x.element_size()
    for mode in (torch.inference_mode, torch.no_grad):
        tracker = LiveBytes(exclude=[x, w], op_memory=op_memory_for("cuda"))
        with mode(), tracker:
            y = torch.nn.functional.conv3d(x, w, padding=1)
        out = y.numel() * y.element_size()
        assert tracker.peak == out + (nbytes + out), mode.__name__
        cl = x.contiguous(memory_format=torch.channels_last_3d)
        tracker = LiveBytes(exclude=[cl, w], op_memory=op_memory_for("cuda"))
        with mode(), tracker:
            torch.nn.functional.conv3d(cl, w, padding=1)
        assert tracker.peak == out, "channels-last convs hold nothing measurable"


def _frame_stage_peaks(key: str, shape: tuple, decode: bool, layerwise: bool) -> tuple[int, int]:
    """(sampled, every step) device peaks of a frame-stage plan of the family's real config, CUDA bf16 paths, on
    meta tensors: the untiled pass in frame stages, or (`layerwise`) exact tiles in frame stages."""
    from turbovae.vae.memory.op_rules import op_memory_for
    from turbovae.vae.memory.peak import LiveBytes
    from turbovae.vae.plan_pass import meta_model
    from turbovae.vae.planning import PlanRequest, run_plan, search
    from turbovae.vae.planning.meta_pass import meta_pass_for

    model = meta_model(key)
    paths = PassPaths.for_device_type(model, "cuda", torch.bfloat16)
    plan = next(c for c in search.candidates(model, shape, decode=decode, dtype=torch.bfloat16, device_type="cuda",
                                             request=PlanRequest(), host_is_separate=True)
                if c.frame_stages and not c.cache_on_host and (c.mode == "exact") == layerwise)
    peaks = []
    for sample in (True, False):
        clone = MetaPasses(model).copy(torch.bfloat16, paths.fast)
        x = torch.empty(shape, device="meta", dtype=torch.bfloat16)
        tracker = LiveBytes(exclude=[x, *clone.parameters(), *clone.buffers()], op_memory=op_memory_for("cuda"))
        with torch.inference_mode(), meta_pass_for("cuda", paths.fused_norms), tracker:
            out = run_plan(clone, x, plan, sample=sample, meta_tracker=tracker)
        del out
        peaks.append(tracker.peak)
    return peaks[0], peaks[1]


@pytest.mark.parametrize("decode,shape", [(True, (1, 16, 11, 24, 40)), (False, (1, 3, 41, 192, 320))],
                         ids=["decode", "encode"])
@pytest.mark.parametrize("layerwise", [False, True], ids=["untiled", "layerwise"])
def test_a_frame_stage_prediction_samples_until_every_stage_has_repeated_its_step(decode, shape, layerwise):
    """A frame-stage plan is predicted from the first input steps only (vae/tiling/frame_stages.py), fed until every
    stage has run its first step and a repeating one: the peak equals running every step. (Three input steps had
    been the rule: a SeedVR2 encode's later stages take two frames a step and had not repeated by then, so its
    1080p x 81 encode in 4 GB was predicted at 2665 MB where every step needs 2791 MB.)"""
    sampled, every = _frame_stage_peaks("seedvr2", shape, decode, layerwise)
    assert sampled == every, (sampled, every)
