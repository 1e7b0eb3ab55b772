"""The pack is ready for the Comfy Registry.

1. comfy-cli's own validation (`comfy node validate`: it parses pyproject.toml with the registry's parser and runs its
   ruff security checks, both offline), when comfy-cli is installed (the `test` extra lists it).
2. Without it, and always, the fields the registry documents (docs.comfy.org/registry/specifications, mirrored in
   comfy-cli's `registry/config_parser.py`): project name / version / description / license / Repository URL,
   `[tool.comfy]` PublisherId / DisplayName / Icon / requires-comfyui, and no torch pins. Plus what we promise beside
   them: the LICENSE file is the MIT text pyproject names, and CHANGELOG.md says what this version changed.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT, COMFY = PYPROJECT["project"], PYPROJECT["tool"]["comfy"]
# registry id: letters, digits, '.', '_', '-', not starting with a digit, under 100 characters
NAME_RE = re.compile(r"^[A-Za-z._-][A-Za-z0-9._-]{0,98}$")
SEMVER_RE = re.compile(r"^\d+\.\d+\.\d+$")
# one version constraint: optional operator, then major.minor.patch with an optional -suffix (comma-separated list)
CONSTRAINT_RE = re.compile(r"^(==|>=|<=|!=|~=|>|<|<>|=)?\s*\d+\.\d+\.\d+(-[A-Za-z0-9]+)?$")
RAW_GITHUB = "https://raw.githubusercontent.com/"
HOST_PACKAGES = ("torch", "torchvision", "torchaudio")  # ComfyUI provides them; a pin could replace the user's CUDA build


def _requirement_name(line: str) -> str:
    return re.split(r"[<>=!~;\[ ]", line.strip(), maxsplit=1)[0].lower()


@pytest.mark.skipif(importlib.util.find_spec("comfy_cli") is None,
                    reason="comfy-cli is not installed (pip install comfy-cli, or the test extra)")
def test_comfy_cli_validation_passes(tmp_path, monkeypatch):
    """comfy-cli's `node validate`, run on this checkout; its security findings (exec / eval / `a; b`), which it
    prints as warnings that 'will soon be an error', fail here already."""
    monkeypatch.setenv("HOME", str(tmp_path))  # comfy-cli keeps its config under HOME; keep the user's untouched
    monkeypatch.chdir(ROOT)
    from comfy_cli.command.custom_nodes.command import validate_node_for_publishing

    config = validate_node_for_publishing()
    assert config.project.name == PROJECT["name"] and config.project.version == PROJECT["version"]
    assert config.project.urls.repository == PROJECT["urls"]["Repository"]
    assert config.project.license.file == "LICENSE"
    assert config.tool_comfy.publisher_id == COMFY["PublisherId"] and config.tool_comfy.icon == COMFY["Icon"]
    assert config.project.supported_comfyui_version == COMFY["requires-comfyui"]  # comfy-cli empties an invalid one
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", ".", "-q", "--select", "S102,S307,E702"],
                          cwd=ROOT, capture_output=True, text=True)
    assert ruff.stdout == "", ruff.stdout


def test_project_fields_the_registry_reads():
    assert NAME_RE.match(PROJECT["name"]) and "comfyui" not in PROJECT["name"].lower()
    assert SEMVER_RE.match(PROJECT["version"]), PROJECT["version"]
    assert PROJECT["description"].strip()
    assert PROJECT["urls"]["Repository"].startswith("https://github.com/")
    names = [_requirement_name(d) for d in PROJECT["dependencies"]]
    names += [_requirement_name(line) for line in (ROOT / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.lstrip().startswith("#")]
    assert not set(names) & set(HOST_PACKAGES), names


def test_license_file_is_the_mit_text_pyproject_names():
    assert PROJECT["license"] == {"file": "LICENSE"}
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Permission is hereby granted, free of charge" in text


def test_tool_comfy_fields_the_registry_reads():
    assert re.match(r"^[a-z0-9][a-z0-9-]*$", COMFY["PublisherId"]), COMFY["PublisherId"]
    assert COMFY["DisplayName"].strip()
    constraints = [part.strip() for part in COMFY["requires-comfyui"].split(",")]
    assert all(CONSTRAINT_RE.match(c) for c in constraints), COMFY["requires-comfyui"]
    # the icon is a file of this repository, served raw from the Repository's main branch: square, at most 400 px
    repo_path = PROJECT["urls"]["Repository"].removeprefix("https://github.com/")
    prefix = f"{RAW_GITHUB}{repo_path}/main/"
    assert COMFY["Icon"].startswith(prefix), COMFY["Icon"]
    icon = ROOT / COMFY["Icon"].removeprefix(prefix)
    from PIL import Image

    with Image.open(icon) as image:
        assert image.width == image.height <= 400, image.size


def test_the_package_reports_the_version_pyproject_publishes():
    text = (ROOT / "__init__.py").read_text()
    assert re.search(r'^__version__ = "([^"]+)"$', text, flags=re.MULTILINE).group(1) == PROJECT["version"]


def test_changelog_says_what_this_version_changed():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (\d+\.\d+\.\d+)\s*$", changelog, flags=re.MULTILINE)
    assert versions and versions[0] == PROJECT["version"], versions  # newest first, and it is this version
    sections = re.split(r"^## \d+\.\d+\.\d+\s*$", changelog, flags=re.MULTILINE)[1:]
    assert all(section.strip() for section in sections)
