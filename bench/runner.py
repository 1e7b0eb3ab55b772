"""Runs the benchmark `python -m turbovae bench` asks for (cli/bench.py parses it): the default job with a bar per
case, or named sections, rewriting the results JSON after each case or section and printing the table, the JSON's
path and the chart at the end. Ctrl-C keeps what was measured and returns exit code 130.

Why not in the command line: which sections exist, their repeat counts and how results are written are the
benchmark's own; the command line only turns options into `BenchOptions`. Importing this module loads nothing
else of bench/ (the parser of every command, `doctor` included, reads the section names).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # loaded when a run starts: building the command line's parser reads only the names below
    from .common import BenchOptions, BenchRow

# Section name -> module under turbovae.bench exposing `run(BenchOptions) -> list[BenchRow]`.
SECTIONS = {
    "seedvr2": "seedvr2",
    "qwen": "qwen",
    "qwen_layered": "qwen_layered",
    "tiling": "tiling",
    "engines": "engines",
    "gpu": "gpu",
    "slices": "slices",
    "parallel": "parallel",
    "held": "held",
    "roofline": "roofline",
    "profile": "profile_layers",
    "bytes": "bytes_roofline",
    "cuts": "byte_cuts",
    "budget": "budget",
    "plan_costs": "plan_costs",
}
# The sections that run a real checkpoint when given one (`--<section>-checkpoint`, dashes for underscores).
CHECKPOINT_SECTIONS = ("seedvr2", "qwen", "qwen_layered")
MAIN_REPEAT, SECTIONS_REPEAT = 2, 3  # timed runs per path when --repeat is not given
# `--full`: the long run (every size and ablation of these sections).
FULL_SECTIONS = ("seedvr2", "qwen")
FULL_DURATION = "tens of minutes on a CPU (README.md gives measured times)"


def default_results_path() -> Path:
    """A new file per run, so an earlier run's results are never replaced silently."""
    from datetime import datetime, timezone

    return Path("bench_results") / f"bench-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}.json"


def _finish(rows: list[BenchRow], env: dict, out: Path, complete: bool, table: Callable[[list], str]) -> None:
    from .common import write_json
    from .report import write_chart

    print("\n" + table(rows), flush=True)
    write_json(rows, out, env, complete=complete)
    chart = out.with_suffix(".png")
    why = write_chart([r.__dict__ | {"speedup": r.speedup} for r in rows], chart)
    print(f"\nwrote {out}" + (f" and {chart}" if why is None else f"; {why}"))


def run_default_job(opts: BenchOptions, env: dict, out: Path) -> int:
    """The default job: each case's bar, its rows written as soon as it ends; Ctrl-C keeps what was measured.
    ValueError (a user's mistake) when `opts.cases` matches no case."""
    from . import main as job
    from .common import write_json
    from .progress import CaseBar
    from .report import format_text

    table = lambda rows: format_text([r.__dict__ | {"speedup": r.speedup} for r in rows])  # noqa: E731
    hint = job.needs_reference_package()
    if hint:
        print(hint, file=sys.stderr)
    if not opts.comfyui:
        from .comfy_core import ADD_ROWS_HINT

        print(ADD_ROWS_HINT, file=sys.stderr)
    rows: list = []
    cases = job.cases(opts)
    if not cases:
        raise ValueError(f"no case name contains any of {', '.join(opts.cases)}; the cases are: "
                         + "; ".join(c.name for c in job.cases(replace(opts, cases=()))))
    bar: list = []  # the running case's bar

    def start(case) -> None:
        bar[:] = [CaseBar(f"case {cases.index(case) + 1}/{len(cases)}: {case.name}", job.steps_per_case(opts, case))]

    try:
        for case_rows in job.run_cases(opts, start=start, tick=lambda case: bar[0].tick()):
            bar.pop().close()
            rows.extend(case_rows)
            write_json(rows, out, env, complete=False)
    except KeyboardInterrupt:
        if bar:
            bar.pop().close()
        print(f"interrupted: {len({r.case for r in rows})} of {len(cases)} case(s) measured", file=sys.stderr)
        _finish(rows, env, out, False, table)
        return 130
    _finish(rows, env, out, True, table)
    return 0


def run_sections(sections: list[str], opts: BenchOptions, env: dict, out: Path) -> int:
    """The long sections (names of `SECTIONS`): each prints its table and the results file is rewritten after
    each section."""
    from .common import format_table, write_json

    rows: list = []
    try:
        for name in sections:
            module = importlib.import_module(f"{__package__}.{SECTIONS[name]}")
            print(f"\n== {name} ==", flush=True)
            section_rows = module.run(opts)
            print(format_table(section_rows), flush=True)
            rows.extend(section_rows)
            write_json(rows, out, env, complete=False)
    except KeyboardInterrupt:
        print(f"\ninterrupted during section {name!r}; keeping the sections before it", file=sys.stderr)
        _finish(rows, env, out, False, format_table)
        return 130
    _finish(rows, env, out, True, format_table)
    return 0
