"""ONNX export (dynamo) of the real architectures' image graphs (tiny configs) with onnxruntime parity
at a size other than the export size (the graphs are shape-generic, in steps of 16 px)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from turbovae.trt.interface import BuildSpec  # noqa: E402
from turbovae.trt.export import data_path, export_onnx, validate_onnx  # noqa: E402


def _model(kind):
    torch.manual_seed(0)
    if kind == "wan":
        from turbovae.vae.wan.config import TINY_WAN21
        from turbovae.vae.wan.model import WanVAE

        return WanVAE(TINY_WAN21).eval()
    from turbovae.vae.seedvr2.config import SeedVR2Config
    from turbovae.vae.seedvr2.model import SeedVR2VAE

    return SeedVR2VAE(SeedVR2Config.tiny()).eval()


CASES = [("wan", "encoder", torch.float32), ("wan", "decoder", torch.float32), ("wan", "decoder", torch.float16),
         ("seedvr2", "encoder", torch.float32), ("seedvr2", "decoder", torch.float32)]
FULL_TIER = {("wan", "decoder", torch.float16), ("seedvr2", "encoder", torch.float32),
             ("seedvr2", "decoder", torch.float32)}  # 7-14 s exports each; Wan's fp32 pair stays in the quick tier


@pytest.mark.parametrize("kind,component,dtype", [
    pytest.param(*c, id=f"{c[0]}-{c[1]}-{str(c[2])[6:]}", marks=pytest.mark.slow if c in FULL_TIER else ())
    for c in CASES])
def test_onnx_parity(tmp_path, kind, component, dtype):
    m = _model(kind)
    c = m.latent_format.channels
    enc = component == "encoder"
    step = 16 if enc else 2  # 16 px either way
    ch = 3 if enc else c
    name_in, name_out = ("pixels", "moments") if enc else ("latents", "pixels")
    spec = BuildSpec((name_in,), (name_out,), dtype, torch.device("cpu"),
                     ({name_in: ((1, ch, step, step), (1, ch, 3 * step, 4 * step), (1, ch, 8 * step, 8 * step))},),
                     {name_in: {2: ("h", step), 3: ("w", step)}})
    path = tmp_path / f"{component}.onnx"
    module = m.image_encoder() if enc else m.image_decoder()
    export_onnx(module, [torch.randn(1, ch, 3 * step, 4 * step)], spec, path, optimize=False)
    assert path.is_file() and data_path(path).is_file()
    with pytest.raises(FileExistsError):
        export_onnx(module, [torch.randn(1, ch, 3 * step, 4 * step)], spec, path)
    x = torch.randn(1, ch, 5 * step, 2 * step, generator=torch.Generator().manual_seed(3))
    if enc:
        x = x.clamp(-1, 1)
    m.float()
    (res,) = validate_onnx(path, m.image_encoder() if enc else m.image_decoder(), {name_in: x.to(dtype)})
    print(f"{kind} {component} {dtype}: cos {res['cosine']:.8f} max abs {res['max_abs']:.2e}")
    assert res["cosine"] >= 0.9999
    if dtype == torch.float32:
        assert res["max_abs"] <= 1e-4


SLICE_CASES = {"seedvr2": (4, 6), "wan": (4, 6), "wan2.2": (2, 3)}  # kind -> latent size (48x32 px for each)


@pytest.mark.parametrize("kind", list(SLICE_CASES))
@pytest.mark.slow
def test_video_slice_graphs_equal_eager_sliced_decode(tmp_path, kind):
    """The graphs a TensorRT video build starts from (the ONNX of `DecodeSliceGraph`), chained on onnxruntime with
    the causal cache carried explicitly, equal the eager sliced decode: SeedVR2, Wan 2.1 and Wan 2.2 (48 ch)."""
    from turbovae.trt.export import export_decode_slice_graphs, run_onnxruntime, slice_graph_names

    if kind == "wan2.2":
        from dataclasses import replace

        from turbovae.vae.wan.config import TINY_WAN22
        from turbovae.vae.wan.model import WanVAE

        torch.manual_seed(0)
        m = WanVAE(replace(TINY_WAN22, z_dim=48)).eval()
    else:
        m = _model(kind)
    hw = SLICE_CASES[kind]
    first, nxt = export_decode_slice_graphs(m, hw, tmp_path)
    z = torch.randn(1, m.latent_format.channels, 5, *hw, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = m.decode_latents(z, temporal_slice=1)
    outs = run_onnxruntime(first, {"latents": z[:, :, :2]})
    pixels, memory = [outs[0]], outs[1:]
    names, _ = slice_graph_names(len(memory))
    for t in range(2, z.shape[2]):  # one latent per call, caches carried explicitly
        outs = run_onnxruntime(nxt, dict(zip(names, [z[:, :, t:t + 1], *memory])))
        pixels.append(outs[0])
        memory = outs[1:]
    got = torch.cat(pixels, dim=2)
    assert got.shape == ref.shape == (1, 3, 17, 32, 48)
    err = (got - ref).abs().max().item()
    print(f"{kind} slice graph vs eager sliced decode: max abs {err:.2e}")
    assert err <= 1e-5
