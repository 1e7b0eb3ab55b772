"""The default benchmark job (`python -m turbovae bench`) in its reduced form: bars, table, JSON, chart, Ctrl-C."""

from __future__ import annotations

import json

import pytest
import torch

from turbovae import cli
from turbovae.bench import main as job
from turbovae.bench import report


def _results(path):
    data = json.loads(path.read_text())
    return data["complete"], data["rows"]


@pytest.mark.slow
def test_default_job_reduced(tmp_path, capsys):
    out = tmp_path / "r" / "bench.json"
    assert cli.main(["bench", "--quick", "--repeat", "1", "--device", "cpu", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    complete, rows = _results(out)
    assert complete
    cases = [c.name for c in job.SMOKE_CASES]
    assert [r["case"] for r in rows] == [c for c in cases for _ in range(2)]
    refs, ours = rows[0::2], rows[1::2]
    assert all(r["reference"] for r in refs) and not any(r["reference"] for r in ours)
    assert [r["variant"] for r in refs] == ["diffusers AutoencoderKLQwenImage", "diffusers AutoencoderKLWan",
                                            job.SEEDVR2_REFERENCE, "untiled (ours)"]
    for r in ours:
        assert r["speedup"] == pytest.approx(r["baseline_ms"] / r["ms"])
        assert r["max_abs_err"] < 1e-4  # every path is exact against its reference at fp32
        assert r["peak_mb"] is not None and r["peak_mb"] >= 0
    # one finished bar per case on stderr, then the table on stdout with the reference ratio
    assert captured.err.count("[" + "#" * 24 + "]") == len(cases)
    assert "vs reference" in captured.out and "reference" in captured.out
    assert "--comfyui" in captured.err  # one line saying how to add ComfyUI core rows
    for name in cases:
        assert name in captured.out
    png = out.with_suffix(".png")
    if pytest.importorskip("matplotlib"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ctrl_c_prints_the_partial_table_and_keeps_the_json(tmp_path, capsys, monkeypatch):
    out = tmp_path / "bench.json"
    calls = {"n": 0}
    real_sides = job._sides

    def sides_then_interrupt(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the first case (both sides) is done; Ctrl-C during the second
            raise KeyboardInterrupt
        return real_sides(*args, **kwargs)

    monkeypatch.setattr(job, "_sides", sides_then_interrupt)
    assert cli.main(["bench", "--quick", "--repeat", "1", "--device", "cpu", "--out", str(out)]) == 130
    captured = capsys.readouterr()
    complete, rows = _results(out)
    assert not complete and len(rows) == 2 and rows[0]["case"] == job.SMOKE_CASES[0].name
    assert "interrupted: 1 of" in captured.err
    assert job.SMOKE_CASES[0].name in captured.out and job.SMOKE_CASES[1].name not in captured.out


@pytest.mark.slow
def test_results_are_written_after_every_case(tmp_path, monkeypatch):
    """The file on disk holds each finished case before the next one starts, and is never half-written."""
    from turbovae.bench import common

    seen = []
    real_write = common.write_json

    def spy(rows, path, env=None, complete=True):
        real_write(rows, path, env, complete)
        seen.append((len(json.loads(path.read_text())["rows"]), complete))

    monkeypatch.setattr(common, "write_json", spy)
    monkeypatch.setattr(job, "cases", lambda opts: job.SMOKE_CASES[:2])
    assert cli.main(["bench", "--quick", "--repeat", "1", "--device", "cpu", "--out", str(tmp_path / "b.json")]) == 0
    assert seen == [(2, False), (4, False), (4, True)]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_report_renders_tables_from_rows():
    rows = [dict(case="c", variant="ref", ms=2000.0, baseline_ms=2000.0, speedup=1.0, peak_mb=10.0, max_abs_err=None,
                 psnr_db=None, reference=True),  # an older results file: no held memory
            dict(case="c", variant="ours", ms=500.0, baseline_ms=2000.0, speedup=4.0, peak_mb=5.0, max_abs_err=1e-6,
                 psnr_db=120.0, reference=False, held_mb=3.0)]
    md = report.format_markdown(rows).splitlines()
    assert md[0].startswith("| case | path | time | vs reference | peak MB | held MB |")
    assert md[2] == "| c | ref | 2.00 s | reference | 10 |  |  |  |"
    assert md[3] == "| c | ours | 0.50 s | 4.00x | 5 | 3 | 1.0e-06 | 120.0 |"
    assert "4.00x" in report.format_text(rows)


def test_timed_runs_alternate_between_the_sides():
    """Load or clock drift during a case must hit the reference and ours alike: warm-ups first, then the
    timed runs alternate (a side timed in one block after the other once showed 0.90x for a 1.15x path)."""
    order = []

    def side(name):
        def run(x):
            order.append(name)
            return x + 1
        return run

    opts = job.BenchOptions(device="cpu", repeat=3)
    (ref_ms, _, _, ref_out), (ms, _, _, out) = job._sides(side("ref"), side("ours"), torch.zeros(2), opts,
                                                          job.PeakMemory(torch.device("cpu")), lambda: None)
    assert order == ["ref", "ours"] + ["ref", "ours"] * 3
    assert ref_ms >= 0 and ms >= 0 and torch.equal(ref_out, out)


def test_held_memory_is_what_a_side_keeps_after_its_warm_up():
    """The held column sees a path that keeps memory (a cache) and not one that frees what it made."""
    kept = []

    def caching(x):
        if not kept:
            kept.append(torch.ones(64 * 2**20 // 4))  # 64 MB kept after the first call, as a cache would be
        return x + 1

    opts = job.BenchOptions(device="cpu", repeat=1)
    (_, _, ref_held, _), (_, _, held, _) = job._sides(lambda x: x + torch.ones(64 * 2**20 // 4).sum(), caching,
                                                      torch.zeros(2), opts, job.PeakMemory(torch.device("cpu")),
                                                      lambda: None)
    if ref_held is None:
        pytest.skip("no resident-memory reading on this platform")
    assert held >= 60 and ref_held < 16


def test_held_table_pivots_the_steps():
    rows = [dict(section="held", case=c, variant="M", ms=1.0, held_mb=h, model_mb=100.0)
            for c, h in (("load", 0.4), ("image decode", 2.0), ("+ image encode", 3.0))]
    md = report.format_markdown(rows).splitlines()
    assert md[0] == "| model | parameters | load | image decode | + image encode |"
    assert md[2] == "| M | 100 MB | +0 MB (0.4 %) | +2 MB (2.0 %) | +3 MB (3.0 %) |"
