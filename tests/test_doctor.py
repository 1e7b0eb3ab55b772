"""`python -m turbovae doctor --json` on CPU, read field by field (the fields docs/gpu.md documents)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from turbovae import cli
from turbovae.vae import doctor
from turbovae.vae.accel import self_checks

ARCHITECTURES = ("seedvr2", "qwen_image", "wan2.2")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("doctor") / "doctor.json"
    assert cli.main(["doctor", "--json", "--out", str(out), "--bench-seconds", "120"]) == 0
    return json.loads(out.read_text())


def test_versions_and_devices(report):
    assert report["schema"] == doctor.SCHEMA
    v = report["versions"]
    assert v["torch"] == torch.__version__ and v["python"].count(".") == 2 and v["turbovae"]
    for name in ("cuda", "cudnn", "driver", "triton", "tensorrt", "onnx", "onnxruntime", "diffusers", "comfyui"):
        assert name in v and (v[name] is None or isinstance(v[name], str))
    assert v["onnx"] is not None and v["comfyui"] is None  # the test extra has onnx; ComfyUI is not importable
    cpu = report["devices"][0]
    assert cpu["name"] == "cpu" and 0 < cpu["free_mb"] <= cpu["total_mb"] and cpu["threads"] >= 1
    assert 0 < cpu["pass_budget_mb"] <= cpu["free_mb"]
    assert report["default_device"] == "cpu" and report["dtype"] == "float32"
    assert report["self_check_enabled"] is True and report["seconds"] > 0


def test_every_fast_path_is_listed_with_its_check(report):
    rows = {r["path"]: r for r in report["fast_paths"]}
    assert list(rows) == list(self_checks.PATHS)
    for name, r in rows.items():
        assert set(r) == {"path", "what", "available", "why", "self_check", "detail", "fallback", "enabled"}
        assert r["self_check"] in ("passed", "failed", "skipped", "not run") and r["enabled"] is True
        assert r["fallback"] == self_checks.PATHS[name].fallback
    for gpu_only in ("triton_norms", "conv3d_route", "channels_last", "cuda_graphs"):
        assert rows[gpu_only]["available"] is False and "GPU-only" in rows[gpu_only]["why"]
    assert report["fast_paths_off"] == []


def test_conv3d_route_is_reported_per_half_dtype(report):
    assert [(r["dtype"], r["route"]) for r in report["conv3d_route"]] == [("bfloat16", "native"), ("float16", "native")]
    assert all("not affected" in r["reason"] for r in report["conv3d_route"])


def test_micro_bench_runs_each_architecture_both_ways_within_fp32_tolerance(report):
    rows = {(b["architecture"], b["direction"]): b for b in report["bench"]}
    assert set(rows) == {(a, d) for a in ARCHITECTURES for d in ("decode", "encode")}
    for b in rows.values():
        assert b["status"] == "ok" and b["config"] == "tiny" and b["dtype"] == "float32", b
        assert b["ms"] > 0 and b["runs"] >= 1 and b["image_px"] == doctor.TINY_IMAGE_PX
        assert b["max_abs_err_vs_fp32"] <= 1e-4  # default paths vs the plain path, both fp32: exact levers
        assert b["psnr_db_vs_fp32"] is None or b["psnr_db_vs_fp32"] > 80


def test_text_report_and_refusal_to_replace_a_file(report, tmp_path, capsys):
    text = doctor.format_text(report)
    assert text.startswith("TurboVAE doctor") and "conv3d route: bfloat16 native" in text
    assert all(p in text for p in self_checks.PATHS) and "qwen_image decode tiny 64²" in text
    existing = tmp_path / "doctor.json"
    existing.write_text("{}")
    assert cli.main(["doctor", "--no-bench", "--out", str(existing)]) == 2
    assert "exists" in capsys.readouterr().err and existing.read_text() == "{}"


def test_self_check_results_and_failures_are_reported(monkeypatch, caplog):
    """With the GPU paths applying to the CPU: channels-last passes its check, a CUDA graph capture fails on
    the CPU (no CUDA streams) and is reported as failed and switched off; compile's probe is replaced by a
    cheap eager one (inductor on CPU takes minutes)."""
    monkeypatch.setattr(doctor, "_run_compile", lambda device, dtype: None)
    with self_checks.gpu_paths_on_cpu(), caplog.at_level(logging.WARNING, logger="turbovae"):
        rows = {r["path"]: r for r in doctor.fast_path_report(torch.device("cpu"), torch.float32)}
    assert rows["channels_last"]["self_check"] == "passed" and "error" in rows["channels_last"]["detail"]
    assert rows["cuda_graphs"]["self_check"] == "failed" and rows["cuda_graphs"]["enabled"] is False
    assert "capture failed" in rows["cuda_graphs"]["detail"]
    assert rows["conv3d_route"]["self_check"] == "not run"  # native on CPU: nothing to check
    assert rows["compile"]["self_check"] == "not run"
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_self_check_env_zero_is_reported(monkeypatch):
    monkeypatch.setenv(self_checks.ENV_SELF_CHECK, "0")
    monkeypatch.setattr(doctor, "_run_compile", lambda device, dtype: None)
    monkeypatch.setattr(doctor, "_run_cuda_graphs", lambda device, dtype: None)
    with self_checks.gpu_paths_on_cpu():
        rows = {r["path"]: r for r in doctor.fast_path_report(torch.device("cpu"), torch.float32)}
    assert rows["channels_last"]["self_check"] == "skipped"
    assert rows["channels_last"]["detail"] == "TURBOVAE_SELF_CHECK=0" and rows["channels_last"]["enabled"]
