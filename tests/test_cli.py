"""The command line: a user's mistake gives one or two lines naming the fix and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from turbovae import cli
from turbovae.vae.checkpoint import CheckpointError, read_state_dict
from turbovae.vae.wan import TINY_WAN21, WanVAE


def _run(argv, capsys):
    code = cli.main(argv)
    err = capsys.readouterr().err
    return code, err


def _one_message(err: str) -> None:
    assert "Traceback" not in err
    assert 1 <= len(err.strip().splitlines()) <= 3, err


def test_missing_checkpoint_is_one_line_exit_2(tmp_path, capsys):
    code, err = _run(["build-engines", "--vae", str(tmp_path / "nope.safetensors"), "--out", str(tmp_path / "o"),
                      "--static", "64x64", "--backend", "aoti", "--device", "cpu"], capsys)
    assert code == 2 and "nope.safetensors" in err and "not found" in err
    _one_message(err)


def test_default_backend_is_auto_and_says_what_it_chose(tmp_path, capsys):
    """No --backend: TensorRT cannot build on a CPU, so auto picks AOTInductor and prints why (here the
    checkpoint is then missing: one line, exit 2, before any build)."""
    code = cli.main(["build-engines", "--vae", str(tmp_path / "nope.safetensors"), "--out", str(tmp_path / "o"),
                     "--static", "64x64", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 2 and "nope.safetensors" in err
    assert out.startswith("backend: aoti (") and len(out.strip().splitlines()) == 1, out


def test_cuda_on_a_cpu_machine_names_the_fix(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, err = _run(["bench", "--device", "cuda", "--quick"], capsys)
    assert code == 2 and "--device cpu" in err
    _one_message(err)
    code, err = _run(["bench", "--device", "tpu7"], capsys)
    assert code == 2 and "cpu or cuda" in err


def test_bad_numbers_and_sections_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--repeat", "0"])
    assert e.value.code == 2 and "must be 1 or more" in capsys.readouterr().err
    code, err = _run(["bench", "--sections", "seedvr2,nonsense"], capsys)
    assert code == 2 and "nonsense" in err
    code, err = _run(["bench", "--quick", "--device", "cpu", "--cases", "nothing-like-this"], capsys)
    assert code == 2 and "Qwen-Image image decode 64²" in err  # names the cases there are
    code, err = _run(["bench", "--qwen-checkpoint", "/nonexistent/q.safetensors"], capsys)
    assert code == 2 and "/nonexistent/q.safetensors" in err


def test_wrong_checkpoint_and_verbose_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    save_file({"x": torch.zeros(2)}, str(bad))
    argv = ["build-engines", "--vae", str(bad), "--out", str(tmp_path / "o"), "--static", "64x64", "--backend", "aoti",
            "--device", "cpu"]
    code, err = _run(argv, capsys)
    assert code == 2 and "bad.safetensors" in err
    _one_message(err)
    with pytest.raises(CheckpointError):
        cli.main(argv + ["--verbose"])


def test_missing_optional_package_names_the_extra():
    err = ModuleNotFoundError("No module named 'onnxscript'", name="onnxscript")
    assert 'pip install -e ".[onnx]"' in cli.describe_user_error(err)
    assert "\x1b" not in cli.describe_user_error(ValueError("\x1b[1mbold\x1b[0m text"))


def test_a_bug_still_shows_its_traceback(monkeypatch):
    def broken(_args):
        raise KeyError("internal")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["bench"].set_defaults(func=broken)
    with pytest.raises(KeyError):
        cli.main(["bench"])


def test_help_states_every_default():
    parser = cli.build_parser()
    sub = parser._subparsers._group_actions[0].choices
    for name, command in sub.items():
        chosen = {a for g in command._mutually_exclusive_groups if g.required for a in g._group_actions}
        for action in command._actions:
            if isinstance(action, argparse._HelpAction) or action.dest == "verbose" or action.required \
                    or (action in chosen and action.default is None):
                continue
            if isinstance(action, argparse._StoreTrueAction):
                continue  # a switch is off unless given
            assert "default" in (action.help or ""), f"{name} {action.option_strings}: help does not state the default"


def test_help_runs_as_a_program():
    out = subprocess.run([sys.executable, "-m", "turbovae", "build-engines", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "(default: auto)" in out and "(default: fp16)" in out


@pytest.mark.parametrize("cut", [0, 10, 0.5])
def test_truncated_files_are_checkpoint_errors(tmp_path, cut):
    sd = {k: v.contiguous() for k, v in WanVAE(TINY_WAN21).state_dict().items()}  # channels-last weights: pack to save
    for name, save in (("w.safetensors", lambda p: save_file(sd, str(p))),
                       ("w.pt", lambda p: torch.save(sd, p)),
                       ("legacy.pt", lambda p: torch.save(sd, p, _use_new_zipfile_serialization=False))):
        full = tmp_path / name
        save(full)
        data = full.read_bytes()
        short = tmp_path / f"short-{name}"
        short.write_bytes(data[:int(len(data) * cut) if isinstance(cut, float) else cut])
        with pytest.raises(CheckpointError, match="truncated"):
            read_state_dict(short)


def test_pickled_objects_are_refused_in_one_clean_sentence(tmp_path):
    path = tmp_path / "model.ckpt"
    torch.save({"state_dict": {"a": torch.zeros(1)}, "args": argparse.Namespace(lr=1)}, path)
    with pytest.raises(CheckpointError) as e:
        read_state_dict(path)
    text = str(e.value)
    assert "\x1b" not in text and "\n" not in text and "argparse.Namespace" in text


def test_engine_fallback_warning_is_printed_once(tmp_path):
    """It was printed twice on a console: once as a log record, once as a Python warning."""
    code = ("import logging; from turbovae.trt.engine_vae import EngineVAE; from turbovae.vae.wan import TINY_WAN21, "
            "WanVAE\nlogging.basicConfig()\nv = EngineVAE(WanVAE(TINY_WAN21), None)\n"
            "for _ in range(3): v._warn('decoder', 'engine unusable: fell back to PyTorch')")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert err.count("fell back to PyTorch") == 1, err


# -- the layout of the command line (issue 42: a thin CLI) ----------------------------------------------------
CLI_DIR = Path(cli.__file__).resolve().parent
MAX_FUNCTION_LINES = 60


def test_one_cli_package_and_no_function_over_60_lines():
    """The command line is one package, one module per command; each function stays short enough to read whole
    (the old `build_parser` held every command's options in one 93-line function)."""
    root = CLI_DIR.parent
    assert not [p for p in ("cli.py", "cli_parallel.py", "doctor.py", "trt/cli.py") if (root / p).exists()]
    files = sorted(CLI_DIR.glob("*.py"))
    assert {p.stem for p in files} >= {"__init__", "bench", "plan", "doctor", "build", "parallel", "errors"}
    long = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_every_command_is_one_module_of_the_cli_package():
    parser = cli.build_parser()
    sub = parser._subparsers._group_actions[0].choices
    assert list(sub) == ["bench", "decode", "encode", "doctor", "plan", "build-engines"]
    modules = {name: sys.modules[command.get_default("func").__module__].__name__ for name, command in sub.items()}
    assert modules == {"bench": "turbovae.cli.bench", "decode": "turbovae.cli.parallel",
                       "encode": "turbovae.cli.parallel", "doctor": "turbovae.cli.doctor",
                       "plan": "turbovae.cli.plan", "build-engines": "turbovae.cli.build"}
