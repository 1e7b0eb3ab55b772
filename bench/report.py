"""Results tables and the chart, rendered from benchmark rows or a results JSON.

`python -m turbovae.bench.report RESULTS.json [...] [--markdown] [--chart OUT.png]` prints the table of
one or more results files. The README's results table is this command's markdown output for the
committed files in docs/results/ (a test checks that they agree), so no number is typed by hand.
Files measured on a GPU get a first line naming the machine (GPU, driver, CUDA, torch, dtype) from the files'
own environment record, so a GPU number is never shown without the conditions it was measured under.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

from .budget_gpu import proof_environment, proof_rows
from .dynamic_vram import dynamic_vram_environment, dynamic_vram_rows, is_dynamic_vram_results

Row = Mapping[str, object]
HEADER = ("case", "path", "time", "vs reference", "peak MB", "held MB", "max abs err", "PSNR dB")
# Added when the rows hold a ComfyUI core baseline (`bench --comfyui`): core's time over the row's time, and
# the core row's max abs error against TurboVAE (its "max abs err" is against the reference, like every row's).
CORE_HEADER = ("vs ComfyUI core", "core err vs turbovae")


def load_rows(path: Path) -> list[dict]:
    """Rows of a results JSON written by `python -m turbovae bench` (or its sections). `FILE.json#TABLE` keeps
    the rows of one table of a file whose sections write different tables (e.g. `#roofline`, `#profile`)."""
    path, _, table = str(path).partition("#")
    try:
        data = json.loads(Path(path).read_text())
        if _is_budget_proof(data):
            rows = proof_rows(data)
        elif is_dynamic_vram_results(data):
            rows = dynamic_vram_rows(data)
        else:
            rows = data["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a benchmark results file ({type(e).__name__}: {e})") from e
    return [r for r in rows if not table or table_of(r) == table]


def _is_budget_proof(data: object) -> bool:
    """A results file of the GPU proof (bench/budget_gpu.py): cases, not rows."""
    return isinstance(data, dict) and "cases" in data and "rows" not in data


def table_of(row: Row) -> str:
    """Which table a row belongs to: sections with their own columns say so in `table`."""
    return str(row.get("table", "results"))


def _seconds(ms: object, unit: str = "s") -> str:
    """A time cell: seconds with 2 decimals, or (`unit="ms"`, for GPU tables, whose image passes take
    milliseconds and would all read 0.01 s) milliseconds with 1."""
    if not math.isfinite(float(ms)):  # a step the run did not time (its note says why)
        return "not run"
    return f"{float(ms):.1f} ms" if unit == "ms" else f"{float(ms) / 1e3:.2f} s"


def load_environment(path: Path) -> dict:
    """The `environment` record of a results JSON (`FILE.json#TABLE` names the file's environment too)."""
    path = Path(str(path).partition("#")[0])
    try:
        data = json.loads(path.read_text())
        if _is_budget_proof(data):
            return proof_environment(data)
        if is_dynamic_vram_results(data):
            return dynamic_vram_environment(data)
        return dict(data.get("environment") or {})
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: not a benchmark results file ({type(e).__name__}: {e})") from e


def _cudnn(version: object) -> str:
    """torch reports cuDNN as one integer (91900); people read 9.19.0."""
    if isinstance(version, int):
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
    return str(version)


def machine_caption(paths: Sequence[Path], dtype: Optional[str] = None) -> str:
    """One line naming each GPU machine the files were measured on, or "" when none was measured on a GPU.
    The dtype comes from the files (`environment.dtype`) or, for files that do not record it, from `dtype`
    (the command's `--dtype`, as the file's provenance note states)."""
    seen: list[str] = []
    for path in paths:
        env = load_environment(path)
        if not env.get("gpu"):
            continue
        kind = env.get("dtype") or dtype
        if not kind:
            raise ValueError(f"{path}: measured on {env['gpu']} but records no dtype; name it: "
                             f"{str(path).partition('#')[0]} dtype=bf16 (the dtype its command ran with)")
        parts = [f"**{env['gpu']}**", f"driver {env.get('driver')}", f"CUDA {env.get('cuda')}",
                 f"cuDNN {_cudnn(env.get('cudnn'))}", f"torch {env.get('torch')}", str(kind),
                 str(env.get("date", ""))[:10]]
        line = ", ".join(p for p in parts if p and "None" not in p)
        if line not in seen:
            seen.append(line)
    return "; ".join(seen) if not seen else "Measured on " + "; ".join(seen) + "."


def render(tokens: Sequence[str]) -> str:
    """What a docs results-table block holds: `tokens` are results files (FILE.json or FILE.json#TABLE) and
    options (`dtype=bf16`); the machine caption (GPU files only), then the markdown table."""
    files = [t for t in tokens if "=" not in t]
    options = dict(t.split("=", 1) for t in tokens if "=" in t)
    unknown = set(options) - {"dtype"}
    if unknown:
        raise ValueError(f"unknown results-table option(s) {sorted(unknown)}; the only option is dtype=")
    rows = [r for f in files for r in load_rows(Path(f))]
    caption = machine_caption([Path(f) for f in files], options.get("dtype"))
    table = format_markdown(rows, unit="ms" if caption else "s")
    return f"{caption}\n\n{table}" if caption else table


def has_core(rows: Iterable[Row]) -> bool:
    """Whether the rows compare with ComfyUI core (then the tables have the CORE_HEADER columns)."""
    return any(r.get("core_ms") is not None or r.get("err_vs_ours") is not None for r in rows)


def is_core(row: Row) -> bool:
    return row.get("err_vs_ours") is not None


def header(rows: Sequence[Row]) -> tuple[str, ...]:
    return HEADER + (CORE_HEADER if has_core(rows) else ())


def cells(row: Row, core: bool = False, unit: str = "s") -> list[str]:
    """One row's cells: the reference row of a case says so; other rows give reference time / own time.
    `core`: also the CORE_HEADER cells."""
    speedup = row.get("speedup")
    # Older results files have no "reference" field; their reference rows are their own baseline.
    reference = row.get("reference", row.get("baseline_ms") == row.get("ms") and speedup in (None, 1.0))
    peak, held, err, db = row.get("peak_mb"), row.get("held_mb"), row.get("max_abs_err"), row.get("psnr_db")
    own = [
        str(row["case"]),
        str(row["variant"]),
        _seconds(row["ms"], unit),
        "reference" if reference else (f"{speedup:.2f}x" if speedup else ""),
        f"{peak:.0f}" if peak is not None else "",
        f"{held:.0f}" if held is not None else "",  # older results files have no held memory
        f"{err:.1e}" if err is not None else "",
        ("inf" if db == float("inf") else f"{db:.1f}") if db is not None else "",
    ]
    if not core:
        return own
    core_ms, core_err = row.get("core_ms"), row.get("err_vs_ours")
    return own + [f"{float(core_ms) / float(row['ms']):.2f}x" if core_ms else "",
                  f"{core_err:.1e}" if core_err is not None else ""]


def _num(value: object, fmt: str) -> str:
    return format(float(value), fmt) if value is not None else ""


ROOFLINE_HEADER = ("case", "path", "time", "GFLOP", "GFLOP/s", "% of peak", "GB touched", "GB/s", "FLOP/byte",
                   "bound")


def roofline_cells(row: Row) -> list[str]:
    """A roofline row (bench/roofline.py): a machine peak, or one side of a main-job case against its peak."""
    pct = row.get("pct_of_peak")
    return [str(row["case"]), str(row["variant"]), _seconds(row["ms"]), _num(row.get("gflop"), ".1f"),
            _num(row.get("gflop_per_s"), ".0f"), f"{pct:.0f} % of {row.get('peak_used')}" if pct is not None else "",
            _num(row.get("gb_touched"), ".2f"), _num(row.get("gb_per_s"), ".1f"), _num(row.get("flop_per_byte"), ".0f"),
            str(row.get("bound", ""))]


PROFILE_KINDS = ("conv", "copy/pad", "concat", "upsample", "norm/act", "attention", "add/mul", "other")
PROFILE_HEADER = ("case", "path", "total", "per frame", "conv GFLOP/s") + PROFILE_KINDS


def profile_cells(row: Row) -> list[str]:
    """A profile row (bench/profile_layers.py): profiled time, then each kind's time and share of it."""
    ms_by_kind, total = row.get("ms_by_kind", {}), float(row["ms"])
    conv_ms, conv_gflop = ms_by_kind.get("conv", 0.0), row.get("gflop_by_kind", {}).get("conv", 0.0)
    kinds = [f"{ms_by_kind.get(k, 0.0) / 1e3:.2f} s ({100 * ms_by_kind.get(k, 0.0) / total:.0f} %)" if total else ""
             for k in PROFILE_KINDS]
    return [str(row["case"]), str(row["variant"]), _seconds(total), _seconds(total / max(int(row["frames"]), 1)),
            f"{conv_gflop / (conv_ms / 1e3):.0f}" if conv_ms else ""] + kinds


FLOPS_HEADER = ("case", "path", "GFLOP", "reference FLOPs / ours", "GB touched", "FLOP/byte", "time at conv peak")


def flops_cells(row: Row) -> list[str]:
    """A FLOP-count row (bench/roofline.py FlopRow): counted on meta; its time is the FLOPs at the conv peak."""
    speedup = row.get("speedup")
    return [str(row["case"]), str(row["variant"]), _num(row.get("gflop"), ".0f"),
            "reference" if row.get("reference") else (f"{speedup:.2f}x" if speedup else ""),
            _num(row.get("gb_touched"), ".2f"), _num(row.get("flop_per_byte"), ".0f"), _seconds(row["ms"])]


BYTES_HEADER = (("case", "path", "GFLOP", "GB touched") + tuple(f"{k} GB" for k in PROFILE_KINDS)
                + ("FLOP floor", "byte floor", "bound", "measured (counted ops)", "% of floor", "best measured"))


def bytes_cells(row: Row) -> list[str]:
    """A byte-roofline row (bench/bytes_roofline.py): counted on meta; floors on the row's device."""
    by_kind = row.get("gb_by_kind", {})
    pct, best = row.get("pct_of_floor"), row.get("best_ms")
    return ([str(row["case"]), str(row["variant"]), _num(row.get("gflop"), ".0f"), _num(row.get("gb_touched"), ".1f")]
            + [_num(by_kind.get(k), ".1f") for k in PROFILE_KINDS]
            + [f"{float(row['flop_floor_ms']):.1f} ms", f"{float(row['byte_floor_ms']):.1f} ms",
               f"{row.get('bound', '')} ({row.get('device', '')})",
               f"{float(row['measured_ms']):.1f} ms" if row.get("measured_ms") is not None else "",
               f"{pct:.0f} %" if pct is not None else "",
               f"{float(best):.1f} ms ({row.get('best_path', '')})" if best is not None else ""])


CUTS_HEADER = ("case", "path", "GB touched (GPU size)", "GB removed", "CPU time (CPU size)", "speed vs without",
               "max abs diff vs without", "CPU size")


def cuts_cells(row: Row) -> list[str]:
    """A byte-cut row (bench/byte_cuts.py): bytes counted at the GPU size, time measured at the CPU size."""
    base, ms = row.get("baseline_ms"), float(row["ms"])
    return [str(row["case"]), str(row["variant"]), _num(row.get("gb_touched"), ".1f"), _num(row.get("gb_removed"), ".1f"),
            _seconds(ms), f"{float(base) / ms:.3f}x" if base and not row.get("reference") else "",
            _num(row.get("max_abs_err"), ".1e"), "×".join(str(d) for d in row.get("cpu_shape", ()))]


BUDGET_HEADER = ("case", "budget", "budget MB", "plan", "time", "vs untiled", "peak MB (allocator)",
                 "predicted MB", "host MB", "max abs diff vs untiled")


def budget_cells(row: Row) -> list[str]:
    """A budget row (bench/budget.py): the plan taken at a budget, its time, measured and predicted peaks."""
    ms, base = float(row["ms"]), row.get("baseline_ms")
    if not ms:  # no plan fits this budget: the floor the planner named
        return [str(row["case"]), str(row["variant"]).removeprefix("budget "), _num(row.get("budget_mb"), ".0f"),
                f"none fits ({row.get('note', '')})", "", "", "", "", "", ""]
    return [str(row["case"]), str(row["variant"]).removeprefix("budget "), _num(row.get("budget_mb"), ".0f"),
            str(row.get("plan", "")), _seconds(ms), f"{ms / float(base):.2f}x" if base else "",
            _num(row.get("peak_mb"), ".0f"), _num(row.get("predicted_peak_mb"), ".0f"), _num(row.get("host_mb"), ".0f"),
            _num(row.get("max_abs_err"), ".1e")]


PLANS_HEADER = ("pass", "clip and budget", "plan (CUDA bf16)", "device peak MB", "host MB", "expected s",
                "planning s: fresh / warm", "`plan` command s")


def plans_cells(row: Row) -> list[str]:
    """A planner row (bench/plans_table.py): the plan taken, or the smallest budget that works; how long planning
    took: the first plan of a fresh process, and the first plan of its shape in a warm process where recorded; and
    `python -m turbovae plan` at the shell, start-up included, where recorded."""
    took = _num(row.get("plan_s"), ".1f")
    if row.get("plan_warm_s") is not None:
        took += f" / {_num(row.get('plan_warm_s'), '.1f')}"
    command = _num(row.get("plan_command_s"), ".1f")
    if not row.get("fits"):
        return [str(row["case"]), str(row["variant"]), f"none fits: needs {_num(row.get('floor_mb'), '.0f')} MB "
                f"({row.get('floor_plan', '')})", "", "", "", took, command]
    return [str(row["case"]), str(row["variant"]), str(row.get("plan", "")), _num(row.get("pass_mb"), ".0f"),
            _num(row.get("host_mb"), ".0f"), _num(row.get("expected_s"), ".1f"), took, command]


PROOF_HEADER = ("case", "dtype", "process limit GB", "budget MB", "plan", "time", "predicted MB",
                "peak MB (allocator)", "within budget", "host MB")


def proof_cells(row: Row) -> list[str]:
    """A GPU proof case (bench/budget_gpu.py): the plan made under the budget, then run and measured by the
    allocator; a case that ran out of memory says so."""
    done = row.get("status") == "done"
    within = {True: "yes", False: "**no**"}.get(row.get("within_budget"), "")
    outcome = "" if done else f"{row.get('status')}: {str(row.get('error') or '').split(':')[0]}"
    return [str(row["case"]), str(row.get("dtype", "")), _num(row.get("limit_gb"), "g"),
            _num(row.get("budget_mb"), ".0f"), str(row.get("layout") or ""),
            f"{float(row['seconds']):.2f} s" if done and row.get("seconds") else outcome,
            _num(row.get("predicted_mb"), ".0f"), _num(row.get("measured_mb"), ".0f") if done else "", within,
            _num(row.get("host_mb"), ".0f")]


KINDS_HEADER = ("case", "plan kind", "predicted MB", "peak MB (allocator)", "host MB", "max abs vs plain pass",
                "PSNR dB")


def kinds_cells(row: Row) -> list[str]:
    """One plan kind of a GPU kinds case: its peak and its output against the untiled pass."""
    return [str(row["case"]), str(row.get("layout", "")), _num(row.get("predicted_mb"), ".0f"),
            _num(row.get("measured_mb"), ".0f"), _num(row.get("host_mb"), ".0f"), _num(row.get("max_abs"), ".3g"),
            _num(row.get("psnr_db"), ".1f")]


PLAN_COSTS_HEADER = ("case", "plan kind", "measured", "on PyTorch's conv kernels", "estimated",
                     "rank: measured / estimated", "convolutions",
                     "matmuls, attention", "norms, statistics", "copies", "other ops", "outside ops",
                     "estimate: compute / tiling / launches / host", "device peak MB", "host MB")


def plan_costs_cells(row: Row) -> list[str]:
    """One plan kind of a plan-costs case (bench/plan_costs.py): measured time (and on the CPU its time on PyTorch's
    own conv kernels, the baseline), estimated time, both ranks, where the profiled run's time went, the estimate's
    parts."""
    parts = row.get("measured_parts") or {}
    est = row.get("estimated_parts") or {}
    pytorchs = row.get("pytorch_kernels_ms")
    return [str(row["case"]), str(row["variant"]), _seconds(float(row["ms"])),
            _seconds(float(pytorchs)) if pytorchs is not None else "", _seconds(float(row["estimated_ms"])),
            f"{row.get('measured_rank')} / {row.get('estimated_rank')}",
            *(_num(parts.get(k), ".2f") for k in ("convolutions", "matmuls and attention", "norms and statistics",
                                                  "copies", "other ops", "outside ops")),
            " / ".join(_num(est.get(k), ".2f") for k in ("compute", "tiling", "launches", "host copies")),
            _num(row.get("predicted_peak_mb"), ".0f"), _num(row.get("host_mb"), ".0f")]


DYNAMIC_VRAM_HEADER = ("moment", "device free MB", "core's free MB", "a pass may count on MB", "stand-in resident MB",
                       "VAE resident MB", "the decode")


def dynamic_vram_cells(row: Row) -> list[str]:
    """One moment of the dynamic VRAM check (bench/dynamic_vram.py): what the device, core and the pack saw."""
    return [str(row["case"]), _num(row.get("device_free_mb"), ".0f"), _num(row.get("core_free_mb"), ".0f"),
            _num(row.get("freeable_mb"), ".0f"), _num(row.get("stand_in_loaded_mb"), ".0f"),
            _num(row.get("vae_loaded_mb"), ".0f"), str(row.get("note") or "")]


DYNAMIC_VRAM_CHECKS_HEADER = ("check", "holds", "note")


def dynamic_vram_check_cells(row: Row) -> list[str]:
    return [str(row["case"]), "yes" if row.get("holds") else "**no**", str(row.get("note") or "")]


# table name -> (header, one row's cells)
LAYOUTS = {"results": (HEADER, cells), "roofline": (ROOFLINE_HEADER, roofline_cells),
           "profile": (PROFILE_HEADER, profile_cells), "flops": (FLOPS_HEADER, flops_cells),
           "bytes": (BYTES_HEADER, bytes_cells), "cuts": (CUTS_HEADER, cuts_cells),
           "budget": (BUDGET_HEADER, budget_cells), "plans": (PLANS_HEADER, plans_cells),
           "budget-gpu": (PROOF_HEADER, proof_cells), "kinds-gpu": (KINDS_HEADER, kinds_cells),
           "dynamic-vram": (DYNAMIC_VRAM_HEADER, dynamic_vram_cells),
           "plan-costs": (PLAN_COSTS_HEADER, plan_costs_cells),
           "dynamic-vram-checks": (DYNAMIC_VRAM_CHECKS_HEADER, dynamic_vram_check_cells)}


def _layout(rows: Sequence[Row], unit: str = "s"):
    tables = {table_of(r) for r in rows} or {"results"}
    if len(tables) > 1 or not tables <= set(LAYOUTS):
        raise ValueError(f"rows of tables {sorted(tables)} cannot share one table; pick one with FILE.json#TABLE")
    table = tables.pop()
    if table == "results":
        core = has_core(rows)
        return header(rows), lambda r: cells(r, core=core, unit=unit)
    return LAYOUTS[table]


def format_text(rows: Iterable[Row]) -> str:
    rows = list(rows)
    header, row_cells = _layout(rows)
    lines = [row_cells(r) for r in rows]
    widths = [max([len(h)] + [len(line[i]) for line in lines]) for i, h in enumerate(header)]
    fmt = " | ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), "-+-".join("-" * w for w in widths)] + [fmt.format(*c) for c in lines])


def format_markdown(rows: Iterable[Row], unit: str = "s") -> str:
    """The results table (or the table a section's rows name); rows of the held-memory section
    (`bench/held.py`) as their own pivot table."""
    rows = list(rows)
    if rows and all(r.get("section") == HELD_SECTION for r in rows):
        return format_held_markdown(rows)
    header, row_cells = _layout(rows, unit)
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row_cells(r)) + " |" for r in rows]
    return "\n".join(out)


HELD_SECTION = "held"


def format_held_markdown(rows: Sequence[Row]) -> str:
    """One line per model: its parameters, then what it holds beyond them after each step in turn (the
    steps in the order they ran), as MB and as a share of the parameters."""
    models: dict[str, list[Row]] = {}
    for r in rows:
        models.setdefault(str(r["variant"]), []).append(r)
    steps = list(dict.fromkeys(str(r["case"]) for r in rows))
    out = ["| model | parameters | " + " | ".join(steps) + " |", "|" + "---|" * (len(steps) + 2)]
    for model, model_rows in models.items():
        by_step = {str(r["case"]): r for r in model_rows}
        params = float(model_rows[0]["model_mb"])

        def held(step: str) -> str:
            r = by_step.get(step)
            if r is None or r.get("held_mb") is None:
                return ""
            mb = float(r["held_mb"])
            return f"{mb:+.0f} MB ({100 * mb / params:.1f} %)"

        out.append(f"| {model} | {params:.0f} MB | " + " | ".join(held(s) for s in steps) + " |")
    return "\n".join(out)


def write_chart(rows: Sequence[Row], path: Path) -> Optional[str]:
    """A PNG bar chart of time per path and case next to the results; returns why not when it cannot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e \".[bench]\"); no chart written"
    from ..trt.fileio import atomic_write_bytes
    import io

    rows = list(rows)
    if not rows:
        return "no rows; no chart written"
    if all(table_of(r) == "budget" for r in rows):
        from .budget import budget_chart  # time and peak against budget (bench/budget.py)

        return budget_chart(rows, path)
    labels = [f"{r['case']}\n{r['variant']}"[:90] for r in rows]
    secs = [float(r["ms"]) / 1e3 for r in rows]
    colors = ["#9a9a9a" if c[3] == "reference" else "#d98c2b" if is_core(r) else "#2b7bba"
              for r, c in zip(rows, map(cells, rows))]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.2))
    ax.barh(range(len(rows)), secs, color=colors)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (median; grey = reference" + (", orange = ComfyUI core)" if has_core(rows) else ")"))
    core = has_core(rows)
    for i, c in enumerate(cells(r, core) for r in rows):
        vs_core = f"  {c[len(HEADER)]} vs core" if core and c[len(HEADER)] else ""
        ax.text(secs[i], i, f" {c[2]}" + (f"  {c[3]}" if c[3] not in ("", "reference") else "") + vs_core,
                va="center", fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue(), overwrite=True)
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m turbovae.bench.report", description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", help="results JSON file(s) written by `python -m turbovae bench`; "
                   "FILE.json#TABLE keeps one table's rows (roofline, profile)")
    p.add_argument("--markdown", action="store_true", help="a markdown table (default: plain text); for files "
                   "measured on a GPU, preceded by the line naming the machine")
    p.add_argument("--dtype", help="the dtype of GPU files that do not record one (what their command ran with)")
    p.add_argument("--chart", help="also write a PNG chart to this path")
    args = p.parse_args(argv)
    try:
        rows = [r for path in args.results for r in load_rows(Path(path))]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        tokens = list(args.results) + ([f"dtype={args.dtype}"] if args.dtype else [])
        print(render(tokens) if args.markdown else format_text(rows))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.chart:
        why = write_chart(rows, Path(args.chart))
        if why:
            print(why, file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
