"""bench/layer_fidelity.py on the tiny SeedVR2 config: every conv and norm of a decode is measured, each in both
layouts against float64, and the docs table renders from the results file it writes."""

from __future__ import annotations

import json

import pytest

from turbovae.bench import layer_fidelity
from turbovae.bench.cases import FidelityCase
from turbovae.vae.seedvr2 import SeedVR2Config, build, expected_shapes
from turbovae.vae.seedvr2.layers import CausalConv3d

from seedvr2_reference import random_state_dict  # noqa: E402

TINY = SeedVR2Config.tiny()
FP32_OP_BAR = 1e-5  # one fp32 op against float64, relative to its output: rounding, not a wrong op


def test_every_conv_and_norm_of_a_decode_is_measured_in_both_layouts(tmp_path):
    sd = random_state_dict(expected_shapes(TINY), seed=1)
    m32, m64 = build(sd, TINY), build({k: v.double() for k, v in sd.items()}, TINY)
    decoder_convs = [name for name, m in m64.named_modules()
                     if isinstance(m, CausalConv3d) and name.startswith("decoder.")]
    case = FidelityCase("decode", 1, 16, 16, family="seedvr2")
    rows = layer_fidelity.run(case, models=(m32, m64))

    # one conv3d row and one folded conv2d row (an image: every window is the first frame) per decoder conv
    assert [r.layer for r in rows if r.op == "conv3d"] == decoder_convs
    assert [r.layer for r in rows if r.op == "conv2d, summed taps"] == decoder_convs
    norms = [r for r in rows if r.op == "group_norm"]
    assert norms and [r.layer for r in norms] == [f"norm {i}" for i in range(len(norms))]
    for r in rows:
        errors = [r.contiguous, r.channels_last] + ([r.native_channels_last] if r.op == "group_norm" else [])
        assert all(0 < e < FP32_OP_BAR for e in errors), r  # fp32 against float64: some rounding, no more

    out = tmp_path / "layers.json"
    out.write_text(json.dumps(layer_fidelity.results(case, rows, "tiny seeded", 0.0)))
    table = layer_fidelity.markdown(out).splitlines()
    assert table[0].startswith("seedvr2 image decode 16×16, tiny seeded weights")
    by_op = {line.split(" | ")[0].lstrip("| "): line for line in table[4:]}
    assert list(by_op) == ["conv3d", "conv2d, summed taps", "group_norm"]
    assert by_op["conv3d"].split(" | ")[1] == str(len(decoder_convs))


def test_the_op_summary_takes_medians_and_maxima_per_layout():
    rows = [{"op": "conv3d", "contiguous": c, "channels_last": 4 * c, "native_channels_last": None}
            for c in (1e-7, 2e-7, 6e-7)]
    assert layer_fidelity.summary(rows) == {"conv3d": pytest.approx(
        {"ops": 3, "contiguous_median": 2e-7, "contiguous_max": 6e-7, "channels_last_median": 8e-7,
         "channels_last_max": 24e-7}, rel=1e-12)}
