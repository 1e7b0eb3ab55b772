"""A normal (non-editable) install works: the sdist and the wheel are built from the checkout, the wheel
is installed into a fresh virtual environment, and the installed package imports, runs its command
line and decodes — the path a `pip install .` user takes, which the editable install used by the rest
of the suite never exercises (a sub-package once went missing from the wheel unnoticed).

The fresh environment has no site-packages of its own beyond the wheel; this interpreter's
site-packages directory is added as a plain path entry (so torch and numpy are importable without a
download) — a plain entry does not run that directory's .pth files, so the editable finder that maps
`turbovae` to the checkout stays inactive and cannot hide a module missing from the wheel.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest
import torch

import turbovae

ROOT = Path(turbovae.__file__).resolve().parent
STUBS = Path(__file__).parent / "comfy_stubs"
NOT_SHIPPED = ("tests", "scripts", "build", "dist")

pytestmark = pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                                reason="needs the git checkout (the file list comes from git)")


def _run(cmd: list[str], cwd: Path, env: dict | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _source_packages() -> set[str]:
    """Every package of the checkout, as it must appear in the wheel (found from the files, not the
    build configuration under test)."""
    out = {"turbovae"}
    for init in ROOT.rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts and rel.parts[0] not in NOT_SHIPPED and not rel.parts[0].startswith("."):
            out.add(".".join(("turbovae", *rel.parts)))
    return out


def _build(tmp: Path) -> tuple[Path, Path]:
    """sdist from a copy of the checkout's files, then the wheel from the unpacked sdist (as `python -m
    build` does), so a file missing from the sdist breaks the wheel too."""
    files = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], ROOT).split("\0")
    src = tmp / "src"
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    dist = tmp / "dist"
    backend = "import sys; from setuptools import build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"
    sdist = dist / _run([sys.executable, "-c", backend, "build_sdist", str(dist)], src).strip().splitlines()[-1]
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp / "unpacked", filter="data")
    (unpacked,) = (tmp / "unpacked").iterdir()
    wheel = dist / _run([sys.executable, "-c", backend, "build_wheel", str(dist)], unpacked).strip().splitlines()[-1]
    return sdist, wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("install")
    sdist, wheel = _build(tmp)
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp).strip())
    (purelib / "host_site_packages.pth").write_text(sysconfig.get_path("purelib") + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
          str(wheel)], tmp)
    return {"sdist": sdist, "wheel": wheel, "python": python, "env": env_dir, "cwd": tmp}


def test_wheel_holds_every_package_and_the_workflows(installed):
    with zipfile.ZipFile(installed["wheel"]) as whl:
        names = whl.namelist()
        metadata = next(whl.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    packages = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert packages == _source_packages()
    workflows = sorted(p.name for p in (ROOT / "workflows").glob("*.json"))
    assert workflows and sorted(n.split("/")[-1] for n in names if n.startswith("turbovae/workflows/")) == workflows
    assert not [n for n in names if n.startswith("turbovae/tests/")]
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert any(r.startswith("safetensors") for r in requires) and any(r.startswith("numpy") for r in requires)
    assert not any(r.split(";")[0].strip().startswith("torch") for r in requires), "torch is never a dependency"


def test_sdist_holds_the_tests_and_the_workflows(installed):
    with tarfile.open(installed["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"setup.py", "pyproject.toml", "README.md", "workflows/engine_build.json", "tests/conftest.py"} <= names


@pytest.mark.slow
def test_installed_package_imports_runs_and_decodes(installed, tmp_path):
    python, cwd = str(installed["python"]), installed["cwd"]
    where = _run([python, "-c", "import turbovae, turbovae.vae.parallel, turbovae.trt, turbovae.bench; "
                  "print(turbovae.__file__)"], cwd).strip()
    assert Path(where).is_relative_to(installed["env"]), f"imported {where}, not the installed wheel"
    stubs_env = {"PYTHONPATH": str(STUBS), "PATH": "/usr/bin:/bin"}
    nodes = _run([python, "-c", "import turbovae.nodes as n; print(len(n.all_nodes()))"], cwd, env=stubs_env)
    assert int(nodes) >= 8
    assert "build-engines" in _run([python, "-m", "turbovae", "--help"], cwd)
    assert "bench" in _run([str(installed["env"] / "bin" / "turbovae"), "--help"], cwd)

    # the same thread count as this process: the CPU's contiguous fp32 conv kernels split their sums by thread
    decode = ("import sys, torch; from turbovae import TurboVAE; from turbovae.vae.wan import TINY_WAN21, WanVAE;"
              f"torch.set_num_threads({torch.get_num_threads()}); torch.manual_seed(0); vae = TurboVAE(WanVAE(TINY_WAN21).eval());"
              "z = torch.randn(1, TINY_WAN21.z_dim, 2, 4, 4, generator=torch.Generator().manual_seed(1));"
              "torch.save(vae.decode(z), sys.argv[1])")
    out = tmp_path / "decoded.pt"
    _run([python, "-c", decode, str(out)], cwd)
    installed_result = torch.load(out, weights_only=True)

    from turbovae.vae.wan import TINY_WAN21, WanVAE
    torch.manual_seed(0)
    vae = turbovae.TurboVAE(WanVAE(TINY_WAN21).eval())
    expected = vae.decode(torch.randn(1, TINY_WAN21.z_dim, 2, 4, 4, generator=torch.Generator().manual_seed(1)))
    assert installed_result.shape == expected.shape == (1, 3, 5, 32, 32)
    assert torch.equal(installed_result, expected)
