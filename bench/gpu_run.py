"""The GPU lease run: `turbovae doctor`, then GPU tests, then the benchmark cases in priority order, inside a
time budget.

Why a separate orchestrator: a lent GPU gives 15 minutes of device time in all (the machine's start included),
at most 10 minutes per call, stays warm only 30 s after a call, and has no network. Every task (the GPU-marked
tests, one benchmark case, the engines section) runs in its own process with its own timeout, and the results
file is rewritten atomically after each task, so a call cut off at its limit keeps every finished case. The
next call passes `--resume` with the file the last call wrote and runs what is still pending or was cut (done and
failed tasks are not repeated). A task is cut, not failed, when the call ended it rather than its own limit: the
call's budget was its timeout, or the call was killed or interrupted while it ran (the file says `running` until
the task returns). Every call records its own environment (a resumed call may land on another GPU), each row the
call that measured it, and the file's `environment` is that of the calls that measured rows.

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
# The first call's budget: the essentials (doctor, the clip cases, the GPU tests) inside 8 minutes of a 15-minute
# lease that also pays for the machine's start; a second warm call (--resume) does the image cases.
FIRST_CALL_BUDGET_S = 465.0
# Simulated out-of-memory failures of the dry run (bench/gpu.py --inject-oom): a reference retried in smaller
# slices, and a step that becomes a row with the error while the case goes on.
DRY_RUN_OOM = ("seedvr2-decode-720p21:+ channels-last", "wan21-decode-720p81:fp32 reference")
DOCTOR_LIMIT_S = 180  # the doctor's own timeout in a call (its micro-bench is bounded; building the models adds)
# The checkout this module belongs to (through the `turbovae` link the script makes, resolved): every task runs
# with it as the working directory, so the relative paths below mean the same on any machine.
CHECKOUT = Path(__file__).resolve().parents[1]
# What the GPU-tests task selects: the GPU-marked tests, plus the `lease_canary` test that runs on any device,
# so a run where every GPU test is skipped (the CPU dry run) still sets one test up and proves setup works.
GPU_TESTS_MARK = "gpu or lease_canary"


def pytest_argv(paths: Sequence[str] = ("tests",)) -> tuple[str, ...]:
    """The GPU tests' pytest invocation (after `python -m`), one definition for the lease run and its CI check.

    Why `--confcutdir tests`: pytest 9 builds a collector for every folder between the confcutdir (by default
    the folder of pyproject.toml) and the tests, and the checkout root holds `__init__.py`, so the root becomes
    a Package node whose setup imports that file. It can import it as a package only when the checkout's
    folder name is a valid module name; a lent machine's copy (or a `ComfyUI-TurboVAE` clone) is not, and the
    file then runs as a lone module whose relative imports fail at every test's setup. With the confcutdir at
    `tests/`, no collector above `tests/` exists and the package is imported only as `turbovae`."""
    return ("pytest", "-m", GPU_TESTS_MARK, "-q", "-p", "no:cacheprovider", "--confcutdir", "tests", *paths)


@dataclass(frozen=True)
class Task:
    """One unit of the run. `expected_s`: what it should take on an H100 (a task is started only when the
    call's remaining budget covers it); `limit_s`: its own timeout (a hang costs no more)."""

    key: str
    argv: tuple[str, ...]  # arguments after `python -m`
    expected_s: float
    limit_s: float
    bench: bool = True  # writes a bench JSON whose rows are collected
    skip: str = ""  # why this task cannot run in this call (recorded as skipped, never started)


@dataclass
class TaskResult:
    key: str
    status: str  # done | failed | pending | skipped | running | cut (FINAL_STATUSES are never run again)
    seconds: Optional[float] = None
    detail: str = ""
    call: Optional[int] = None  # the call (1, 2, ...: `run.calls[].call`) that last started or planned it


FINAL_STATUSES = ("done", "failed")  # a failed task failed by itself (exit code, its own limit): rerunning repeats it
# Keys of an environment that describe when a call ran, not the machine: calls that differ in them agree.
MOMENT_KEYS = ("date", "load_average_1m")


def merge_environments(envs: Sequence[dict]) -> dict:
    """One environment for the calls `envs`: a key's value where they agree; where they differ, the values joined
    with " + " in call order (two GPUs measured: "A + B"), except `MOMENT_KEYS`, which keep the first call's."""
    merged: dict = {}
    for key in dict.fromkeys(k for env in envs for k in env):
        values: list = []
        for env in envs:
            if key in env and env[key] not in values:
                values.append(env[key])
        merged[key] = values[0] if len(values) == 1 or key in MOMENT_KEYS else " + ".join(map(str, values))
    return merged


@dataclass
class RunState:
    """What the results file holds; rewritten whole after every task. Each call (`calls`) records its number,
    budget, environment and the tasks it ran; each row the call that measured it (`call`) and its task (`task`).
    `environment` is only for rows without a call: those of a file written before calls recorded theirs."""

    environment: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)
    tasks: list = field(default_factory=list)  # TaskResult dicts, in plan order
    calls: list = field(default_factory=list)
    dry_run: bool = False
    doctor: dict = field(default_factory=dict)  # this call's `turbovae doctor` run: file, status, seconds, report

    def measured_environment(self) -> dict:
        """The environment of the calls that measured rows (merged where they differ: `merge_environments`);
        empty while no row is measured, so the file never names a GPU that measured nothing."""
        measured = {r.get("call") for r in self.rows}
        envs = [self.environment] if None in measured else []
        envs += [c.get("environment") or {} for c in self.calls if c.get("call") in measured]
        return merge_environments(envs)

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
        return {"environment": self.measured_environment(), "doctor": self.doctor,
                "rows": [_finite(r) for r in self.rows],
                "tasks": self.tasks, "run": {"script": "scripts/gpu_run.sh", "dry_run": self.dry_run,
                                             "calls": self.calls}}

    @classmethod
    def from_json(cls, payload: dict) -> "RunState":
        run = payload.get("run") or {}
        rows = list(payload.get("rows") or [])
        calls = [dict(c, call=c.get("call", i + 1)) for i, c in enumerate(run.get("calls") or [])]
        # The file's environment is derived from its calls, unless it holds rows no call claims (an older file).
        legacy = dict(payload.get("environment") or {}) if any("call" not in r for r in rows) else {}
        return cls(environment=legacy, rows=rows, tasks=list(payload.get("tasks") or []), calls=calls,
                   dry_run=bool(run.get("dry_run", False)), doctor=dict(payload.get("doctor") or {}))


def _finite(row: dict) -> dict:
    """NaN/inf are not JSON: failed measurements become null (their note says why)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


# The plan's order: the gaps first. The clip cases (no committed GPU row for the SeedVR2 clip; the Wan clip ran
# only outside the script), then the GPU tests, then the image cases, then what the next lease must bring back
# (ComfyUI core's VAE as a side, the per-kernel clip profile, slices and engines on CUDA), then the rest.
CLIP_KEYS = ("seedvr2-decode-720p21", "wan21-decode-720p81")
IMAGE_KEYS = ("qwen-decode-1024", "qwen-encode-1024", "seedvr2-decode-1080p")
LATER_KEYS = ("qwen-decode-1328", "qwen-encode-1328")
# Cases of the main job that ComfyUI core's VAE joins on CUDA (bench/main.py CUDA_CASES / CORE_CUDA_CASES):
# every family core has, and clips of at least 3 latent frames (a core commit that decodes Wan clips wrongly
# from 3 latent frames on agrees with ours on 2-latent clips, so 2-latent rows cannot tell).
CORE_CASES = ("Qwen-Image image decode 1024²", "Wan 2.1 17-frame decode 480×832", "Wan 2.2 9-frame decode 512²",
              "SeedVR2 9-frame decode 512²")
COMFYUI_ENV = "TURBOVAE_COMFYUI"  # a ComfyUI tree (files only); else a carried `.comfyui/` in the checkout
# Packages core's `comfy.sd` imports that a VAE never calls, stubbed where the lent machine lacks them (the core
# rows' note names what was stubbed). Whether core needs others there is for the next lease to show: its task's
# output names a missing package, which is then carried as a wheel or, if a VAE never calls it, added here.
CORE_STUBS = ("av",)


@dataclass(frozen=True)
class Expected:
    """A task's expected and limit seconds on an H100. `measured`: the expected time is what the first H100 run
    took for the task (docs/results/2026-11-26-h100-README.md); otherwise it is an estimate, to be replaced by
    the time the next lease measures (the results file records every task's seconds)."""

    expected_s: float
    limit_s: float
    measured: bool


EXPECTED = {
    "gpu-tests": Expected(60, 300, True),
    "seedvr2-decode-720p21": Expected(150, 360, False),  # died out of memory in that run: no time yet
    "wan21-decode-720p81": Expected(200, 420, False),  # the session reported its time; no file holds it
    "qwen-decode-1024": Expected(45, 180, True),
    "qwen-encode-1024": Expected(45, 180, True),
    "seedvr2-decode-1080p": Expected(145, 300, True),
    "core-vae": Expected(180, 420, False),
    "kernel-profile": Expected(90, 300, False),
    "slices": Expected(90, 240, False),
    "engines": Expected(300, 540, False),
    "qwen-decode-1328": Expected(60, 240, False),
    "qwen-encode-1328": Expected(60, 240, False),
    "roofline": Expected(240, 540, False),
}


def find_comfyui(environ: Optional[dict] = None) -> Optional[Path]:
    """The ComfyUI tree the core-vae task uses: $TURBOVAE_COMFYUI, else `.comfyui/` carried into the checkout."""
    environ = os.environ if environ is None else environ
    for candidate in (environ.get(COMFYUI_ENV), CHECKOUT / ".comfyui"):
        if candidate and (Path(candidate) / "comfy").is_dir():
            return Path(candidate)
    return None


def plan(*, dry_run: bool, only: Sequence[str] = (), tests: bool = True, engines: bool = True,
         comfyui: Optional[Path] = None) -> list[Task]:
    """The tasks in priority order: the clip cases, the GPU tests, the image cases, ComfyUI core's VAE as a
    side, the per-kernel clip profile, the slices and engines sections on CUDA, then the rest. A task that cannot
    run here (core's VAE without a tree) is planned with `skip` saying why, so the results file lists it."""
    py = ("-m",)
    if dry_run:
        device = ("--device", "cpu", "--dtype", "fp32", "--quick", "--repeat", "1", "--warmup", "0")
    else:
        device = ("--device", "cuda", "--dtype", "bf16", "--repeat", "5", "--warmup", "2")
    tasks: list[Task] = []

    def add(key: str, argv: tuple[str, ...], bench: bool = True, skip: str = "") -> None:
        e = EXPECTED[key]
        tasks.append(Task(key, argv, expected_s=e.expected_s, limit_s=e.limit_s, bench=bench, skip=skip))

    def case(key: str) -> None:
        if not dry_run or key in DRY_RUN_KEYS:
            faults = tuple(a for f in DRY_RUN_OOM if f.startswith(key + ":") for a in ("--inject-oom", f)) if dry_run else ()
            add(key, py + ("turbovae", "bench", "--sections", "gpu", "--cases", key) + device + faults)

    for key in CLIP_KEYS:
        case(key)
    if tests:
        add("gpu-tests", py + pytest_argv(), bench=False)
    for key in IMAGE_KEYS:
        case(key)
    # ComfyUI core's own VAE built by core's loader from the same weights, beside ours and the reference
    # (bench/comfy_core.py); `--comfyui-stub` lets core's loader import without packages a VAE never calls.
    core_argv = py + ("turbovae", "bench", "--comfyui", str(comfyui or ""), "--comfyui-stub", ",".join(CORE_STUBS),
                      "--cases", ",".join(CORE_CASES), "--device", "cuda", "--dtype", "bf16", "--repeat", "3")
    if dry_run:
        core_skip = "dry run: core's VAE needs a ComfyUI tree and the CUDA cases"
    elif comfyui is None:
        core_skip = f"no ComfyUI tree: carry one as .comfyui/ (files only) or set {COMFYUI_ENV}"
    else:
        core_skip = ""
    add("core-vae", core_argv, skip=core_skip)
    # Per-kernel profile of each clip case (bench/kernel_profile.py): top kernels by time, share of the pass.
    add("kernel-profile", py + ("turbovae.bench.kernel_profile", "--top", "15") +
        (("--device", "cpu", "--dtype", "fp32", "--quick") if dry_run else ("--device", "cuda", "--dtype", "bf16")))
    # Slice cost (bench/slices.py): what vae/memory/device.py FASTEST_SLICE needs for CUDA.
    add("slices", py + ("turbovae", "bench", "--sections", "slices") + device)
    if engines and not dry_run:  # AOTInductor builds take minutes on CPU: not part of the dry run
        add("engines", py + ("turbovae", "bench", "--sections", "engines", "--device", "cuda", "--dtype", "bf16"))
    for key in LATER_KEYS:
        case(key)
    # Roofline and per-kind profile (bench/roofline.py, bench/profile_layers.py) at the GPU case sizes; the dry
    # run leaves them out (tests/test_bench_roofline.py runs their --quick form).
    if not dry_run:
        add("roofline", py + ("turbovae", "bench", "--sections", "roofline,profile") + device)
    if only:
        tasks = [t for t in tasks if t.key in only]
    return tasks


def results_name(environment: dict, dry_run: bool) -> str:
    """`<yyyy-mm-dd>-<gpu>.json`, the name it is committed under in docs/results/."""
    date = str(environment.get("date", ""))[:10] or datetime.now(timezone.utc).strftime("%Y-%m-%d")
    device = "cpu-dry-run" if dry_run else (environment.get("gpu") or "no-gpu")
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    return f"{date}-{slug}.json"




def _env_line(env: dict) -> str:
    return ", ".join(f"{k} {env[k]}" for k in ("gpu", "driver", "cuda", "cudnn", "torch", "triton", "date")
                     if env.get(k) is not None)


def markdown(state: RunState) -> str:
    """The rows as a markdown table (what docs/BENCHMARKS.md shows), then every task's status; each call's
    environment, and the call that measured each row."""
    out = [f"Environment: {_env_line(state.measured_environment())}", ""]
    for c in state.calls:
        out.append(f"Call {c.get('call')}: {_env_line(c.get('environment') or {}) or 'environment not recorded'}; "
                   f"ran {', '.join(c.get('ran') or []) or 'nothing'}  ")
    out += ["", "| case | variant | ms | vs baseline | peak MB | PSNR dB | max err | note | call |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in state.rows:
        def num(key: str, fmt: str) -> str:
            v = r.get(key)
            return format(v, fmt) if isinstance(v, (int, float)) else ""
        speed = f"{r['speedup']:.2f}x" if isinstance(r.get("speedup"), (int, float)) else ""
        out.append(f"| {r.get('case', '')} | {r.get('variant', '')} | {num('ms', '.1f')} | {speed} | "
                   f"{num('peak_mb', '.0f')} | {num('psnr_db', '.1f')} | {num('max_abs_err', '.1e')} | "
                   f"{r.get('note', '')} | {r.get('call', '')} |")
    out += ["", "| task | status | seconds | detail | call |", "|---|---|---|---|---|"]
    for t in state.tasks:
        secs = f"{t['seconds']:.0f}" if isinstance(t.get("seconds"), (int, float)) else ""
        call = t.get("call")
        out.append(f"| {t['key']} | {t['status']} | {secs} | {t.get('detail', '')} | {'' if call is None else call} |")
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
            code = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                  cwd=CHECKOUT).returncode
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
            log_file: Optional[Path] = None, environment: Optional[dict] = None) -> RunState:
    """Run the pending and cut tasks in order while the budget covers them; rewrite `out_file` after each one.
    `environment`: this call's (the probe's; without one, the first bench payload's)."""
    start = clock()
    number = len(state.calls) + 1
    call = {"call": number, "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "budget_s": budget_s, "environment": dict(environment or {}), "ran": []}
    state.calls.append(call)

    def save() -> None:
        atomic_write_text(out_file, json.dumps(state.to_json(), indent=2), overwrite=True)
        atomic_write_text(out_file.with_suffix(".md"), markdown(state), overwrite=True)

    for t in list(state.tasks):  # a task still running in the file: its call was killed while it ran
        if t["status"] == "running":
            state.record(TaskResult(t["key"], "cut", None, f"call {t.get('call')} was killed while it ran; "
                                    "rerun", t.get("call")))
    for task in tasks:  # pending entries first, so a cut-off file lists what is left
        if state.result(task.key) is None:
            state.record(TaskResult(task.key, "pending"))
    workdir = Path(tempfile.mkdtemp(prefix="turbovae-gpu-run-"))
    for task in tasks:
        previous = state.result(task.key)
        if previous and previous["status"] in FINAL_STATUSES:  # a skipped, pending or cut task is run again
            continue
        if task.skip:
            state.record(TaskResult(task.key, "skipped", None, task.skip, number))
            _say(f"{task.key}: skipped ({task.skip})")
            continue
        left = budget_s - (clock() - start)
        if left < task.expected_s:
            if previous is None or previous["status"] == "pending":
                state.record(TaskResult(task.key, "pending", None, f"call {number} had {left:.0f} s left, it needs "
                                        f"~{task.expected_s:.0f} s", number))
            _say(f"{task.key}: pending ({left:.0f} s left in this call, it needs ~{task.expected_s:.0f} s); "
                 "run again with --resume")
            continue
        timeout = min(task.limit_s, left)
        by_budget = timeout < task.limit_s  # a timeout then is the call's end, not the task's own limit
        _say(f"{task.key}: running (timeout {timeout:.0f} s)")
        state.record(TaskResult(task.key, "running", None, f"started by call {number}", number))
        save()
        t0 = clock()
        try:
            code, text, payload = runner(task, timeout, workdir)
        except BaseException as exc:  # interrupted (Ctrl-C, SystemExit): the task is cut, the next call reruns it
            state.record(TaskResult(task.key, "cut", clock() - t0, f"call {number} was interrupted while it ran "
                                    f"({type(exc).__name__}); rerun", number))
            save()
            raise
        seconds = clock() - t0
        if log_file is not None:
            with open(log_file, "a") as f:
                f.write(f"\n===== {task.key} (exit {code}, {seconds:.0f} s) =====\n{text}")
        if payload is not None:
            call["environment"] = call["environment"] or dict(payload.get("environment") or {})
            # A rerun (of a cut task) replaces the rows its earlier attempt left.
            state.rows = [r for r in state.rows if r.get("task") != task.key]
            state.rows.extend(dict(r, call=number, task=task.key) for r in payload.get("rows", []))
        if code == 0:
            result = TaskResult(task.key, "done", seconds, _tail(text, 1) if not task.bench else "", number)
        elif code == -1 and by_budget:
            result = TaskResult(task.key, "cut", seconds, f"cut off by call {number}'s budget after {timeout:.0f} s "
                                f"(its own limit is {task.limit_s:.0f} s); run again with --resume; {_tail(text)}",
                                number)
        elif code == -1:
            result = TaskResult(task.key, "failed", seconds, f"timed out after {timeout:.0f} s; {_tail(text)}",
                                number)
        else:
            result = TaskResult(task.key, "failed", seconds, f"exit {code}: {_tail(text)}", number)
        state.record(result)
        call["ran"].append(task.key)
        save()
        _say(f"{task.key}: {result.status} in {seconds:.0f} s {result.detail[:200]}")
    call["elapsed_s"] = round(clock() - start, 1)
    save()
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
    p.add_argument("--budget", type=float, default=FIRST_CALL_BUDGET_S,
                   help=f"seconds this call may spend on the doctor and the tasks (default {FIRST_CALL_BUDGET_S:.0f}: "
                        "the first call of a 15-minute lease does the essentials inside 8 minutes; give a resumed "
                        "call what is left of the lease, docs/gpu.md)")
    p.add_argument("--only", help="comma list of task keys (gpu-tests, the case keys, core-vae, kernel-profile, "
                                  "slices, engines, roofline)")
    p.add_argument("--no-tests", action="store_true", help="skip the GPU-marked tests")
    p.add_argument("--no-engines", action="store_true", help="skip the engines section")
    p.add_argument("--skip-doctor", action="store_true",
                   help="with --resume on the same warm machine: the first call's doctor report stands")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny configs: the same tasks in seconds")
    args = p.parse_args(argv)
    started = time.monotonic()  # the budget counts from here: the environment probe and the doctor are part of it

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
        state = RunState(dry_run=args.dry_run)
        name = ""
    # Every call probes its own environment: a resumed call may run on another machine and GPU.
    environment = probe_environment(state.dry_run)
    environment.setdefault("dtype", "fp32" if state.dry_run else "bf16")  # what every case task runs in
    name = name or results_name(environment, state.dry_run)
    earlier = {str(c.get("environment", {}).get("gpu")) for c in state.calls if c.get("environment")}
    if earlier and earlier != {str(environment.get("gpu"))}:
        _say(f"this call runs on {environment.get('gpu')}; earlier calls ran on {', '.join(sorted(earlier))} "
             "(each row names its call)")
    only = tuple(k.strip() for k in (args.only or "").split(",") if k.strip())
    if args.skip_doctor and not args.resume:
        print("gpu-run: --skip-doctor is for a resumed call (the first call's doctor report stands)", file=sys.stderr)
        return 2
    tasks = plan(dry_run=state.dry_run, only=only, tests=not args.no_tests, engines=not args.no_engines,
                 comfyui=find_comfyui())
    out_file = out_dir / name
    if not args.skip_doctor:
        state.doctor = run_doctor(out_dir, dry_run=state.dry_run)
    budget = args.budget - (time.monotonic() - started)
    _say(f"writing {out_file} after every task; budget {budget:.0f} s; tasks: " + ", ".join(t.key for t in tasks))
    execute(tasks, state, out_file, budget_s=budget, log_file=out_dir / "tasks.log", environment=environment)
    print("\n" + markdown(state), flush=True)
    pending = [t["key"] for t in state.tasks if t["status"] in ("pending", "cut")]
    if pending:
        _say(f"pending: {', '.join(pending)}; next call: scripts/gpu_run.sh --resume <this file>")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
