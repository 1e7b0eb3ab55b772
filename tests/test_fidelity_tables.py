"""docs/seedvr2.md's fidelity tables are the benches' output (the fidelity checks themselves: the per-architecture
files, tests/fidelity_checks.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

FIDELITY_TABLE = re.compile(r"<!-- (?P<kind>[a-z-]*fidelity[a-z-]*-table): (?P<file>\S+) -->\n(?P<table>.*?)\n"
                            r"<!-- /(?P=kind) -->", re.S)


def test_docs_fidelity_tables_are_the_renderers_output():
    """docs/seedvr2.md shows the committed fidelity results as the benches render them, never typed by hand:
    `python -m turbovae.bench.fidelity --markdown` (`fidelity-table`), the same with `--paths`
    (`fidelity-paths-table`) and `python -m turbovae.bench.layer_fidelity --markdown` (`layer-fidelity-table`)."""
    from turbovae.bench import fidelity, layer_fidelity

    renderers = {"fidelity-table": fidelity.markdown, "fidelity-paths-table": fidelity.markdown_paths,
                 "layer-fidelity-table": layer_fidelity.markdown}
    root = Path(__file__).resolve().parents[1]
    blocks = list(FIDELITY_TABLE.finditer((root / "docs" / "seedvr2.md").read_text()))
    assert {b["kind"] for b in blocks} == set(renderers), "docs/seedvr2.md lacks a table, or has one of no renderer"
    for block in blocks:
        assert block["table"] == renderers[block["kind"]](root / block["file"]), block["file"]


def test_the_paths_table_says_which_layout_the_default_ran(tmp_path):
    """`markdown_paths` reads the default's layout off the variants a file timed and states each error as a
    multiple of the plain path's, the worst path alone named."""
    from turbovae.bench.fidelity import markdown_paths

    common = {"case": "seedvr2 image decode 448×320", "bias_shift": 0.0, "init": "reference", "plain_vs_fp64": 1e-5,
              "default_s": 2.0, "plain_s": 9.0}
    rows = [dict(common, default_vs_fp64=3e-5, alone_vs_fp64={"sdpa": 1.2e-5, "channels_last": 3.3e-5},
                 default_without_channels_last_s=3.0),
            dict(common, default_vs_fp64=8e-6, alone_vs_fp64={"sdpa": 1.2e-5, "channels_last": 1e-5},
                 default_channels_last_s=1.5, default_channels_last_vs_fp64=3e-5)]
    path = tmp_path / "paths.json"
    path.write_text(json.dumps({"results": rows}))
    before, after = (line.split(" | ") for line in markdown_paths(path).splitlines()[2:])
    assert before[2:7] == ["channels-last", "1.00e-05", "3.00e-05", "3.00", "3.30 (channels_last)"]
    assert before[8:] == ["3.00", "", "", "9.00 |"]
    assert after[2:7] == ["contiguous", "1.00e-05", "8.00e-06", "0.80", "1.20 (sdpa)"]
    assert after[8:] == ["", "3.00e-05", "1.50", "9.00 |"]
