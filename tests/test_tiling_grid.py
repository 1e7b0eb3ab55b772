"""Tile placement and blending weights: partition of unity, no thin border tiles, cached ramps."""

import pytest
import torch

from turbovae.vae.tiling.exact import stage_halos, partition, LocalStage
from turbovae.vae.tiling.grid import AxisGrid, TileGrid, raised_cosine


@pytest.mark.parametrize("length,tile,overlap", [
    (100, 40, 16), (64, 32, 8), (65, 32, 8), (17, 8, 4), (128, 64, 0), (33, 16, 8), (90, 20, 10), (31, 30, 2),
])
@pytest.mark.parametrize("scale,blend", [(1, 2), (8, 64), (8, 7), (1, 100)])
def test_weights_sum_to_one_everywhere(length, tile, overlap, scale, blend):
    grid = AxisGrid.build(length, tile, overlap)
    total = torch.zeros(length * scale, dtype=torch.float64)
    for i, t in enumerate(grid.tiles):
        w = grid.weights(i, scale, blend, "cpu", torch.float64)
        assert w.shape[0] == t.size * scale
        assert (w >= 0).all() and (w <= 1).all()
        total[t.start * scale:t.stop * scale] += w
    assert torch.allclose(total, torch.ones_like(total), atol=1e-12)


@pytest.mark.parametrize("length,tile,overlap", [(100, 40, 16), (65, 32, 8), (1000, 128, 16), (130, 64, 8)])
def test_tiles_cover_axis_and_never_thin(length, tile, overlap):
    grid = AxisGrid.build(length, tile, overlap)
    assert grid.tiles[0].start == 0 and grid.tiles[-1].stop == length
    assert all(t.size == tile for t in grid.tiles)  # the last tile is shifted inward, not clipped
    assert grid.min_overlap() >= min(overlap, tile // 2)
    starts = [t.start for t in grid.tiles]
    assert starts == sorted(starts)


def test_single_tile_when_tile_covers_axis():
    grid = TileGrid.build(20, 30, 32, 8)
    assert grid.single
    assert torch.equal(grid.rows.weights(0, 8, 64, "cpu"), torch.ones(160))


def test_raised_cosine_is_cached_and_complementary():
    a = raised_cosine(16, "cpu")
    assert raised_cosine(16, "cpu") is a
    assert torch.allclose(a + a.flip(0), torch.ones(16), atol=1e-7)
    assert raised_cosine(16, "cpu", torch.float64) is not a


def test_partition_is_exact_cover():
    for length, tile in [(10, 3), (64, 64), (65, 64), (128, 40), (7, 100)]:
        cores = partition(length, tile)
        assert cores[0][0] == 0 and cores[-1][1] == length
        assert all(a[1] == b[0] for a, b in zip(cores, cores[1:]))
        assert all(0 < c[1] - c[0] <= tile for c in cores)


def test_halos_account_for_resolution_and_stride():
    from fractions import Fraction as F

    up = [LocalStage(F(1), 2), LocalStage(F(2), 1), LocalStage(F(1), 3)]
    # at 1 px/latent: last stage needs 3 px at res 2 = 1.5 latent; middle adds 1 px at res 1
    assert stage_halos(up, F(1)) == [5, 3, 3]
    down = [LocalStage(F(1), 1), LocalStage(F(1, 2), 1)]
    h = stage_halos(down, F(8))
    assert h[1] % 2 == 0 and h[0] >= h[1] + 1
