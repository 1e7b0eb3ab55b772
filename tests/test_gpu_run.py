"""The GPU lease run (scripts/gpu_run.sh -> bench/gpu_run.py): the dry run end to end on CPU, and the
budget / resume / cut-off logic with a scripted task runner (no subprocesses)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from turbovae.bench import gpu, gpu_run
from turbovae.bench.common import BenchOptions

REPO = Path(__file__).resolve().parents[1]


def _strict_json(path: Path) -> dict:
    """Valid JSON only: NaN/Infinity (Python's extension) are rejected."""
    def reject(const: str):
        raise ValueError(f"{path.name}: {const} is not JSON")
    return json.loads(path.read_text(), parse_constant=reject)


def _copy_checkout(dest: Path) -> Path:
    """The checkout's files (tracked and untracked-but-not-ignored; no .git, no caches) copied under `dest`:
    what a lent machine receives, in a folder whose name the test chooses."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                                capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.SubprocessError):  # not a git checkout (an unpacked archive): copy the tree
        shutil.copytree(REPO, dest, ignore=shutil.ignore_patterns(".git", "__pycache__", ".whl", "gpu_results"))
        return dest
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.mark.lease_canary
def test_lease_canary_imports_this_checkout_as_turbovae():
    """Selected with the GPU tests by scripts/gpu_run.sh on any device: on CPU every GPU test is skipped before
    its setup, so this is the test whose setup proves the run's pytest reaches assertions. It checks that the
    `turbovae` the tests import is the checkout that holds them, not another copy."""
    import turbovae

    assert Path(turbovae.__file__).resolve().parent == REPO
    assert gpu_run.CHECKOUT == REPO


@pytest.mark.slow
def test_dry_run_end_to_end(tmp_path):
    """The whole script from a copy of the checkout in a folder that is not a valid module name (as on a lent
    machine): its GPU-tests task must set tests up (the canary passes) and every task must finish."""
    checkout = _copy_checkout(tmp_path / "lease-checkout")
    assert not checkout.name.isidentifier()
    results = tmp_path / "out"
    env = dict(os.environ, OUT=str(results))
    env.pop("PYTHONPATH", None)  # only the script's own `turbovae` link may make the package importable
    proc = subprocess.run(["bash", str(checkout / "scripts" / "gpu_run.sh"), "--dry-run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    logged = re.split(r"\n===== ([\w-]+) \(exit [^\n]*=====\n", (results / "tasks.log").read_text())
    tests_log = dict(zip(logged[1::2], logged[2::2]))["gpu-tests"]  # each task's output under its own heading
    assert re.search(r"\b[1-9][0-9]* passed", tests_log) and "error" not in tests_log.lower(), tests_log[-3000:]
    tmp_path = results
    files = sorted(p.name for p in tmp_path.glob("*-cpu-dry-run.json"))
    assert len(files) == 1
    payload = _strict_json(tmp_path / files[0])
    assert payload["run"]["dry_run"] is True and payload["environment"]["torch"]
    assert "triton" in payload["environment"]
    assert [t["key"] for t in payload["tasks"]] == [*gpu_run.CLIP_KEYS, "gpu-tests", "qwen-decode-1024", "core-vae",
                                                   "kernel-profile", "slices"]
    status = {t["key"]: t["status"] for t in payload["tasks"]}
    assert status.pop("core-vae") == "skipped", payload["tasks"]  # it needs a ComfyUI tree and CUDA cases
    assert set(status.values()) == {"done"}, payload["tasks"]
    assert payload["environment"]["dtype"] == "fp32"
    cases = {r["case"] for r in payload["rows"] if r["section"] == "gpu"}
    assert cases == {c.name for c in gpu.cases(False, True)}
    assert {r["section"] for r in payload["rows"]} == {"gpu", "slices", "kernels"}
    clips = {c.name for c in gpu.cases(False, True) if c.shape[2] > 1}
    kernels = [r for r in payload["rows"] if r["section"] == "kernels"]
    assert {r["case"] for r in kernels} == clips  # every clip case profiled: its pass, then its top kernels
    for name in clips:
        top = [r for r in kernels if r["case"] == name and r["share"] is not None]
        assert top and sum(r["share"] for r in top) <= 1 + 1e-9 and all(r["ms"] > 0 and r["calls"] for r in top)
        assert [r["ms"] for r in top] == sorted((r["ms"] for r in top), reverse=True)
    for r in payload["rows"]:
        if r["variant"] != "diffusers AutoencoderKLWan eager" and r.get("max_abs_err") is not None:
            assert r["max_abs_err"] <= 1e-4, r  # fp32 on CPU: every lever is exact
    baseline = [r for r in payload["rows"] if r["variant"].startswith("diffusers")]
    assert len(baseline) == 1 and baseline[0]["ms"] > 0 and baseline[0]["max_abs_err"] <= 1e-4
    table = (tmp_path / files[0]).with_suffix(".md").read_text()
    assert "| wan2.1 9f decode 16² (tiny) vs diffusers | diffusers AutoencoderKLWan eager |" in table
    assert (tmp_path / "run.log").exists() and (tmp_path / "tasks.log").exists()
    doctor = payload["doctor"]  # the first step: its own JSON in $OUT, and a copy in the results file
    assert doctor["status"] == "done" and doctor["report"]["default_device"] == "cpu"
    assert _strict_json(tmp_path / doctor["file"]) == doctor["report"]
    assert {b["status"] for b in doctor["report"]["bench"]} <= {"ok", "skipped: over the time budget"}
    # the call's budget counts from its start: the environment probe and the doctor came out of it
    assert payload["run"]["calls"][0]["budget_s"] < gpu_run.FIRST_CALL_BUDGET_S - doctor["seconds"]
    assert "TurboVAE doctor" in (tmp_path / "run.log").read_text()


def test_case_keys_agree_with_the_bench():
    assert [c.key for c in gpu.cases(True, False)] == list(gpu_run.CASE_KEYS)
    assert [c.key for c in gpu.cases(False, True)] == list(gpu_run.DRY_RUN_KEYS)
    for key in gpu_run.CASE_KEYS:  # each key selects exactly its own case
        assert [c.key for c in gpu.selected_cases(BenchOptions(cases=(key,)), True)] == [key]
    assert sorted(gpu_run.CLIP_KEYS + gpu_run.IMAGE_KEYS + gpu_run.LATER_KEYS) == sorted(gpu_run.CASE_KEYS)
    assert all(c.long for c in gpu.cases(True, False) if c.key in gpu_run.CLIP_KEYS)


def test_plan_puts_the_gaps_first_and_fits_the_lease(tmp_path):
    """The clip cases, then the GPU tests, then the images, then what the next lease must bring back, then the
    rest; the first call's default budget covers the doctor and the essentials inside 8 minutes, and every
    task fits one call (10 minutes)."""
    plan = gpu_run.plan(dry_run=False, comfyui=tmp_path)
    assert [t.key for t in plan] == [*gpu_run.CLIP_KEYS, "gpu-tests", *gpu_run.IMAGE_KEYS, "core-vae",
                                     "kernel-profile", "slices", "engines", *gpu_run.LATER_KEYS, "roofline"]
    assert all(t.expected_s <= t.limit_s <= 540 and not t.skip for t in plan)
    essentials = sum(t.expected_s for t in plan if t.key in gpu_run.CLIP_KEYS + ("gpu-tests",))
    doctor = 45  # the first H100 run's doctor took 43-49 s
    assert essentials + doctor <= gpu_run.FIRST_CALL_BUDGET_S <= 8 * 60 - 10
    engines = next(t for t in plan if t.key == "engines")
    assert ("--device", "cuda", "--dtype", "bf16") == engines.argv[-4:]
    profile = next(t for t in plan if t.key == "kernel-profile")
    assert profile.argv[:2] == ("-m", "turbovae.bench.kernel_profile") and "bf16" in profile.argv
    core = next(t for t in plan if t.key == "core-vae")
    assert core.argv[core.argv.index("--comfyui") + 1] == str(tmp_path) and "--comfyui-stub" in core.argv
    from turbovae.bench import main as job

    cuda_cases = [c.name for c in job.cases(BenchOptions(device="cuda", comfyui=str(tmp_path)))]
    for name in gpu_run.CORE_CASES:  # each selects exactly one case of the job core joins on CUDA
        assert sum(name in c for c in cuda_cases) == 1, name
    assert next(t for t in plan if t.key == "gpu-tests").argv[1:] == gpu_run.pytest_argv()
    # Without a tree the core side is planned as skipped, saying how to carry one.
    no_tree = {t.key: t for t in gpu_run.plan(dry_run=False, comfyui=None)}
    assert ".comfyui" in no_tree["core-vae"].skip and gpu_run.COMFYUI_ENV in no_tree["core-vae"].skip


def test_find_comfyui(tmp_path):
    assert gpu_run.find_comfyui({gpu_run.COMFYUI_ENV: str(tmp_path)}) in (None, gpu_run.CHECKOUT / ".comfyui")
    (tmp_path / "comfy").mkdir()
    assert gpu_run.find_comfyui({gpu_run.COMFYUI_ENV: str(tmp_path)}) == tmp_path


def test_skipped_task_is_recorded_and_decided_again_on_resume(tmp_path):
    clock = Clock()
    tasks = [gpu_run.Task("a", ("x",), expected_s=1, limit_s=2, skip="no tree")]
    runner = ScriptedRunner(clock, {"a": (0, 1, [_row("A", 1.0)])})
    out = tmp_path / "r.json"
    gpu_run.execute(tasks, gpu_run.RunState(), out, budget_s=10, runner=runner, clock=clock)
    assert runner.ran == [] and _strict_json(out)["tasks"] == [
        {"key": "a", "status": "skipped", "seconds": None, "detail": "no tree", "call": 1}]
    resumed = gpu_run.RunState.from_json(_strict_json(out))
    gpu_run.execute([gpu_run.Task("a", ("x",), expected_s=1, limit_s=2)], resumed, out, budget_s=10, runner=runner,
                    clock=clock)
    assert runner.ran == ["a"] and _strict_json(out)["tasks"][0]["status"] == "done"


class ScriptedRunner:
    """Plays each task's outcome: (exit code, output, rows) in order; records what ran."""

    def __init__(self, clock, outcomes: dict):
        self.clock, self.outcomes, self.ran = clock, outcomes, []

    def __call__(self, task, timeout, workdir):
        code, seconds, rows = self.outcomes[task.key]
        self.ran.append(task.key)
        self.clock.now += min(seconds, timeout)
        if isinstance(code, BaseException):
            raise code
        payload = {"environment": {"gpu": "Fake GPU"}, "rows": rows} if task.bench else None
        return (-1 if seconds > timeout else code), f"{task.key} output", payload


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _row(case: str, ms: float) -> dict:
    return {"section": "gpu", "case": case, "variant": "eager baseline", "ms": ms, "speedup": None}


def test_budget_resume_and_failures(tmp_path):
    tasks = [gpu_run.Task("a", ("x",), expected_s=100, limit_s=200),
             gpu_run.Task("b", ("x",), expected_s=100, limit_s=150),
             gpu_run.Task("c", ("x",), expected_s=100, limit_s=200),
             gpu_run.Task("d", ("x",), expected_s=300, limit_s=400)]
    clock = Clock()
    runner = ScriptedRunner(clock, {"a": (0, 90, [_row("A", 1.0)]), "b": (0, 500, []),
                                    "c": (3, 20, [_row("C", float("nan"))]), "d": (0, 250, [_row("D", 2.0)])})
    out = tmp_path / "r.json"
    state = gpu_run.execute(tasks, gpu_run.RunState(), out, budget_s=400, runner=runner, clock=clock)
    # a: done; b: killed at its own 150 s limit; c: failed (exit 3); d: did not fit the 140 s left
    assert runner.ran == ["a", "b", "c"]
    status = {t["key"]: t["status"] for t in _strict_json(out)["tasks"]}
    assert status == {"a": "done", "b": "failed", "c": "failed", "d": "pending"}
    detail = {t["key"]: t["detail"] for t in state.tasks}
    assert detail["b"].startswith("timed out after 150 s") and detail["c"].startswith("exit 3")
    payload = _strict_json(out)
    assert [r["ms"] for r in payload["rows"]] == [1.0, None]  # NaN written as null
    assert payload["environment"] == {"gpu": "Fake GPU"}

    # The next call resumes from the file: only the pending task runs, rows accumulate.
    clock2 = Clock()
    runner2 = ScriptedRunner(clock2, runner.outcomes)
    resumed = gpu_run.RunState.from_json(_strict_json(out))
    gpu_run.execute(tasks, resumed, out, budget_s=540, runner=runner2, clock=clock2)
    assert runner2.ran == ["d"]
    payload = _strict_json(out)
    assert [t["status"] for t in payload["tasks"]] == ["done", "failed", "failed", "done"]
    assert [r["case"] for r in payload["rows"]] == ["A", "C", "D"]
    assert len(payload["run"]["calls"]) == 2 and payload["run"]["calls"][1]["ran"] == ["d"]
    assert "| D | eager baseline | 2.0 |" in out.with_suffix(".md").read_text()


def test_cut_off_mid_run_leaves_valid_results(tmp_path):
    """A call interrupted during its second task keeps the first task's rows in a valid file, the second cut."""
    tasks = [gpu_run.Task("a", ("x",), expected_s=10, limit_s=20), gpu_run.Task("b", ("x",), expected_s=10, limit_s=20)]
    clock = Clock()
    runner = ScriptedRunner(clock, {"a": (0, 5, [_row("A", 1.0)]), "b": (KeyboardInterrupt(), 5, [])})
    out = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt):
        gpu_run.execute(tasks, gpu_run.RunState(), out, budget_s=100, runner=runner, clock=clock)
    payload = _strict_json(out)
    assert [t["status"] for t in payload["tasks"]] == ["done", "cut"]
    assert [r["case"] for r in payload["rows"]] == ["A"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary file left behind"


def test_results_name_and_resume_errors(tmp_path, capsys):
    assert gpu_run.results_name({"date": "2026-11-24 10:00 UTC", "gpu": "NVIDIA H100 80GB HBM3"}, False) == \
        "2026-11-24-nvidia-h100-80gb-hbm3.json"
    assert gpu_run.results_name({"date": "2026-11-24 10:00 UTC"}, True) == "2026-11-24-cpu-dry-run.json"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert gpu_run.main(["--out", str(tmp_path), "--resume", str(bad)]) == 2
    assert "cannot resume" in capsys.readouterr().err
    assert gpu_run.main(["--out", str(tmp_path), "--skip-doctor", "--dry-run"]) == 2
    assert "--skip-doctor is for a resumed call" in capsys.readouterr().err


def test_kernel_profile_summary_merges_ranks_and_shares():
    from turbovae.bench.kernel_profile import KernelTime, top_kernels

    times = [KernelTime("conv", 600.0, 3), KernelTime("norm", 250.0, 10), KernelTime("conv", 100.0, 1),
             KernelTime("copy", 50.0, 7), KernelTime("idle", 0.0, 4)]
    total_ms, top = top_kernels(times, top=2)
    assert total_ms == pytest.approx(1.0)  # 1000 us over every kernel with time, not only the top ones
    assert [(k.name, k.calls) for k in top] == [("conv", 4), ("norm", 10)]
    assert [k.ms for k in top] == pytest.approx([0.7, 0.25]) and [k.share for k in top] == pytest.approx([0.7, 0.25])
    with pytest.raises(ValueError, match="top must be at least 1"):
        top_kernels(times, top=0)


def test_a_task_cut_off_by_the_call_budget_is_rerun_on_resume(tmp_path):
    """A task whose timeout was the call's remaining budget (not its own limit) is recorded as cut, and the next
    call reruns it; its rows from the cut attempt are replaced by the rerun's."""
    tasks = [gpu_run.Task("a", ("x",), expected_s=100, limit_s=300),
             gpu_run.Task("b", ("x",), expected_s=50, limit_s=300)]
    clock = Clock()
    runner = ScriptedRunner(clock, {"a": (0, 90, [_row("A", 1.0)]), "b": (0, 500, [_row("B partial", 9.0)])})
    out = tmp_path / "r.json"
    gpu_run.execute(tasks, gpu_run.RunState(), out, budget_s=200, runner=runner, clock=clock)
    cut = _strict_json(out)["tasks"][1]
    assert runner.ran == ["a", "b"] and cut["status"] == "cut"
    assert "budget" in cut["detail"] and "110 s" in cut["detail"] and "--resume" in cut["detail"]

    clock2 = Clock()
    runner2 = ScriptedRunner(clock2, {"b": (0, 200, [_row("B", 2.0)])})
    gpu_run.execute(tasks, gpu_run.RunState.from_json(_strict_json(out)), out, budget_s=540, runner=runner2,
                    clock=clock2)
    payload = _strict_json(out)
    assert runner2.ran == ["b"] and [t["status"] for t in payload["tasks"]] == ["done", "done"]
    assert [(r["case"], r["call"], r["task"]) for r in payload["rows"]] == [("A", 1, "a"), ("B", 2, "b")]
    assert "| b | done |" in out.with_suffix(".md").read_text()


def test_a_call_killed_while_a_task_ran_leaves_it_cut_and_the_next_call_reruns_it(tmp_path):
    """The lease's own timeout kills the whole call: the task that was running is in the file as running, and a
    resumed call records it as cut by that call and runs it again."""
    tasks = [gpu_run.Task("a", ("x",), expected_s=10, limit_s=20)]
    out = tmp_path / "r.json"
    seen = []

    def killed(task, timeout, workdir):  # what the file holds while the task runs, when the call is killed
        seen.append(_strict_json(out)["tasks"][0])
        raise SystemExit(137)

    with pytest.raises(SystemExit):
        gpu_run.execute(tasks, gpu_run.RunState(), out, budget_s=100, runner=killed, clock=Clock())
    assert seen[0]["status"] == "running" and seen[0]["call"] == 1
    left = _strict_json(out)["tasks"][0]
    assert left["status"] == "cut" and "SystemExit" in left["detail"]

    state = gpu_run.RunState.from_json(_strict_json(out))
    state.tasks[0] = dict(seen[0])  # SIGKILL: nothing ran after the task started
    clock = Clock()
    runner = ScriptedRunner(clock, {"a": (0, 5, [_row("A", 1.0)])})
    gpu_run.execute(tasks, state, out, budget_s=100, runner=runner, clock=clock)
    assert runner.ran == ["a"] and _strict_json(out)["tasks"][0]["status"] == "done"


def test_each_call_records_its_own_environment_and_rows_name_their_call(tmp_path):
    """A resumed call on another GPU records that GPU; rows say which call measured them, and the file's
    environment names only GPUs that measured rows."""
    tasks = [gpu_run.Task("a", ("x",), expected_s=100, limit_s=300),
             gpu_run.Task("b", ("x",), expected_s=100, limit_s=300),
             gpu_run.Task("t", ("x",), expected_s=10, limit_s=300, bench=False)]
    env = {"A": {"gpu": "GPU A", "torch": "2.9", "date": "2026-12-01 10:00 UTC"},
           "B": {"gpu": "GPU B", "torch": "2.9", "date": "2026-12-01 11:00 UTC"}}
    out = tmp_path / "r.json"

    def call(state, gpu, outcomes, budget):
        clock = Clock()
        gpu_run.execute(tasks, state, out, budget_s=budget, runner=ScriptedRunner(clock, outcomes), clock=clock,
                        environment=env[gpu])
        return gpu_run.RunState.from_json(_strict_json(out))

    # Call 1 on GPU A measures nothing (its only task is cut); call 2 on GPU B measures a and b.
    state = call(gpu_run.RunState(), "A", {"a": (0, 500, [])}, budget=150)
    assert _strict_json(out)["environment"] == {}  # no row measured: no GPU claimed
    state = call(state, "B", {"a": (0, 50, [_row("A", 1.0)]), "b": (0, 50, [_row("B", 2.0)]),
                              "t": (0, 5, [])}, budget=540)
    payload = _strict_json(out)
    assert [c["environment"]["gpu"] for c in payload["run"]["calls"]] == ["GPU A", "GPU B"]
    assert [c["call"] for c in payload["run"]["calls"]] == [1, 2]
    assert {r["call"] for r in payload["rows"]} == {2}
    assert payload["environment"] == env["B"]  # not the first call's GPU, which measured nothing

    # Call 3 on GPU A reruns b: the file now names both GPUs, each row its own call.
    state.tasks[1]["status"] = "cut"
    call(state, "A", {"b": (0, 50, [_row("B", 3.0)])}, budget=540)
    payload = _strict_json(out)
    assert [(r["case"], r["call"]) for r in payload["rows"]] == [("A", 2), ("B", 3)]
    assert payload["environment"]["gpu"] == "GPU B + GPU A" and payload["environment"]["torch"] == "2.9"
    assert payload["environment"]["date"] == env["B"]["date"]  # the first measuring call's
    table = out.with_suffix(".md").read_text()
    assert "Call 2: gpu GPU B" in table and "Call 3: gpu GPU A" in table
    assert re.search(r"\| A \| eager baseline \| 1\.0 \|.*\| 2 \|", table)


def test_a_file_from_before_calls_recorded_environments_keeps_its_environment(tmp_path):
    legacy = {"environment": {"gpu": "GPU A"}, "rows": [_row("A", 1.0)], "tasks": [],
              "run": {"calls": [{"started": "x", "budget_s": 400, "ran": ["a"]}], "dry_run": False}}
    state = gpu_run.RunState.from_json(legacy)
    assert state.to_json()["environment"] == {"gpu": "GPU A"}


def test_a_resumed_call_probes_its_own_environment(tmp_path, monkeypatch):
    first = tmp_path / "first.json"
    first.write_text(json.dumps(gpu_run.RunState(calls=[{"call": 1, "environment": {"gpu": "GPU A"}, "ran": []}])
                                .to_json()))
    monkeypatch.setattr(gpu_run, "probe_environment", lambda dry_run: {"gpu": "GPU B"})
    assert gpu_run.main(["--out", str(tmp_path / "out"), "--resume", str(first), "--skip-doctor",
                         "--only", "no-such-task"]) == 0
    calls = _strict_json(tmp_path / "out" / "first.json")["run"]["calls"]
    assert [c["environment"]["gpu"] for c in calls] == ["GPU A", "GPU B"]
