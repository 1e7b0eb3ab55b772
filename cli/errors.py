"""A mistake the user can fix gives one or two lines naming the fix and exit code 2, never a traceback: which
errors count as such, and how their message reads on a terminal."""

from __future__ import annotations


class UsageError(Exception):
    """A mistake in the command line the user can fix; the message says how."""


# Optional packages and how to install them, for a missing-import message that names the fix.
OPTIONAL_PACKAGES = {
    "diffusers": 'pip install -e ".[bench]"',
    "matplotlib": 'pip install -e ".[bench]"',
    "onnx": 'pip install -e ".[onnx]"',
    "onnxscript": 'pip install -e ".[onnx]"',
    "onnxruntime": 'pip install -e ".[onnx]"',
    "tensorrt": "pip install tensorrt (NVIDIA's wheels), or use --backend aoti",
}


def check_device(device: str) -> None:
    """Fail early, in one line, for a device this machine does not have: `resolve_device`'s rule, with the fix
    spelled as a command-line option, and only the CPU or CUDA (what the commands run on)."""
    from ..vae.loader import DeviceUnavailable, resolve_device

    try:
        dev = resolve_device(device)
    except DeviceUnavailable as e:
        raise UsageError(f"--device {device}: {e} (on the command line: --device cpu)") from None
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {device}: not supported here; use cpu or cuda")


def user_error_types() -> tuple[type, ...]:
    """Errors that mean the input or the installation needs fixing (not a bug): one message, exit code 2."""
    import torch

    from ..trt.interface import EngineError  # an unusable backend (TensorRT missing, wrong GPU): the user's to fix
    from ..vae.checkpoint import CheckpointError

    return (UsageError, CheckpointError, ValueError, OSError, ImportError, torch.OutOfMemoryError, EngineError)


def describe_user_error(error: BaseException) -> str:
    """One or two lines: what went wrong and the fix, without terminal colour codes."""
    if isinstance(error, ModuleNotFoundError) and error.name:
        root = error.name.split(".")[0]
        fix = OPTIONAL_PACKAGES.get(root, f"pip install {root}")
        return f"the optional package '{root}' is not installed; install it with: {fix}"
    from ..vae.checkpoint import ANSI_ESCAPE

    text = ANSI_ESCAPE.sub("", str(error)).strip() or type(error).__name__
    if isinstance(error, OSError) and error.filename and str(error.filename) not in text:
        text += f": {error.filename}"
    return text
