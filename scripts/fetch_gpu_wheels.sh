#!/usr/bin/env bash
# Run HERE (a machine with network) before a GPU lease: downloads into .whl/ the wheels the GPU machine
# lacks (it has torch, numpy, safetensors, einops, Pillow, huggingface-hub, ... but not diffusers).
# .whl/ is in .gitignore. Carry the folder with the device tool (`carry: [".whl"]`); scripts/gpu_run.sh installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
# diffusers (pure Python) and importlib_metadata, its only requirement missing on that machine.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
    "diffusers==${DIFFUSERS_VERSION:-0.42.1}" "importlib_metadata>=7"
ls -l .whl
