"""The GPU lease run: `turbovae doctor`, then GPU tests, then the benchmark cases in priority order, inside a
time budget.

Why a separate orchestrator: a lent GPU gives at most 10 minutes per call and ~30 minutes per session,
with no network. Every task (the GPU-marked tests, one benchmark case, the engines section) runs in its
own process with its own timeout, and the results file is rewritten atomically after each task, so a
call cut off at its limit keeps every finished case. The next call passes `--resume` with the file the
last call wrote and runs what is still pending (done and failed tasks are not repeated).

`scripts/gpu_run.sh` is the entry point (it prepares the machine: carried wheels, the package on
PYTHONPATH); `--dry-run` runs the same tasks on CPU at tiny sizes (the CI test does).

This module never imports torch: the GPU stays free for the measured processes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..trt.fileio import atomic_write_text

# Case keys in priority order: bench/gpu.py's CUDA cases in the same order (a test checks they agree).
CASE_KEYS = ("qwen-decode-1024", "qwen-encode-1024", "seedvr2-decode-1080p", "seedvr2-decode-720p21",
             "wan21-decode-720p81", "qwen-decode-1328", "qwen-encode-1328")
# Keys with a tiny-config twin in the dry run (bench/gpu.py cases(quick=True)).
DRY_RUN_KEYS = ("qwen-decode-1024", "seedvr2-decode-720p21", "wan21-decode-720p81")
# Simulated out-of-memory failures of the dry run (bench/gpu.py --inject-oom): a reference retried in smaller
# slices, and a step that becomes a row with the error while the case goes on.
DRY_RUN_OOM = ("seedvr2-decode-720p21:+ channels-last", "wan21-decode-720p81:fp32 reference")
DOCTOR_LIMIT_S = 180  # the doctor's own timeout in a call (its micro-bench is bounded; building the models adds)


@dataclass(frozen=True)
class Task:
    """One unit of the run. `expected_s`: what it should take on an H100 (a task is started only when the
    call's remaining budget covers it); `limit_s`: its own timeout (a hang costs no more)."""

    key: str
    argv: tuple[str, ...]  # arguments after `python -m`
    expected_s: float
    limit_s: float
    bench: bool = True  # writes a bench JSON whose rows are collected


@dataclass
class TaskResult:
    key: str
    status: str  # done | failed | pending | skipped
    seconds: Optional[float] = None
    detail: str = ""


@dataclass
class RunState:
    """What the results file holds; rewritten whole after every task."""

    environment: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)
    tasks: list = field(default_factory=list)  # TaskResult dicts, in plan order
    calls: list = field(default_factory=list)
    dry_run: bool = False
    doctor: dict = field(default_factory=dict)  # this call's `turbovae doctor` run: file, status, seconds, report

    def result(self, key: str) -> Optional[dict]:
        return next((t for t in self.tasks if t["key"] == key), None)

    def record(self, result: TaskResult) -> None:
        entry = asdict(result)
        for i, t in enumerate(self.tasks):
            if t["key"] == result.key:
                self.tasks[i] = entry
                return
        self.tasks.append(entry)

    def to_json(self) -> dict:
        return {"environment": self.environment, "doctor": self.doctor, "rows": [_finite(r) for r in self.rows],
                "tasks": self.tasks, "run": {"script": "scripts/gpu_run.sh", "dry_run": self.dry_run,
                                             "calls": self.calls}}

    @classmethod
    def from_json(cls, payload: dict) -> "RunState":
        run = payload.get("run") or {}
        return cls(environment=dict(payload.get("environment") or {}), rows=list(payload.get("rows") or []),
                   tasks=list(payload.get("tasks") or []), calls=list(run.get("calls") or []),
                   dry_run=bool(run.get("dry_run", False)), doctor=dict(payload.get("doctor") or {}))


def _finite(row: dict) -> dict:
    """NaN/inf are not JSON: failed measurements become null (their note says why)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def plan(*, dry_run: bool, only: Sequence[str] = (), tests: bool = True, engines: bool = True) -> list[Task]:
    """The tasks in priority order: GPU tests, each benchmark case, the slice-cost section, engines."""
    py = ("-m",)
    if dry_run:
        device = ("--device", "cpu", "--dtype", "fp32", "--quick", "--repeat", "1", "--warmup", "0")
    else:
        device = ("--device", "cuda", "--dtype", "bf16", "--repeat", "5", "--warmup", "2")
    tasks = []
    if tests:
        tasks.append(Task("gpu-tests", py + ("pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests"),
                          expected_s=150, limit_s=300, bench=False))
    expected = {"wan21-decode-720p81": (300, 480), "seedvr2-decode-720p21": (150, 360)}
    for key in CASE_KEYS:
        if dry_run and key not in DRY_RUN_KEYS:
            continue
        exp, lim = expected.get(key, (90, 300))
        faults = tuple(a for f in DRY_RUN_OOM if f.startswith(key + ":") for a in ("--inject-oom", f)) if dry_run else ()
        tasks.append(Task(key, py + ("turbovae", "bench", "--sections", "gpu", "--cases", key) + device + faults,
                          expected_s=exp, limit_s=lim))
    # Slice cost (bench/slices.py): what vae/memory.py FASTEST_SLICE needs for CUDA.
    tasks.append(Task("slices", py + ("turbovae", "bench", "--sections", "slices") + device,
                      expected_s=90, limit_s=240))
    # Roofline and per-kind profile (bench/roofline.py, bench/profile_layers.py) at the GPU case sizes; the dry
    # run leaves them out (tests/test_bench_roofline.py runs their --quick form).
    if not dry_run:
        tasks.append(Task("roofline", py + ("turbovae", "bench", "--sections", "roofline,profile") + device,
                          expected_s=240, limit_s=540))
    if engines and not dry_run:  # AOTInductor builds take minutes on CPU: not part of the dry run
        tasks.append(Task("engines", py + ("turbovae", "bench", "--sections", "engines", "--device", "cuda"),
                          expected_s=300, limit_s=540))
    if only:
        tasks = [t for t in tasks if t.key in only]
    return tasks


def results_name(environment: dict, dry_run: bool) -> str:
    """`<yyyy-mm-dd>-<gpu>.json`, the name it is committed under in docs/results/."""
    date = str(environment.get("date", ""))[:10] or datetime.now(timezone.utc).strftime("%Y-%m-%d")
    device = "cpu-dry-run" if dry_run else (environment.get("gpu") or "no-gpu")
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    return f"{date}-{slug}.json"




def markdown(state: RunState) -> str:
    """The rows as a markdown table (what docs/BENCHMARKS.md shows), then every task's status."""
    env = state.environment
    head = ", ".join(f"{k} {env[k]}" for k in ("gpu", "driver", "cuda", "cudnn", "torch", "triton", "date")
                     if env.get(k) is not None)
    out = [f"Environment: {head}", "",
           "| case | variant | ms | vs baseline | peak MB | PSNR dB | max err | note |",
           "|---|---|---|---|---|---|---|---|"]
    for r in state.rows:
        def num(key: str, fmt: str) -> str:
            v = r.get(key)
            return format(v, fmt) if isinstance(v, (int, float)) else ""
        speed = f"{r['speedup']:.2f}x" if isinstance(r.get("speedup"), (int, float)) else ""
        out.append(f"| {r.get('case', '')} | {r.get('variant', '')} | {num('ms', '.1f')} | {speed} | "
                   f"{num('peak_mb', '.0f')} | {num('psnr_db', '.1f')} | {num('max_abs_err', '.1e')} | "
                   f"{r.get('note', '')} |")
    out += ["", "| task | status | seconds | detail |", "|---|---|---|---|"]
    for t in state.tasks:
        secs = f"{t['seconds']:.0f}" if isinstance(t.get("seconds"), (int, float)) else ""
        out.append(f"| {t['key']} | {t['status']} | {secs} | {t.get('detail', '')} |")
    return "\n".join(out) + "\n"


Runner = Callable[[Task, float, Path], tuple[int, str, Optional[dict]]]


def run_subprocess(task: Task, timeout: float, workdir: Path) -> tuple[int, str, Optional[dict]]:
    """Run one task; (exit code or -1 on timeout, its output's tail, the bench JSON it wrote or None)."""
    out_json = workdir / f"{task.key}.json"
    out_json.unlink(missing_ok=True)
    argv = [sys.executable, *task.argv] + (["--out", str(out_json)] if task.bench else [])
    log = workdir / f"{task.key}.log"
    with open(log, "w") as f:
        try:
            code = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = -1
    text = log.read_text(errors="replace")
    payload = json.loads(out_json.read_text()) if task.bench and out_json.exists() else None
    return code, text, payload


def _tail(text: str, lines: int = 3) -> str:
    kept = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return " / ".join(kept[-lines:])[-400:]


def execute(tasks: Sequence[Task], state: RunState, out_file: Path, *, budget_s: float,
            runner: Runner = run_subprocess, clock: Callable[[], float] = time.monotonic,
            log_file: Optional[Path] = None) -> RunState:
    """Run the pending tasks in order while the budget covers them; rewrite `out_file` after each one."""
    start = clock()
    call = {"started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"), "budget_s": budget_s,
            "ran": []}
    state.calls.append(call)
    for task in tasks:  # pending entries first, so a cut-off file lists what is left
        if state.result(task.key) is None:
            state.record(TaskResult(task.key, "pending"))
    workdir = Path(tempfile.mkdtemp(prefix="turbovae-gpu-run-"))
    for task in tasks:
        previous = state.result(task.key)
        if previous and previous["status"] in ("done", "failed", "skipped"):
            continue
        left = budget_s - (clock() - start)
        if left < task.expected_s:
            _say(f"{task.key}: pending ({left:.0f} s left in this call, it needs ~{task.expected_s:.0f} s); "
                 "run again with --resume")
            continue
        timeout = min(task.limit_s, left)
        _say(f"{task.key}: running (timeout {timeout:.0f} s)")
        t0 = clock()
        code, text, payload = runner(task, timeout, workdir)
        seconds = clock() - t0
        if log_file is not None:
            with open(log_file, "a") as f:
                f.write(f"\n===== {task.key} (exit {code}, {seconds:.0f} s) =====\n{text}")
        if payload is not None:
            state.environment = state.environment or payload.get("environment", {})
            state.rows.extend(payload.get("rows", []))
        if code == 0:
            result = TaskResult(task.key, "done", seconds, _tail(text, 1) if not task.bench else "")
        elif code == -1:
            result = TaskResult(task.key, "failed", seconds, f"timed out after {timeout:.0f} s; {_tail(text)}")
        else:
            result = TaskResult(task.key, "failed", seconds, f"exit {code}: {_tail(text)}")
        state.record(result)
        call["ran"].append(task.key)
        atomic_write_text(out_file, json.dumps(state.to_json(), indent=2), overwrite=True)
        atomic_write_text(out_file.with_suffix(".md"), markdown(state), overwrite=True)
        _say(f"{task.key}: {result.status} in {seconds:.0f} s {result.detail[:200]}")
    call["elapsed_s"] = round(clock() - start, 1)
    atomic_write_text(out_file, json.dumps(state.to_json(), indent=2), overwrite=True)
    atomic_write_text(out_file.with_suffix(".md"), markdown(state), overwrite=True)
    return state


def run_doctor(out_dir: Path, *, dry_run: bool, timeout: float = DOCTOR_LIMIT_S) -> dict:
    """Each call's first step: `turbovae doctor` in a child process, its JSON written under `out_dir` before
    anything else runs (doctor-<UTC time>.json: a call may land on another machine, so every call has one).
    Returns what the results file records: file, status, seconds, and the report itself when it ran."""
    name = f"doctor-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}.json"
    argv = [sys.executable, "-m", "turbovae", "doctor", "--out", str(out_dir / name)]
    argv += ["--device", "cpu"] if dry_run else []
    _say(f"doctor: running (timeout {timeout:.0f} s)")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        code, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, text = -1, f"timed out after {timeout:.0f} s; " + str(exc.stdout or "")
    seconds = round(time.monotonic() - t0, 1)
    print(text, flush=True)
    record = {"file": name, "seconds": seconds, "status": "done" if code == 0 else "failed"}
    try:
        record["report"] = json.loads((out_dir / name).read_text())
    except (OSError, ValueError):
        record["detail"] = _tail(text)
    _say(f"doctor: {record['status']} in {seconds:.0f} s")
    return record


def _say(msg: str) -> None:
    print(f"[gpu-run {datetime.now(timezone.utc).strftime('%H:%M:%S')}] {msg}", flush=True)


def probe_environment(dry_run: bool) -> dict:
    """The bench's environment record, read in a child process (this one never initialises CUDA)."""
    code = "import json; from turbovae.bench.common import environment; print(json.dumps(environment()))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        env = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        env = {"error": f"environment probe failed: {type(exc).__name__}"}
    if not dry_run and not env.get("gpu"):
        raise SystemExit("gpu-run: no CUDA device visible to torch; on a CPU machine use --dry-run")
    return env


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m turbovae.bench.gpu_run", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or "gpu_results",
                   help="folder for the results JSON/markdown and logs (default: $OUT, else gpu_results)")
    p.add_argument("--resume", help="results JSON of an earlier call: keep its rows, run only pending tasks")
    p.add_argument("--budget", type=float, default=540.0,
                   help="seconds this call may spend on the doctor and the tasks (default 540: inside the "
                        "10-minute call limit)")
    p.add_argument("--only", help="comma list of task keys (gpu-tests, the case keys, engines)")
    p.add_argument("--no-tests", action="store_true", help="skip the GPU-marked tests")
    p.add_argument("--no-engines", action="store_true", help="skip the engines section")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny configs: the same tasks in seconds")
    args = p.parse_args(argv)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.resume:
        try:
            state = RunState.from_json(json.loads(Path(args.resume).read_text()))
        except (OSError, ValueError) as exc:
            print(f"gpu-run: cannot resume from {args.resume}: {exc}", file=sys.stderr)
            return 2
        name = Path(args.resume).name
    else:
        state = RunState(environment=probe_environment(args.dry_run), dry_run=args.dry_run)
        name = results_name(state.environment, args.dry_run)
    only = tuple(k.strip() for k in (args.only or "").split(",") if k.strip())
    tasks = plan(dry_run=state.dry_run, only=only, tests=not args.no_tests, engines=not args.no_engines)
    out_file = out_dir / name
    state.doctor = run_doctor(out_dir, dry_run=state.dry_run)
    budget = args.budget - state.doctor["seconds"]
    _say(f"writing {out_file} after every task; budget {budget:.0f} s; tasks: " + ", ".join(t.key for t in tasks))
    execute(tasks, state, out_file, budget_s=budget, log_file=out_dir / "tasks.log")
    print("\n" + markdown(state), flush=True)
    pending = [t["key"] for t in state.tasks if t["status"] == "pending"]
    if pending:
        _say(f"pending: {', '.join(pending)}; next call: scripts/gpu_run.sh --resume <this file>")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
