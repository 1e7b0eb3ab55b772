"""Docs that cannot drift: every code block in README.md and docs/*.md is run or checked, and every results
table in them (between results-table markers) is the renderer's output for the committed results JSON.

- ```python blocks run in a fresh folder, with the model files they name replaced by tiny seeded ones
  (`SUBSTITUTIONS`); blocks that need something a CPU test cannot have are listed in `NOT_RUN` with the reason
  (the test fails when an entry no longer matches a block, so the list cannot go stale).
- `python -m turbovae …` lines in shell blocks are parsed by the real command line parser, so a documented
  flag that does not exist fails here; `…` stands for a value.
"""

from __future__ import annotations

import json
import re
import runpy
import shlex
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from turbovae import cli
from turbovae.bench import report

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)

# (file, first line of the block) -> why it is not run here
NOT_RUN = {
    ("docs/engines.md", 'vae = turbovae.load_vae("models/tensorrt/qwen")                 # PyTorch = checkpoint it was '
                        'built from'): "needs an engine folder (an AOTInductor compile takes minutes on 2 cores; "
                                       "tests/test_engines_aoti.py runs the same calls)",
    ("docs/multi_gpu.md", 'out = turbovae.decode_parallel(vae, latents, devices=["cuda:0", "cuda:1"])    # one process, '
                          'two GPUs'): "a fragment after the README's example (vae, latents, pixels), and its last call "
                                       "needs a torchrun process group; tests/test_parallel.py runs both entry points",
}


def _blocks(lang: str):
    for path in DOCS:
        for match in FENCE.finditer(path.read_text()):
            if match.group(1) == lang:
                yield path.relative_to(ROOT).as_posix(), match.group(2)


def _tiny_qwen_folder(folder: Path) -> Path:
    """A diffusers-layout Qwen-Image VAE folder with the tiny config and seeded weights."""
    from turbovae.vae.wan import TINY_WAN21, WanVAE
    from turbovae.vae.wan.config import diffusers_kwargs

    torch.manual_seed(0)
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in WanVAE(TINY_WAN21).state_dict().items()},
              str(folder / "diffusion_pytorch_model.safetensors"))
    (folder / "config.json").write_text(json.dumps(dict(diffusers_kwargs(TINY_WAN21),
                                                        _class_name="AutoencoderKLQwenImage")))
    return folder


# A model file a block names -> how to make a tiny stand-in for it
SUBSTITUTIONS = {
    "models/vae/qwen_image_vae.safetensors": _tiny_qwen_folder,
}

# Smaller inputs, and CPU devices, for the CPU test (the code path is the same; the tiny model keeps it exact)
SMALLER = {"torch.rand(1, 3, 1, 512, 512)": "torch.rand(1, 3, 1, 128, 128)",
           'devices=["cuda:0", "cuda:1"]': 'devices=["cpu", "cpu"]'}

PYTHON_BLOCKS = list(_blocks("python"))


@pytest.mark.parametrize("where,code", PYTHON_BLOCKS, ids=[f"{w}:{i}" for i, (w, _) in enumerate(PYTHON_BLOCKS)])
def test_python_blocks_run(where, code, tmp_path, monkeypatch, capsys):
    first = code.splitlines()[0]
    if (where, first) in NOT_RUN:
        pytest.skip(NOT_RUN[(where, first)])
    for name, make in SUBSTITUTIONS.items():
        if name in code:
            code = code.replace(name, str(make(tmp_path / "models" / Path(name).stem)))
    for text, smaller in SMALLER.items():
        code = code.replace(text, smaller)
    monkeypatch.chdir(tmp_path)
    # run as a file, not through exec(): the Comfy Registry's validation (comfy-cli's ruff S102 check) flags exec
    block = tmp_path / f"{Path(where).stem}_block.py"
    block.write_text(code)
    runpy.run_path(str(block), run_name="__docs__")


def test_not_run_entries_match_blocks():
    firsts = {(w, c.splitlines()[0]) for w, c in PYTHON_BLOCKS}
    assert set(NOT_RUN) <= firsts


def _turbovae_commands():
    for lang in ("bash", ""):
        for where, code in _blocks(lang):
            text = code.replace("\\\n", " ")
            for line in text.splitlines():
                line = line.split(" #")[0].strip()
                if line.startswith("python -m turbovae ") or " python -m turbovae " in line:
                    yield where, line[line.index("python -m turbovae"):].split("&&")[0].strip()


COMMANDS = list(_turbovae_commands())


def test_docs_have_cli_examples():
    assert any("bench" in c for _, c in COMMANDS) and any("build-engines" in c for _, c in COMMANDS)


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{w}:{i}" for i, (w, _) in enumerate(COMMANDS)])
def test_documented_commands_parse(where, command):
    argv = [a if a != "…" else "x" for a in shlex.split(command)][3:]
    if argv and "." in argv[0]:  # `python -m turbovae.bench.report …` and friends have their own parsers
        return
    cli.build_parser().parse_args(argv)


# ------------------------------------------------------------------------------------------------
# The README's results table
# ------------------------------------------------------------------------------------------------
TABLE = re.compile(r"<!-- results-table: (?P<files>[^>]+?) -->\n(?P<table>.*?)\n<!-- /results-table -->", re.S)


def test_readme_has_a_results_table():
    assert TABLE.search((ROOT / "README.md").read_text()), "README.md has no table between results-table markers"


TABLES = [(path.relative_to(ROOT).as_posix(), m.group("files").split(), m.group("table").strip())
          for path in DOCS for m in TABLE.finditer(path.read_text())]


@pytest.mark.parametrize("where,files,table", TABLES, ids=[f"{w}:{' '.join(f)}" for w, f, _ in TABLES])
def test_results_tables_are_rendered_from_the_committed_json(where, files, table):
    paths = [f if "=" in f else str(ROOT / f) for f in files]  # FILE.json[#TABLE] or an option (dtype=bf16)
    assert [r for f in paths if "=" not in f for r in report.load_rows(Path(f))]
    options = [f"--{f.replace('=', ' ', 1)}" for f in files if "=" in f]
    assert table == report.render(paths), (
        f"{where}: table differs from its JSON; regenerate with: python -m turbovae.bench.report --markdown "
        + " ".join([f for f in files if "=" not in f] + options))


def test_multi_gpu_cost_table_is_the_cost_models_output():
    """docs/multi_gpu.md's predicted-scaling table is what `python -m turbovae.bench.parallel_cost` prints
    (rendered from vae/parallel/cost.py), so a change to the cost model shows up as a stale doc here."""
    from turbovae.bench.parallel_cost import markdown

    table = markdown()
    assert table.count("\n") > 50  # every architecture, direction, size and rank count
    assert table in (ROOT / "docs" / "multi_gpu.md").read_text()


def test_gpu_tables_name_their_machine(tmp_path):
    """A table of GPU rows starts with the machine (GPU, driver, CUDA, cuDNN, torch, dtype, date) read from its
    files, and times in ms; a GPU file that records no dtype needs `dtype=` named, and CPU tables are unchanged."""
    row = {"section": "gpu", "case": "c", "variant": "v", "ms": 14.18, "speedup": 1.0, "max_abs_err": 0.03,
           "psnr_db": 50.0, "peak_mb": 800.0}
    gpu_env = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "cuda": "13.0", "cudnn": 91900,
               "torch": "2.11.0+cu130", "date": "2026-11-26 16:36 UTC"}
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"environment": gpu_env, "rows": [row, dict(row, ms=float("nan"))]}))
    with pytest.raises(ValueError, match="dtype=bf16"):
        report.render([str(gpu)])
    text = report.render([str(gpu), "dtype=bf16"])
    caption, table = text.split("\n\n", 1)
    assert caption == ("Measured on **NVIDIA H100 80GB HBM3**, driver 580.159.04, CUDA 13.0, cuDNN 9.19.0, "
                       "torch 2.11.0+cu130, bf16, 2026-11-26.")
    assert "| c | v | 14.2 ms |" in table and "| c | v | not run |" in table
    recorded = tmp_path / "gpu-dtype.json"
    recorded.write_text(json.dumps({"environment": dict(gpu_env, dtype="fp16"), "rows": [row]}))
    assert ", fp16, " in report.render([str(recorded)])
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({"environment": {"torch": "2.13.0"}, "rows": [dict(row, ms=660.0)]}))
    assert report.render([str(cpu)]) == report.format_markdown(report.load_rows(cpu))
    assert "| c | v | 0.66 s |" in report.render([str(cpu)])
    with pytest.raises(ValueError, match="only option is dtype"):
        report.render([str(cpu), "device=cuda"])
