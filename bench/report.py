"""Results tables and the chart, rendered from benchmark rows or a results JSON.

`python -m turbovae.bench.report RESULTS.json [...] [--markdown] [--chart OUT.png]` prints the table of
one or more results files. The README's results table is this command's markdown output for the
committed files in docs/results/ (a test checks that they agree), so no number is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

Row = Mapping[str, object]
HEADER = ("case", "path", "time", "vs reference", "peak MB", "max abs err", "PSNR dB")
# Added when the rows hold a ComfyUI core baseline (`bench --comfyui`): core's time over the row's time, and
# the core row's max abs error against TurboVAE (its "max abs err" is against the reference, like every row's).
CORE_HEADER = ("vs ComfyUI core", "core err vs turbovae")


def load_rows(path: Path) -> list[dict]:
    """Rows of a results JSON written by `python -m turbovae bench` (or its sections)."""
    try:
        data = json.loads(Path(path).read_text())
        rows = data["rows"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a benchmark results file ({type(e).__name__}: {e})") from e
    return list(rows)


def _seconds(ms: object) -> str:
    return f"{float(ms) / 1e3:.2f} s"


def has_core(rows: Iterable[Row]) -> bool:
    """Whether the rows compare with ComfyUI core (then the tables have the CORE_HEADER columns)."""
    return any(r.get("core_ms") is not None or r.get("err_vs_ours") is not None for r in rows)


def is_core(row: Row) -> bool:
    return row.get("err_vs_ours") is not None


def header(rows: Sequence[Row]) -> tuple[str, ...]:
    return HEADER + (CORE_HEADER if has_core(rows) else ())


def cells(row: Row, core: bool = False) -> list[str]:
    """One row's cells: the reference row of a case says so; other rows give reference time / own time.
    `core`: also the CORE_HEADER cells."""
    speedup = row.get("speedup")
    # Older results files have no "reference" field; their reference rows are their own baseline.
    reference = row.get("reference", row.get("baseline_ms") == row.get("ms") and speedup in (None, 1.0))
    peak, err, db = row.get("peak_mb"), row.get("max_abs_err"), row.get("psnr_db")
    own = [
        str(row["case"]),
        str(row["variant"]),
        _seconds(row["ms"]),
        "reference" if reference else (f"{speedup:.2f}x" if speedup else ""),
        f"{peak:.0f}" if peak is not None else "",
        f"{err:.1e}" if err is not None else "",
        ("inf" if db == float("inf") else f"{db:.1f}") if db is not None else "",
    ]
    if not core:
        return own
    core_ms, core_err = row.get("core_ms"), row.get("err_vs_ours")
    return own + [f"{float(core_ms) / float(row['ms']):.2f}x" if core_ms else "",
                  f"{core_err:.1e}" if core_err is not None else ""]


def format_text(rows: Iterable[Row]) -> str:
    rows = list(rows)
    head, core = header(rows), has_core(rows)
    lines = [cells(r, core) for r in rows]
    widths = [max([len(h)] + [len(line[i]) for line in lines]) for i, h in enumerate(head)]
    fmt = " | ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), "-+-".join("-" * w for w in widths)] + [fmt.format(*c) for c in lines])


def format_markdown(rows: Iterable[Row]) -> str:
    rows = list(rows)
    head, core = header(rows), has_core(rows)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in cells(r, core)) + " |" for r in rows]
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
    p.add_argument("results", nargs="+", help="results JSON file(s) written by `python -m turbovae bench`")
    p.add_argument("--markdown", action="store_true", help="a markdown table (default: plain text)")
    p.add_argument("--chart", help="also write a PNG chart to this path")
    args = p.parse_args(argv)
    try:
        rows = [r for path in args.results for r in load_rows(Path(path))]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_markdown(rows) if args.markdown else format_text(rows))
    if args.chart:
        why = write_chart(rows, Path(args.chart))
        if why:
            print(why, file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
