"""The roofline and profile sections: FLOP/byte counting, time per kind, the rows and their rendered tables."""

from __future__ import annotations

import json

import pytest
import torch

from turbovae.bench import op_costs, profile_layers, report, roofline
from turbovae.bench.common import BenchOptions, BenchRow, row_dict


def test_kinds_of_aten_operations():
    assert op_costs.kind_of("aten::mkldnn_convolution") == "conv"
    assert op_costs.kind_of("aten.constant_pad_nd.default") == "copy/pad"
    assert op_costs.kind_of("cat") == "concat"
    assert op_costs.kind_of("aten::native_group_norm") == "norm/act"
    assert op_costs.kind_of("aten::upsample_nearest3d") == "upsample"
    assert op_costs.kind_of("aten::something_new") == op_costs.OTHER


def test_count_reads_conv_flops_and_bytes_off_the_shapes():
    x, w = torch.randn(1, 8, 4, 10, 10), torch.randn(6, 8, 3, 3, 3)
    costs = op_costs.count(lambda: torch.nn.functional.conv3d(x, w))
    out_numel = 6 * 2 * 8 * 8
    assert costs.flops["conv"] == 2 * out_numel * 8 * 27
    assert costs.bytes["conv"] == 4 * (x.numel() + w.numel() + out_numel)
    assert costs.total_flops == costs.flops["conv"]


def test_the_onednn_conv_the_package_calls_is_counted_as_pytorchs_conv():
    """On the CPU the package's conv3d runs oneDNN where PyTorch would run its im2col kernel
    (vae/accel/kernels/conv_guard.py); op_costs and the FlopCounterMode of bench/gpu.py count its FLOPs as the
    convolution's."""
    from torch.utils.flop_counter import FlopCounterMode

    from turbovae.vae.accel.kernels import conv_guard
    from turbovae.vae.memory.cpu_conv import pytorch_kernels

    x, w = torch.randn(1, 8, 4, 10, 10), torch.randn(6, 8, 3, 3, 3)
    run = lambda: conv_guard.conv3d(x, w, None, 1, (0, 1, 1))  # noqa: E731
    with torch.profiler.profile() as prof:
        run()
    assert any("mkldnn_convolution" in e.key for e in prof.key_averages())  # what this count is about
    ours = op_costs.count(run)
    with pytorch_kernels():
        theirs = op_costs.count(run)
    assert ours.flops["conv"] == theirs.flops["conv"] == 2 * (6 * 2 * 10 * 10) * 8 * 27
    counter = FlopCounterMode(display=False, custom_mapping=op_costs.EXTRA_FLOP_FORMULAS)
    with counter:
        run()
    assert counter.get_total_flops() == ours.flops["conv"]


def test_count_skips_views_and_counts_copies_once_in_place():
    x = torch.randn(4, 256)
    costs = op_costs.count(lambda: x.view(16, 64).transpose(0, 1)[:3])
    assert costs.total_bytes == 0  # views move nothing
    y = torch.empty(4, 256)
    costs = op_costs.count(lambda: y.copy_(x))
    assert costs.bytes["copy/pad"] == 2 * x.numel() * 4  # read + write; the returned self is not counted again
    assert costs.total_flops == 0


def test_time_by_kind_attributes_self_time():
    x, w = torch.randn(1, 16, 34, 34), torch.randn(16, 16, 3, 3)
    ms = op_costs.time_by_kind(lambda: torch.cat([torch.nn.functional.conv2d(x, w)] * 2), torch.device("cpu"))
    assert set(ms) == set(op_costs.KINDS)
    assert ms["conv"] > 0 and ms["concat"] > 0 and ms["attention"] == 0


def test_peak_probe_counts_its_flops():
    conv = roofline.probes(torch.device("cpu"), quick=True)[0]
    row = roofline.measure_peak(conv, torch.device("cpu"), torch.float32, repeat=2)
    assert row.gflop == pytest.approx(2 * 64 * 5 * 16 * 16 * 64 * 27 / 1e9)
    assert row.gflop_per_s == pytest.approx(row.gflop / (row.ms / 1e3))


def _costs(conv_flops: float, other_flops: float, nbytes: float) -> op_costs.Costs:
    costs = op_costs.Costs()
    costs.flops["conv"], costs.flops["attention"], costs.bytes["conv"] = conv_flops, other_flops, nbytes
    return costs


def test_case_row_picks_the_bounding_peak():
    peaks = roofline.Peaks(conv_gflop_per_s=400.0, gemm_gflop_per_s=100.0, gb_per_s=10.0)  # ridges 40 and 10
    timed = BenchRow("main", "c", "ours", ms=1000.0, baseline_ms=2000.0)
    conv = roofline.case_row("c", timed, _costs(200e9, 0, 1e9), peaks)
    assert (conv.peak_used, conv.pct_of_peak, conv.bound) == ("conv", 50.0, "conv arithmetic")
    assert conv.flop_per_byte == 200 and conv.gb_per_s == 1.0
    thin = roofline.case_row("c", timed, _costs(20e9, 0, 1e9), peaks)  # 20 FLOP/byte < ridge 40
    assert thin.bound == "memory bandwidth"
    gemm = roofline.case_row("c", timed, _costs(10e9, 90e9, 1e9), peaks)
    assert (gemm.peak_used, gemm.pct_of_peak, gemm.bound) == ("GEMM", 100.0, "GEMM arithmetic")


def _results_file(tmp_path, rows) -> str:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"rows": [row_dict(r) for r in rows]}))
    return str(path)


def test_report_renders_each_table_from_its_rows(tmp_path):
    peak = roofline.RooflineRow("roofline", "machine peak", "copy 1 MiB", 1.0, gb_touched=0.002, gb_per_s=2.0)
    prof = profile_layers.ProfileRow("profile", "SeedVR2 5-frame decode 64²", "turbovae", 2000.0, frames=5,
                                     ms_by_kind={"conv": 1500.0, "copy/pad": 500.0}, gflop_by_kind={"conv": 300.0})
    main_row = BenchRow("main", "case", "turbovae", 10.0, 20.0)
    path = _results_file(tmp_path, [peak, prof, main_row])
    assert [r["case"] for r in report.load_rows(path + "#profile")] == [prof.case]
    assert len(report.load_rows(path + "#results")) == 1 and len(report.load_rows(path)) == 3
    with pytest.raises(ValueError, match="cannot share one table"):
        report.format_markdown(report.load_rows(path))
    profile_md = report.format_markdown(report.load_rows(path + "#profile"))
    assert "| 2.00 s | 0.40 s | 200 | 1.50 s (75 %) | 0.50 s (25 %) |" in profile_md
    assert "| machine peak | copy 1 MiB | 0.00 s |  |  |  | 0.00 | 2.0 |  |  |" in report.format_markdown(
        report.load_rows(path + "#roofline"))
    assert report.main([path]) == 2  # mixed tables: a typed message, not a traceback


@pytest.mark.slow
def test_roofline_section_quick_runs_a_case_against_measured_peaks():
    rows = roofline.run(BenchOptions(quick=True, repeat=1, cases=("SeedVR2",)))
    peaks = [r for r in rows if r.case == "machine peak"]
    cases = [r for r in rows if r.case != "machine peak"]
    flops = [r for r in cases if isinstance(r, roofline.FlopRow)]
    timed = [r for r in cases if not isinstance(r, roofline.FlopRow)]
    assert len(peaks) == 5 and len(timed) == 2 and timed[0].reference
    gemm, via_conv = (next(r for r in peaks if r.variant.startswith(p)) for p in ("GEMM", "matmul"))
    assert via_conv.gflop == pytest.approx(gemm.gflop)  # the same product, counted as the same FLOPs
    assert all(r.gflop > 0 and r.pct_of_peak > 0 and r.bound for r in timed)
    assert len(flops) == 2 * 10 and all(r.gflop > 0 for r in flops)  # the case table's SeedVR2 FLOP rows (bench/cases.py)
    for table in ("roofline", "flops"):
        mine = [row_dict(r) for r in rows if r.table == table]
        assert report.format_markdown(mine).count("\n") == len(mine) + 1


def test_flop_counts_on_meta_follow_the_fast_paths():
    """The image path's summed taps cut the decode FLOPs (about 3x at full size); on a 5-frame Wan clip the head
    taps skip the zero padding's taps of every 3-frame causal conv (a third of the 2-latent-frame layers, a fifth of
    the 5-frame ones), so ours counts fewer FLOPs than diffusers, but not image-path fewer."""
    rows = {(r.case, r.reference): r for r in roofline.flop_rows(BenchOptions(quick=True), torch.float32,
                                                                  roofline.Peaks(100.0, 10.0, 1.0))}
    ours, ref = rows[("SeedVR2 image decode 32²", False)], rows[("SeedVR2 image decode 32²", True)]
    assert ours.gflop < ref.gflop and ours.speedup == pytest.approx(ref.gflop / ours.gflop)
    assert ours.ms == pytest.approx(ours.gflop / 100.0 * 1e3)  # the FLOPs at the conv peak
    wan = rows[("Wan 2.1 5-frame decode 32²", False)], rows[("Wan 2.1 5-frame decode 32²", True)]
    assert 1.1 < wan[1].gflop / wan[0].gflop < 1.5
