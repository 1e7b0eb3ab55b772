"""Package-level contract: import without comfy, checkpoint reading, strict key checks, input checks."""

import importlib
import sys

import pytest
import torch

import turbovae
from turbovae.vae.base import LatentFormat, split_slices
from turbovae.vae.checkpoint import CheckpointError, compare_keys, read_state_dict


def test_import_does_not_pull_comfy():
    assert "comfy" not in sys.modules
    assert callable(turbovae.load_vae)
    assert callable(turbovae.comfy_entrypoint)


def test_latent_format_frame_arithmetic():
    lf = LatentFormat(channels=16, spatial_factor=8, temporal_factor=4)
    assert [lf.latent_frames(t) for t in (1, 5, 9, 13)] == [1, 2, 3, 4]
    assert [lf.pixel_frames(t) for t in (1, 2, 3, 4)] == [1, 5, 9, 13]


def test_split_slices_cover_everything_once():
    assert split_slices(13, 5, 4) == [(0, 5), (5, 9), (9, 13)]
    assert split_slices(4, 2, 1) == [(0, 2), (2, 3), (3, 4)]
    assert split_slices(1, 5, 4) == [(0, 1)]


def test_compare_keys_reports_each_kind():
    expected = {"a": (2,), "b": (3, 3), "c": (1,)}
    sd = {"a": torch.zeros(2), "b": torch.zeros(3, 4), "x": torch.zeros(1)}
    rep = compare_keys(sd, expected)
    assert rep.missing == ["c"] and rep.unexpected == ["x"]
    assert rep.wrong_shape == [("b", (3, 4), (3, 3))]
    text = rep.describe()
    assert "1 missing" in text and "1 unexpected" in text and "wrong-shape" in text


def test_read_state_dict_rejects_truncated_and_unknown(tmp_path):
    from safetensors.torch import save_file

    good = tmp_path / "x.safetensors"
    save_file({"w": torch.ones(64, 64)}, str(good))
    assert torch.equal(read_state_dict(good)["w"], torch.ones(64, 64))
    bad = tmp_path / "trunc.safetensors"
    bad.write_bytes(good.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="truncated"):
        read_state_dict(bad)
    with pytest.raises(CheckpointError, match="unsupported file type"):
        read_state_dict(tmp_path / "weights.gguf")


def test_read_pickle_is_weights_only(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    p = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(1), "obj": Evil()}, str(p))
    with pytest.raises(CheckpointError, match="weights_only"):
        read_state_dict(p)
    q = tmp_path / "ok.pt"
    torch.save({"state_dict": {"w": torch.ones(2)}}, str(q))
    assert list(read_state_dict(q)) == ["w"]


def test_load_vae_rejects_unknown_and_sd_kl():
    with pytest.raises(CheckpointError, match="no known VAE"):
        turbovae.load_vae({"foo.weight": torch.zeros(1)})
    sd_kl = {"decoder.up_blocks.0.resnets.0.norm1.weight": torch.zeros(512),
             "decoder.up_blocks.0.resnets.0.conv1.weight": torch.zeros(512, 512, 3, 3)}
    with pytest.raises(CheckpointError, match="SD-style"):
        turbovae.load_vae(sd_kl)


def test_pad_to_multiple_replicates_edges():
    x = torch.arange(2 * 3 * 1 * 5 * 6, dtype=torch.float32).view(2, 3, 1, 5, 6)
    y = turbovae.pad_to_multiple(x, 8)
    assert y.shape == (2, 3, 1, 8, 8)
    assert torch.equal(y[..., :5, :6], x)
    assert torch.equal(y[..., 7, :6], x[..., 4, :])


def test_moments_to_latents_mean_and_sample():
    m = torch.cat([torch.full((1, 2, 1, 2, 2), 0.5), torch.full((1, 2, 1, 2, 2), 100.0)], dim=1)
    assert torch.equal(turbovae.moments_to_latents(m), torch.full((1, 2, 1, 2, 2), 0.5))
    g = torch.Generator().manual_seed(1)
    s = turbovae.moments_to_latents(m, sample=True, generator=g)
    # log-variance clamped to 20 -> std = e^10
    eps = torch.randn((1, 2, 1, 2, 2), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(s, 0.5 + torch.exp(torch.tensor(10.0)) * eps)
