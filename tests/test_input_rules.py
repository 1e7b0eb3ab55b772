"""The rules of a valid pass input live in one place (issue 50, item 2): the 1 + 4n frame pad an encode applies is
`LatentFormat.padded_frames`, which the API, the planner, the tiled API, the parallel passes and the nodes call; no
module writes the rule again."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from turbovae.vae.registry import families

ROOT = Path(__file__).resolve().parents[1]
# the pad written out: `(-(t - 1)) % tf`, whatever the names
PAD_RULE = re.compile(r"\(-\(\s*[\w.\[\]]+\s*-\s*1\s*\)\)\s*%")


def test_padded_frames_is_the_smallest_1_plus_4n_at_or_above_the_clip():
    for fam in families():
        fmt = fam.build_model(fam.config(real=False)).latent_format
        tf = fmt.temporal_factor
        for t in range(1, 3 * tf + 3):
            padded = fmt.padded_frames(t)
            assert padded >= t and (padded - 1) % tf == 0 and padded - t < tf, (fam.key, t, padded)


def test_pad_frames_pads_to_the_padded_frame_count():
    from turbovae.bench.models import seeded_init
    from turbovae.vae.api import TurboVAE
    from turbovae.vae.registry import family

    fam = family("qwen_image")
    vae = TurboVAE(seeded_init(fam.build_model(fam.config(real=False))).eval())
    clip = torch.rand(1, 3, 6, 16, 16)
    padded = vae.pad_frames(clip)
    assert padded.shape[2] == vae.latent_format.padded_frames(6) == 9
    assert torch.equal(padded[:, :, 6:], clip[:, :, -1:].expand(-1, -1, 3, -1, -1))


def test_the_pad_rule_is_written_once():
    written = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("tests/", ".", "build/", "dist/")):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if PAD_RULE.search(line):
                written.append(f"{rel}:{n}")
    assert written == ["vae/base.py:" + str(_line_of_padded_frames())], written


def _line_of_padded_frames() -> int:
    lines = (ROOT / "vae" / "base.py").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if "def padded_frames" in l)
    return next(i for i in range(start, len(lines)) if PAD_RULE.search(lines[i])) + 1


# -- each argument of a pass checked once (issue 50, item 2) ------------------------------------------------------
RULES = ("pass_tensor", "pass_shape", "shape_dims", "check_channels", "check_spatial", "check_mode", "check_tile",
         "check_overlap", "check_temporal_slice")


class _CountedRules:
    """Counts the calls of each rule of vae/input_rules.py while active, however its callers imported it (a profile
    hook on the rules' code objects, so `from .input_rules import check_mode` is counted too)."""

    def __init__(self):
        import turbovae.vae.input_rules as rules

        self.codes = {getattr(rules, name).__code__: name for name in RULES}
        self.calls = dict.fromkeys(RULES, 0)

    def __enter__(self):
        import sys

        def hook(frame, event, arg):
            if event == "call" and frame.f_code in self.codes:
                self.calls[self.codes[frame.f_code]] += 1

        sys.setprofile(hook)
        return self.calls

    def __exit__(self, *exc):
        import sys

        sys.setprofile(None)


def _tiny_turbo():
    from turbovae.bench.models import seeded_init
    from turbovae.vae.api import TurboVAE
    from turbovae.vae.registry import family

    fam = family("qwen_image")
    return TurboVAE(seeded_init(fam.build_model(fam.config(real=False))).eval())


def test_an_api_decode_and_encode_check_each_argument_once():
    vae = _tiny_turbo()
    z = torch.randn(1, vae.latent_channels, 3, 8, 8)
    with _CountedRules() as calls:
        vae.decode(z, temporal_slice=1)
    assert calls == {**dict.fromkeys(RULES, 0), "pass_tensor": 1, "check_channels": 1, "check_temporal_slice": 1}
    with _CountedRules() as calls:
        vae.encode(torch.rand(1, 3, 6, 64, 64) * 2 - 1, temporal_slice=1)
    assert calls == {**dict.fromkeys(RULES, 0), "pass_tensor": 1, "check_channels": 1, "check_spatial": 1,
                     "check_temporal_slice": 1}


def test_a_tiled_node_decode_checks_each_argument_once():
    """The node checks its settings and the latents once; the plan, the tiled pass and the model below trust them
    (it used to check the mode 3 times, the tile and overlap twice, the shape 3 times)."""
    import node_helpers

    node_helpers.use_comfy_stubs()
    from turbovae.nodes.comfy_vae import ComfyTurboVAE
    from turbovae.nodes.tiled_nodes import TurboVAETiledDecode

    node_helpers.hide_comfy_stubs()
    vae = ComfyTurboVAE(_tiny_turbo())
    z = torch.randn(1, vae.latent_channels, 3, 8, 12)
    for mode in ("fast", "exact", "auto"):
        with _CountedRules() as calls:
            TurboVAETiledDecode.execute(samples={"samples": z}, vae=vae, tile_size=64, overlap=16, temporal_slice=1,
                                        mode=mode)
        assert calls == {**dict.fromkeys(RULES, 0), "pass_tensor": 1, "check_channels": 1, "check_mode": 1,
                         "check_tile": 1, "check_overlap": 1, "check_temporal_slice": 1}, mode


def test_core_vae_decode_and_encode_check_their_input_once():
    """Core's VAE Decode and VAE Encode with our VAE: the latents, and the clip an IMAGE makes, checked once (the
    encode checked its shape while planning, then the tensor again inside `TurboVAE.encode`)."""
    import node_helpers

    node_helpers.use_comfy_stubs()
    from turbovae.nodes.comfy_vae import ComfyTurboVAE

    node_helpers.hide_comfy_stubs()
    vae = ComfyTurboVAE(_tiny_turbo())
    with _CountedRules() as calls:
        vae.decode(torch.randn(1, vae.latent_channels, 3, 8, 12))
    assert calls == {**dict.fromkeys(RULES, 0), "pass_tensor": 1, "check_channels": 1}
    with _CountedRules() as calls:
        vae.encode(torch.rand(5, 64, 96, 3))
    assert calls == {**dict.fromkeys(RULES, 0), "pass_tensor": 1, "check_channels": 1, "check_spatial": 1}


def test_a_multi_gpu_node_decode_and_encode_check_each_argument_once():
    """The multi-GPU nodes check their settings and input once; the plan that loads the model and the sharded pass
    trust them (they checked the tile and the temporal slice three times, the latents twice)."""
    import node_helpers

    node_helpers.use_comfy_stubs()
    from turbovae.nodes.comfy_vae import ComfyTurboVAE
    from turbovae.nodes.parallel_nodes import TurboVAEMultiGPUDecode, TurboVAEMultiGPUEncode

    node_helpers.hide_comfy_stubs()
    vae = ComfyTurboVAE(_tiny_turbo())
    z = torch.randn(1, vae.latent_channels, 3, 8, 12)
    settings = {**dict.fromkeys(RULES, 0), "pass_tensor": 1, "check_channels": 1, "check_mode": 1, "check_tile": 1,
                "check_overlap": 1, "check_temporal_slice": 1}
    with _CountedRules() as calls:
        TurboVAEMultiGPUDecode.execute(samples={"samples": z}, vae=vae, devices="cpu,cpu", tile_size=64,
                                       temporal_slice=1)
    assert calls == settings
    with _CountedRules() as calls:
        TurboVAEMultiGPUEncode.execute(pixels=torch.rand(5, 64, 96, 3), vae=vae, devices="cpu,cpu", tile_size=64)
    assert calls == {**settings, "check_spatial": 1}


def test_a_tiled_api_decode_checks_each_argument_once():
    from turbovae.vae.tiled import decode_tiled

    vae = _tiny_turbo()
    with _CountedRules() as calls:
        decode_tiled(vae, torch.randn(1, vae.latent_channels, 3, 8, 12), tile_px=64, overlap_px=16, mode="fast")
    assert calls == {**dict.fromkeys(RULES, 0), "pass_tensor": 1, "check_channels": 1, "check_mode": 1,
                     "check_tile": 1, "check_overlap": 1, "check_temporal_slice": 1}


def test_the_planner_front_doors_check_a_shape_once():
    from turbovae.vae.plan_pass import plan_pass

    vae = _tiny_turbo()
    with _CountedRules() as calls:
        vae.plan((1, 3, 5, 64, 64), decode=False, budget_bytes=2**30)
    assert calls["pass_shape"] == calls["shape_dims"] == calls["check_channels"] == calls["check_mode"] == 1
    with _CountedRules() as calls:
        plan_pass(vae.model, "1x3x6x64x64", decode=True, device_type="cpu", budget_bytes=2**30)
    assert calls["pass_shape"] == calls["shape_dims"] == calls["check_channels"] == calls["check_mode"] == 1


# -- the rules are written once ---------------------------------------------------------------------------------
# what the rules' messages say: a pass module that words one of them again writes the rule again
RULE_WORDS = ("mode must be one of", "channels for a {", "height and width must be multiples of", "is too small; use",
              "less than half", "temporal_slice must be an integer", "of positive sizes", "must be a torch.Tensor",
              "floating-point tensor", "NaN or inf values", "overlap_px must be")
PASS_MODULES = ("vae/api.py", "vae/plan_pass.py", "vae/tiled.py", "vae/base.py", "vae/planning/", "vae/tiling/",
                "vae/parallel/", "nodes/", "cli/")


def test_the_input_rules_are_written_once():
    written = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(PASS_MODULES):
            continue
        text = path.read_text()
        for words in RULE_WORDS:
            if words in text:
                written.append(f"{rel}: {words!r}")
    assert written == [], written


def test_the_pass_modules_call_the_rules():
    """The API, the planner, the tiled API, the parallel passes and the nodes import the rules from their home."""
    for rel in ("vae/api.py", "vae/plan_pass.py", "vae/tiled.py", "vae/parallel/passes.py", "nodes/pass_budget.py",
                "nodes/tiled_nodes.py", "nodes/comfy_vae.py"):
        assert "input_rules import" in (ROOT / rel).read_text(), rel
