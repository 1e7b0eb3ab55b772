"""Which engine backends exist and which one a build uses: the one table of backend names (CLI, nodes and
manifests read it) and `auto`'s rule. It imports the backends; they import only the interface in
`interface.py`, so the two never import each other."""

from __future__ import annotations

import importlib.util
from typing import Callable

import torch

from .aoti import AOTIBackend
from .interface import Backend, BackendUnavailable
from .tensorrt_backend import TensorRTBackend

# Backend name -> its class. `tensorrt` is imported by the TensorRT backend only when it builds or loads.
BACKENDS: dict[str, Callable[[], Backend]] = {"tensorrt": TensorRTBackend, "aoti": AOTIBackend}
BACKEND_NAMES = tuple(BACKENDS)
AUTO_BACKEND = "auto"  # what the Build Engine node offers first: TensorRT where it can build, else AOTInductor
BACKEND_CHOICES = (AUTO_BACKEND, *BACKEND_NAMES)  # what the CLI's --backend and the Build Engine node offer
ONNX_EXPORT_PACKAGES = ("onnx", "onnxscript")  # the TensorRT backend builds from an ONNX export; both optional


def missing_onnx_export() -> list[str]:
    """The packages of ONNX_EXPORT_PACKAGES that are not installed."""
    return [name for name in ONNX_EXPORT_PACKAGES if importlib.util.find_spec(name) is None]


def resolve_backend(name: str, device: torch.device) -> tuple[str, str]:
    """(backend to build with, why) for a backend name or `auto`. Auto takes TensorRT when it can build on
    `device` (CUDA, TensorRT importable, ONNX export packages present), else AOTInductor, which needs only
    PyTorch; the reason says which check failed, so the caller can tell the user."""
    if name != AUTO_BACKEND:
        return name, "asked for"
    missing = missing_onnx_export()
    if missing:
        return "aoti", f"TensorRT builds need {' and '.join(missing)} for the ONNX export"
    try:
        get_backend("tensorrt").check_available(torch.device(device))
    except BackendUnavailable as e:
        return "aoti", str(e)
    return "tensorrt", "TensorRT can build here"


def get_backend(name: str) -> Backend:
    """A fresh backend object by name; ValueError naming the backends for any other name."""
    if name not in BACKENDS:
        raise ValueError(f"unknown engine backend {name!r}; use {' or '.join(BACKEND_NAMES)}")
    return BACKENDS[name]()
