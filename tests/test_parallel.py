"""Sharded exact passes (turbovae.decode_parallel / encode_parallel) equal the single-device exact pass:
both architectures, decode and encode, images and clips, odd heights, N = 2 and 3, through both entry
points (several CPU `devices` in one process; a gloo group of spawned processes); cancel and failure stop
every rank without a hang."""

from __future__ import annotations

import os
import sys
import threading
import time
from fractions import Fraction

import pytest
import torch
import torch.multiprocessing as mp

from turbovae import ParallelPassError, decode_parallel, decode_tiled, encode_parallel, encode_tiled
from turbovae.vae.memory.cpu_conv import pytorch_kernels
from turbovae.vae.parallel.bands import BandPlan
from turbovae.vae.parallel.collectives import run_on_devices

sys.path.insert(0, os.path.dirname(__file__))
import parallel_worker as pw  # noqa: E402

TOL = 1e-5


def _single(vae, x, decode: bool, tile: int = pw.TILE):
    run = decode_tiled if decode else encode_tiled
    return run(vae, x, mode="exact", tile_px=tile, temporal_slice=1)


def _assert_equal(out, ref, vae, x, decode: bool, tile: int):
    """≤ 1e-5, or — for the tiny random SeedVR2, whose stacked GroupNorms amplify fp32 rounding — within 2×
    the fp32 floor of "exact": the larger difference from the single-device pass of two passes that differ from it
    only in tile size or in their convolution kernels (PyTorch's own choice instead of oneDNN on small shapes;
    a band's convolutions are smaller than the whole frame's, and oneDNN's rounding follows the shape). A wrong
    halo or statistic is orders of magnitude above it."""
    assert out.shape == ref.shape
    err = (out - ref).abs().max().item()
    if err <= TOL:
        return
    floor = (_single(vae, x, decode, 2 * tile) - ref).abs().max().item()
    with pytorch_kernels():
        floor = max(floor, (_single(vae, x, decode, tile) - ref).abs().max().item())
    assert err <= 2 * floor and err <= 1e-4, (err, floor)


@pytest.mark.parametrize("kind,n,frames,hw", [
    ("seedvr2", 2, 1, (9, 6)), ("seedvr2", 3, 2, (7, 5)),
    ("seedvr2", 2, 3, (8, 8)),  # causal caches carried between slices through the upsamplers' doubled halos
    ("wan2.1", 3, 1, (19, 10)), ("wan2.1", 2, 3, (7, 5)),  # 19 rows: several tiles per band
    ("wan2.2", 3, 2, (5, 7)), ("wan2.2", 2, 1, (5, 7)),
    ("qwen_image_layered", 2, 1, (7, 5)),  # RGBA in and out
])
def test_devices_mode_equals_single_device_exact(kind, n, frames, hw):
    vae = pw.build(kind)
    tile = 128 if kind == "wan2.2" else pw.TILE  # ≥ 8 latents; Wan 2.2 is 16 px per latent
    h, w = hw
    z = torch.randn(1, vae.latent_channels, frames, h, w, generator=torch.Generator().manual_seed(1))
    out = decode_parallel(vae, z, devices=["cpu"] * n, tile_px=tile, temporal_slice=1)
    _assert_equal(out, _single(vae, z, True, tile), vae, z, True, tile)
    f = vae.spatial_factor
    x = torch.rand(1, vae.image_channels, 4 * frames - 3, h * f, w * f, generator=torch.Generator().manual_seed(2)) * 2 - 1
    lat = encode_parallel(vae, x, devices=["cpu"] * n, tile_px=tile, temporal_slice=1)
    _assert_equal(lat, _single(vae, x, False, tile), vae, x, False, tile)


@pytest.mark.parametrize("kind,decode,n,frames", [
    ("wan2.1", True, 3, 3), ("wan2.1", False, 2, 2), ("wan2.2", True, 2, 2), ("wan2.2", False, 3, 1),
])
def test_wan_bands_exchange_halo_rows_per_stage_and_equal_single_device(kind, decode, n, frames, monkeypatch):
    """Bands that fit their share of the tile run each local stage once with halo rows from the neighbours
    (no recomputed overlap); odd heights, clips streamed slice by slice; equal to the single-device pass."""
    from turbovae.vae.parallel import sharded
    from turbovae.vae.parallel.band_chain import can_exchange

    calls = []
    real = sharded.run_band_chain
    monkeypatch.setattr(sharded, "run_band_chain", lambda *a, **k: calls.append(1) or real(*a, **k))
    vae = pw.build(kind)
    f = vae.spatial_factor
    h, w = 27, 6
    tile = 16 * f  # 16 latents: a 9-row band is one tile of ≤ 256/N latent pixels
    bands = BandPlan.split(h, w, n)
    plan = vae.model.exact_plan(decode=decode)
    assert can_exchange(plan, bands, Fraction(1 if decode else f))
    assert all(len(bands.tiles(r, 16, n)) == 1 for r in range(n))
    g = torch.Generator().manual_seed(3)
    if decode:
        x = torch.randn(1, vae.latent_channels, frames, h, w, generator=g)
    else:
        x = torch.rand(1, vae.image_channels, 4 * frames - 3, h * f, w * f, generator=g) * 2 - 1
    run = decode_parallel if decode else encode_parallel
    out = run(vae, x, devices=["cpu"] * n, tile_px=tile, temporal_slice=1)
    assert calls, "the bands recomputed their overlap instead of exchanging halo rows"
    _assert_equal(out, _single(vae, x, decode, tile), vae, x, decode, tile)


def test_bands_thinner_than_a_stage_halo_recompute_their_overlap(monkeypatch):
    from turbovae.vae.parallel import sharded
    from turbovae.vae.parallel.band_chain import can_exchange

    monkeypatch.setattr(sharded, "run_band_chain", lambda *a, **k: pytest.fail("exchanged with too thin bands"))
    vae = pw.build("wan2.1")
    z = torch.randn(1, vae.latent_channels, 1, 6, 5, generator=torch.Generator().manual_seed(4))
    assert not can_exchange(vae.model.exact_plan(decode=True), BandPlan.split(6, 5, 3), Fraction(1))
    out = decode_parallel(vae, z, devices=["cpu"] * 3, tile_px=0)
    _assert_equal(out, decode_tiled(vae, z, mode="exact", tile_px=1024), vae, z, True, 1024)


def test_four_d_input_and_auto_slices_and_progress_ticks_to_total():
    vae = pw.build("seedvr2")
    z = torch.randn(1, vae.latent_channels, 6, 8)
    calls = []
    out = decode_parallel(vae, z, devices=["cpu", "cpu"], progress=lambda d, t: calls.append((d, t)))
    assert out.ndim == 4 and (out - decode_tiled(vae, z, mode="exact")).abs().max().item() <= TOL
    assert calls and calls[-1][0] == calls[-1][1] and [d for d, _ in calls] == list(range(1, len(calls) + 1))


# -- tile_px=0: the tile and slice whose predicted per-rank peak fits each band's share of the budget (issue 49) --
# The quick tier runs one case, the full tier both directions of all three families (tiny configs, as
# tests/test_planner.py).
BUDGET_CASES = [pytest.param(key, decode, marks=() if (key, decode) == ("qwen_image", False) else pytest.mark.slow)
                for key in ("seedvr2", "qwen_image", "wan2.2") for decode in (True, False)]


def _family_vae(key: str):
    from turbovae import TurboVAE
    from turbovae.bench.models import seeded_init
    from turbovae.vae.registry import family

    fam = family(key)
    torch.manual_seed(0)
    return TurboVAE(seeded_init(fam.build_model(fam.config(real=False))).eval())


def _clip(vae, decode: bool) -> torch.Tensor:
    """A small non-square clip of 5 latent frames (17 pixel frames to encode)."""
    fmt, f = vae.latent_format, vae.spatial_factor
    h, w = (16, 24) if f == 8 else (8, 12)
    g = torch.Generator().manual_seed(1)
    if decode:
        return torch.randn(1, fmt.channels, 5, h, w, generator=g)
    return torch.rand(1, fmt.image_channels, fmt.pixel_frames(5), h * f, w * f, generator=g) * 2 - 1


@pytest.mark.parametrize("key,decode", BUDGET_CASES)
def test_tile_px_0_runs_within_each_bands_share_of_the_budget_as_predicted(key, decode, caplog):
    """Two bands on the CPU share its budget. The budget is what the single-device exact plan of the whole frame
    needs (the old `tile_px=0` sized the bands' tiles from that plan and ran over it: rank 0 alone used more than
    half of it). Rank 0's peak, measured by the CPU allocator (the profiler sees the calling thread, which runs
    rank 0), is within its half and within 10 % of its prediction; the ranks' predictions together are within the
    budget; the result equals the single-device exact pass."""
    import logging

    from turbovae import MemoryBudget
    from turbovae.vae.memory.allocator import measure_peak

    vae = _family_vae(key)
    x = _clip(vae, decode)
    shape = tuple(vae.pad_frames(x).shape) if not decode else tuple(x.shape)
    budget = vae.plan(shape, decode=decode, mode="exact", tile_px=0, budget_bytes=2**40,
                      allow_host=False).predicted.pass_bytes
    vae.budget = MemoryBudget(pass_bytes=budget)
    run = decode_parallel if decode else encode_parallel
    with caplog.at_level(logging.INFO, logger="turbovae"), torch.inference_mode():
        measured, out = measure_peak(lambda: run(vae, x, devices=["cpu", "cpu"], tile_px=0), "cpu")
    assert measured.device_bytes <= budget // 2, (measured.device_bytes / 2**20, budget / 2**20)

    from turbovae.vae.parallel import plan_parallel  # the plan it ran (its predictions are remembered)

    plan = plan_parallel(vae, x.shape, decode=decode, devices=["cpu", "cpu"])
    assert abs(measured.device_bytes - plan.peaks[0]) <= 0.10 * measured.device_bytes, (measured, plan.describe())
    assert sum(plan.peaks) <= budget and all(p <= budget // 2 for p in plan.peaks)
    assert any("predicted peak per rank" in r.getMessage() and f"tiles {plan.tile_latent * vae.spatial_factor} px"
               in r.getMessage() for r in caplog.records)
    vae.budget = MemoryBudget()
    tile = plan.tile_latent * vae.spatial_factor
    _assert_equal(out, _single(vae, x, decode, tile), vae, x, decode, tile)


def test_tile_px_0_below_every_plan_names_the_smallest_budget_that_works():
    import re

    from turbovae import MemoryBudget
    from turbovae.vae.memory.budget import BudgetTooSmall
    from turbovae.vae.parallel import plan_parallel

    vae = _family_vae("qwen_image")
    z = _clip(vae, True)
    vae.budget = MemoryBudget(pass_bytes=2**20)
    with pytest.raises(BudgetTooSmall) as err:
        decode_parallel(vae, z, devices=["cpu", "cpu"], tile_px=0)
    need = int(re.search(r"the smallest needs (\d+) MB", str(err.value)).group(1))
    assert "shared by 2 bands" in str(err.value) and "MemoryBudget" in str(err.value)
    assert -(-err.value.need_bytes // 2**20) == need and err.value.floor in str(err.value)  # carried for code
    vae.budget = MemoryBudget(pass_bytes=need * 2**20)
    plan = plan_parallel(vae, z.shape, decode=True, devices=["cpu", "cpu"])  # the budget it names is enough
    assert all(p <= need * 2**20 // 2 for p in plan.peaks)


def test_band_plan_splits_evenly_and_gives_every_rank_the_same_tile_count():
    plan = BandPlan.split(11, 9, 3)
    assert plan.bounds == (0, 4, 7, 11) and plan.counts() == [4, 3, 4]
    assert {len(plan.cores(r, 2)) for r in range(3)} == {2}
    assert [c for r in range(3) for c in plan.cores(r, 2)][-1] == (9, 11)
    with pytest.raises(ValueError, match="at most 4 devices"):
        BandPlan.split(4, 9, 5)


@pytest.mark.parametrize("h,w,n,tile", [(64, 64, 2, 64), (128, 128, 2, 64), (135, 240, 4, 64), (11, 9, 3, 8),
                                        (68, 120, 3, 32)])
def test_band_tiles_cover_each_band_once_with_one_nth_of_a_tile_each(h, w, n, tile):
    """The N bands share one single-device tile's working memory: each band tile ≤ tile²/N latent pixels."""
    plan = BandPlan.split(h, w, n)
    counts = set()
    for r in range(n):
        a, b = plan.rows(r)
        tiles = plan.tiles(r, tile, n)
        counts.add(len(tiles))
        cover = torch.zeros(h, w, dtype=torch.int32)
        for (r0, r1), (c0, c1) in tiles:
            assert r1 - r0 <= tile and c1 - c0 <= tile
            assert (r1 - r0) * (c1 - c0) <= max(tile * tile // n, 2 * (r1 - r0))
            cover[r0:r1, c0:c1] += 1
        assert cover[a:b].eq(1).all() and cover.sum() == (b - a) * w
    assert len(counts) == 1  # the same tile count on every rank: progress ticks line up
    whole = plan.tiles(0, max(h, w), 1)  # share=1 (tile from each device's free memory): the band whole
    assert [c for _, c in whole] == [(0, w)]


def test_bad_arguments_are_clear_errors():
    vae = pw.build("wan2.1")
    z = torch.randn(1, vae.latent_channels, 1, 3, 4)
    with pytest.raises(ValueError, match="not both"):
        decode_parallel(vae, z, devices=["cpu"], group=object())
    with pytest.raises(ValueError, match="at most 3 devices"):
        decode_parallel(vae, z, devices=["cpu"] * 4)
    with pytest.raises(ValueError, match="does not exist|only CUDA and CPU|torch devices"):
        decode_parallel(vae, z, devices=["cuda:7"] if not torch.cuda.is_available() else ["meta"])


def test_cancel_on_rank_0_stops_every_device_thread():
    vae = pw.build("seedvr2")
    z = torch.randn(1, vae.latent_channels, 2, 7, 9)

    def cancel(done, total):
        if done == 2:
            raise KeyboardInterrupt("user pressed cancel")

    before = threading.active_count()
    with pytest.raises(KeyboardInterrupt, match="user pressed cancel"):
        decode_parallel(vae, z, devices=["cpu"] * 3, tile_px=pw.TILE, temporal_slice=1, progress=cancel)
    assert threading.active_count() == before  # no band thread left waiting


def test_a_posted_band_is_not_kept_after_its_exchange():
    """A tensor a thread posts to an exchange is let go once every thread has read it: before, the slot held it
    until the next exchange (in a band chain, the whole output of the stage a halo was cut from)."""
    import weakref

    def body(comm):
        band = torch.ones(1, 2, 3, 4)
        ref = weakref.ref(band)
        comm.all_gather_rows(band, [3, 3])
        del band
        return ref() is None

    assert run_on_devices([torch.device("cpu")] * 2, body)


def test_a_failing_band_stops_the_others_with_its_own_error():
    def body(comm):
        comm.any_failed(False)
        if comm.rank == 1:
            raise ValueError("band 1 failed")
        comm.all_reduce_sum(torch.ones(2))  # ranks 0 and 2 wait here for rank 1, which never comes
        return "unreachable"

    t0 = time.monotonic()
    with pytest.raises(ValueError, match="band 1 failed") as info:
        run_on_devices([torch.device("cpu")] * 3, body)
    assert time.monotonic() - t0 < 5
    assert any("rank 1" in note for note in getattr(info.value, "__notes__", []))


@pytest.mark.slow
def test_gloo_group_of_spawned_processes_equals_single_device(tmp_path):
    world = 3
    mp.start_processes(pw.rank_main, args=(world, str(tmp_path)), nprocs=world, start_method="spawn")
    reports = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]
    for kind, decode, frames, hw, tile in pw.CASES:
        vae = pw.build(kind)
        x = pw.case_input(vae, decode, frames, hw)
        ref = _single(vae, x, decode, tile)
        for rep in reports:  # every rank returns the whole result
            _assert_equal(rep[f"{kind}-{decode}-{frames}-{hw}"], ref, vae, x, decode, tile)
    auto = [rep["auto"] for rep in reports]  # tile_px=0: rank 1's smaller budget decides for every rank
    assert len({a["ran"] for a in auto}) == 1 and auto[0]["ran"] != auto[0]["roomy"]
    for a in auto:
        assert a["measured"] <= a["limit"] and abs(a["measured"] - a["predicted"]) <= 0.10 * a["measured"], a
    vae = pw.build("wan2.1")
    z = pw.case_input(vae, True, pw.AUTO_FRAMES, pw.TALL)
    for a in auto:
        _assert_equal(a["out"], _single(vae, z, True, pw.TALL_TILE), vae, z, True, pw.TALL_TILE)
    assert reports[1]["cancel"] == "KeyboardInterrupt"
    assert reports[0]["cancel"] == reports[2]["cancel"] == "ParallelPassError"
    assert reports[1]["failure"] == "ValueError"  # its own input check
    assert reports[0]["failure"] == reports[2]["failure"] == "ParallelPassError"
    assert all(rep["failure_seconds"] < 30 for rep in reports)  # the group's 4 s timeout, not a hang


def test_command_line_decodes_and_encodes_files_over_devices(tmp_path, capsys):
    import json

    from safetensors.torch import load_file, save_file

    from turbovae import cli, load_vae
    from turbovae.vae.wan.config import TINY_WAN21, diffusers_kwargs

    folder = tmp_path / "vae"
    folder.mkdir()
    model = pw.build("wan2.1").model
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              str(folder / "diffusion_pytorch_model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"_class_name": "AutoencoderKLQwenImage",
                                                    **diffusers_kwargs(TINY_WAN21)}))
    z = torch.randn(1, 4, 2, 9, 7, generator=torch.Generator().manual_seed(3))
    save_file({"latents": z}, str(tmp_path / "in.safetensors"))
    args = ["decode", "--vae", str(folder), "--input", str(tmp_path / "in.safetensors"), "--devices", "cpu,cpu",
            "--tile", "64"]
    assert cli.main(args + ["--output", str(tmp_path / "out.safetensors")]) == 0
    vae = load_vae(str(folder), device="cpu")
    out = load_file(str(tmp_path / "out.safetensors"))["pixels"]
    assert (out - decode_tiled(vae, z, mode="exact", tile_px=64)).abs().max().item() <= TOL
    capsys.readouterr()
    assert cli.main(args + ["--output", str(tmp_path / "out.safetensors")]) == 2  # exists: one line, no traceback
    assert "--overwrite" in capsys.readouterr().err
    assert cli.main(args + ["--output", str(tmp_path / "frame.png")]) == 0
    frames = sorted(tmp_path.glob("frame_*.png"))
    assert len(frames) == 5
    enc = ["encode", "--vae", str(folder), "--input", *map(str, frames), "--devices", "cpu,cpu", "--tile", "64",
           "--output", str(tmp_path / "lat.safetensors")]
    assert cli.main(enc) == 0
    assert load_file(str(tmp_path / "lat.safetensors"))["latents"].shape == (1, 4, 2, 9, 7)
    assert "steps" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["seedvr2", "qwen"])
def test_real_configs_small_frame_equal_single_device(kind):
    from turbovae import TurboVAE
    from turbovae.bench.models import seeded_init
    from turbovae.vae.seedvr2 import SeedVR2Config, SeedVR2VAE
    from turbovae.vae.wan import WAN21, WanVAE

    model = SeedVR2VAE(SeedVR2Config()) if kind == "seedvr2" else WanVAE(WAN21)
    vae = TurboVAE(seeded_init(model))
    z = torch.randn(1, vae.latent_channels, 1, 5, 4, generator=torch.Generator().manual_seed(4))  # odd: 3 + 2 rows
    out = decode_parallel(vae, z, devices=["cpu", "cpu"])
    assert (out - decode_tiled(vae, z, mode="exact")).abs().max().item() <= TOL


@pytest.mark.gpu
def test_devices_mode_mixing_cuda_and_cpu_equals_single_device():
    """The devices= path on CUDA (model copied to the device, halos and sums moved between devices). The fp32
    bar is IEEE fp32's, so the comparison runs with TF32 off (`exact_fp32`): with torch's default TF32 cuDNN
    convs the CUDA rank rounds its products to 10 mantissa bits and the CPU rank does not (docs/multi_gpu.md)."""
    from turbovae.vae.precision import exact_fp32

    for kind in ("seedvr2", "wan2.1"):
        vae = pw.build(kind)
        z = torch.randn(1, vae.latent_channels, 2, 7, 5, generator=torch.Generator().manual_seed(5))
        ref = _single(vae, z, True)
        devices = ["cuda:0", "cpu"] if torch.cuda.device_count() < 2 else ["cuda:0", "cuda:1"]
        with exact_fp32():
            out = decode_parallel(vae, z, devices=devices, tile_px=pw.TILE, temporal_slice=1)
        assert out.device.type == "cpu"
        _assert_equal(out, ref, vae, z, True, pw.TILE)


def test_cost_model_reads_the_layer_shapes_and_predicts_falling_efficiency():
    from turbovae.vae.parallel import cost

    seed = cost.predict("seedvr2", True, "1080p image")
    assert [p.ranks for p in seed] == [2, 4, 8]
    for p in seed:  # SeedVR2 divides all but the attention keys/values; its halos are a few rows per conv
        assert p.total_tflop / p.ranks <= p.rank_tflop < 1.02 * p.total_tflop / p.ranks
        assert p.efficiency["PCIe 5"] < p.efficiency["NVLink"] <= 1.0
    assert seed[0].efficiency["NVLink"] > seed[1].efficiency["NVLink"] > seed[2].efficiency["NVLink"]
    assert seed[0].rank_mbytes < seed[2].rank_mbytes
    wan = cost.predict("wan2.1", True, "1080p image", ranks=(2,))
    recompute, exchange = wan  # recomputing the overlap costs FLOPs, exchanging it costs bytes
    assert recompute.rank_tflop > exchange.rank_tflop and recompute.rank_mbytes < exchange.rank_mbytes
