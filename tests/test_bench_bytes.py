"""The byte roofline (bench/bytes_roofline.py): exact byte counts of known operations, per-kind counts of a
tiny pass, floors from the one table of device peaks, and the join with measured GPU rows."""

from __future__ import annotations

import pytest
import torch

from turbovae.bench import bytes_roofline, gpu, op_costs, report
from turbovae.bench.common import BenchOptions
from turbovae.bench.device_peaks import DEVICE_PEAKS, DevicePeak, peak_of


def test_cat_bytes_are_its_inputs_and_output():
    a, b = torch.randn(2, 3, 5), torch.randn(2, 4, 5)
    costs = op_costs.count(lambda: torch.cat([a, b], dim=1))
    assert costs.bytes["concat"] == (30 + 40 + 70) * 4
    assert costs.total_bytes == costs.bytes["concat"] and costs.total_flops == 0


def test_group_norm_bytes_are_input_affine_output_and_statistics():
    x, w, b = torch.randn(2, 8, 4, 4), torch.randn(8), torch.randn(8)
    costs = op_costs.count(lambda: torch.nn.functional.group_norm(x, 4, w, b))
    # native_group_norm reads x, weight, bias and writes y, mean and rstd (one per batch and group)
    assert costs.bytes["norm/act"] == (256 + 8 + 8 + 256 + 8 + 8) * 4
    assert costs.total_bytes == costs.bytes["norm/act"]


def test_conv_bytes_on_meta_equal_those_on_cpu():
    x, w, b = torch.randn(1, 4, 6, 6), torch.randn(8, 4, 3, 3), torch.randn(8)
    cpu = op_costs.count(lambda: torch.nn.functional.conv2d(x, w, b))
    meta = op_costs.count(lambda: torch.nn.functional.conv2d(x.to("meta"), w.to("meta"), b.to("meta")))
    assert cpu.bytes["conv"] == meta.bytes["conv"] == (144 + 288 + 8 + 8 * 16) * 4
    assert cpu.flops["conv"] == meta.flops["conv"] == 2 * 8 * 16 * 4 * 9


def test_floor_is_the_larger_of_flop_and_byte_time():
    peak = DevicePeak("test", bf16_tflops=1.0, tb_per_s=1.0)
    costs = op_costs.Costs()
    costs.flops["conv"], costs.bytes["conv"], costs.bytes["copy/pad"] = 3e12, 1e12, 1e12
    row = bytes_roofline.floor_row("c", "v", costs, peak, torch.bfloat16)
    assert (row.flop_floor_ms, row.byte_floor_ms, row.ms) == (3000.0, 2000.0, 3000.0)
    assert row.bound == "arithmetic" and row.gb_by_kind["copy/pad"] == 1000.0
    costs.bytes["add/mul"] = 2e12
    assert bytes_roofline.floor_row("c", "v", costs, peak, torch.bfloat16).bound == "memory bandwidth"


def test_gpu_flop_peaks_come_from_the_one_table():
    assert gpu.PEAK_TFLOPS == {k: p.bf16_tflops for k, p in DEVICE_PEAKS.items()}
    assert peak_of("NVIDIA H100 80GB HBM3") is DEVICE_PEAKS["H100"]
    assert DEVICE_PEAKS["H100"].bf16_tflops == 989.0 and DEVICE_PEAKS["H100"].tb_per_s == 3.35
    assert peak_of("Some Other GPU") is None


def test_tiny_passes_count_every_main_kind_and_bytes_follow_the_flops():
    cases = bytes_roofline.cases(quick=True)
    rows = bytes_roofline.rows_for(cases, True, torch.bfloat16, DEVICE_PEAKS["H100"])
    ours = [r for r in rows if not r.reference]
    assert [r.case for r in ours] == [c.name for c in cases]
    for r in ours:
        for kind in ("conv", "norm/act", "add/mul"):
            assert r.gb_by_kind[kind] > 0, (r.case, kind)
        assert r.gflop > 0 and r.gb_touched == pytest.approx(sum(r.gb_by_kind.values()))
        assert r.ms == max(r.flop_floor_ms, r.byte_floor_ms) > 0
    # more frames, more of both: the 9-frame Wan clip counts more FLOPs and bytes than the Wan image
    image, clip = (next(r for r in ours if r.case.startswith(p)) for p in ("qwen decode", "wan2.1 9f decode"))
    assert clip.gflop > image.gflop and clip.gb_touched > image.gb_touched


def test_measured_rows_join_the_counted_step_and_the_best():
    peak = DEVICE_PEAKS["H100"]
    costs = op_costs.Costs()
    costs.flops["conv"], costs.bytes["conv"] = 989e12, 3.35e12  # 1 s either way
    measured = [{"case": "c", "variant": "eager baseline", "ms": 4000.0},
                {"case": "c", "variant": bytes_roofline.COUNTED_STEP, "ms": 2000.0},
                {"case": "c", "variant": "+ compile (per region)", "ms": 1250.0},
                {"case": "c", "variant": "+ CUDA graphs", "ms": float("nan")},
                {"case": "c", "variant": bytes_roofline.DIFFUSERS, "ms": 5000.0},
                {"case": "other", "variant": bytes_roofline.COUNTED_STEP, "ms": 1.0}]
    ours = bytes_roofline.attach_measured(bytes_roofline.floor_row("c", "v", costs, peak, torch.bfloat16), measured)
    assert (ours.measured_ms, ours.pct_of_floor) == (2000.0, pytest.approx(50.0))
    assert (ours.best_ms, ours.best_path) == (1250.0, "+ compile (per region)")
    ref = bytes_roofline.attach_measured(
        bytes_roofline.floor_row("c", "d", costs, peak, torch.bfloat16, reference=True), measured)
    assert (ref.measured_ms, ref.best_ms, ref.pct_of_floor) == (5000.0, 5000.0, pytest.approx(20.0))
    alone = bytes_roofline.attach_measured(bytes_roofline.floor_row("x", "v", costs, peak, torch.bfloat16), measured)
    assert alone.measured_ms is None and alone.best_ms is None


def test_a_file_that_is_not_a_results_file_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="bad.json"):
        bytes_roofline.load_measured([bad])


def test_section_quick_rows_render_as_the_bytes_table():
    rows = bytes_roofline.run(BenchOptions(quick=True, cases=("seedvr2",)))
    assert len(rows) == 1
    dicts = [dict(vars(r)) for r in rows]
    table = report.format_markdown(dicts)
    assert table.splitlines()[0] == "| " + " | ".join(report.BYTES_HEADER) + " |"
    assert "seedvr2 5f decode 16² (tiny)" in table and "(H100 SXM)" in table


def test_gpu_ablation_counts_the_flops_of_the_paths_each_step_runs():
    """The floor column of bench/gpu.py: the image path runs fewer FLOPs than the plain path, so each step's
    floor is from its own paths, counted once per setting."""
    from turbovae.bench.models import build_model

    opts = BenchOptions(quick=True)
    model = build_model("qwen", opts, True)
    case = gpu.cases(False, True)[0]  # the tiny image decode
    x = torch.randn(case.shape)
    counted: dict = {}
    plain_step, fast_step = gpu.STEPS[0], gpu.STEPS[1]
    gpu.set_arch_paths(model, fast=False, channels_last=False)
    plain = gpu.step_flops(model, case, x, None, plain_step, counted)
    gpu.set_arch_paths(model, fast=True, channels_last=False)
    fast = gpu.step_flops(model, case, x, None, fast_step, counted)
    assert 0 < fast < plain
    gpu.set_arch_paths(model, fast=False, channels_last=False)  # cached: a later fast step reuses its count
    assert gpu.step_flops(model, case, x, None, gpu.STEPS[2], counted) == fast and len(counted) == 2


def test_parts_of_a_composite_count_as_its_kind():
    """upsample_nearest3d decomposes into an index gather: its bytes are upsampling, not a copy."""
    x = torch.randn(1, 2, 2, 3, 3)
    costs = op_costs.count(lambda: torch.nn.functional.interpolate(x, scale_factor=(1, 2, 2), mode="nearest"))
    assert costs.bytes["upsample"] >= (36 + 144) * 4 and costs.bytes["copy/pad"] == 0
    rms = op_costs.count(lambda: torch.nn.functional.rms_norm(x.movedim(1, -1), (2,)))
    assert rms.bytes["norm/act"] > 0 and rms.bytes["add/mul"] == 0


def test_single_buffer_removes_the_causal_concatenation_and_changes_nothing():
    """The byte-cut section at its tiny size: with `single_buffer` the Wan clip pass touches fewer bytes (the concat
    in front of each later slice's norm → conv is gone, bench/byte_cuts.py), its output is the same, and the rows
    render as the cuts table."""
    from turbovae.bench import byte_cuts

    rows = byte_cuts.run(BenchOptions(quick=True, repeat=1))
    on, off = (next(r for r in rows if r.variant == f"{side} single_buffer") for side in ("with", "without"))
    assert off.reference and not on.reference
    assert on.gb_removed == pytest.approx(off.gb_touched - on.gb_touched) and on.gb_removed > 0
    assert on.gb_by_kind["concat"] < off.gb_by_kind["concat"]
    # fp32's bar for a fast path: the CPU pass runs contiguous, where the norm's SiLU writing into the frames slot of
    # the padded buffer (strided there) takes PyTorch's scalar loop instead of the vectorised one, an ulp apart
    assert on.max_abs_err <= 1e-5
    table = report.format_markdown([dict(vars(r)) for r in rows])
    assert table.splitlines()[0] == "| " + " | ".join(report.CUTS_HEADER) + " |"


def test_an_allocation_moves_no_bytes():
    """`empty` hands out memory nobody has written: only the op that fills it counts (a padded buffer written in
    place must not count twice)."""
    costs = op_costs.count(lambda: torch.empty(1000, device="meta").fill_(1.0))
    assert costs.total_bytes == 4000
