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
