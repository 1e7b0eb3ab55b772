"""The Triton kernels compile for an H100 (sm_90) to PTX and cubin, without a GPU.

The interpreter tests check the numerics but not that the kernels pass Triton's real compiler
(type inference, layouts, reductions, ptxas). This compiles every kernel ahead of time for the
target, in a subprocess because this test session may have imported Triton in interpreter mode.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

# Not imported here: tests/test_kernels_norms.py must be the first to import Triton (in interpreter mode).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from turbovae.vae.accel.kernels import triton_norms as K

def build(fn, dt, consts):
    ptr = {"n_ptr": "*fp32", "mean_ptr": "*fp32", "m2_ptr": "*fp32"}
    fl = {"eps": "fp32", "scale": "fp32"}
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name in ptr:
            sig[name] = ptr[name]
        elif name.endswith("_ptr"):
            sig[name] = "*" + dt
        elif name in fl:
            sig[name] = fl[name]
        elif name.startswith("s_"):
            sig[name] = "i64"
        else:
            sig[name] = "i32"
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    assert k.asm.get("cubin"), fn
    print(fn.__name__, dt, "ok")

for dt, on in (("bf16", True), ("fp32", False)):
    build(K._gn_partial_stats_kernel, dt, dict(HAS_RES=on, NUM_CHUNKS=64, BLOCK_C=16, BLOCK_P=256))
    build(K._gn_apply_kernel, dt, dict(HAS_RES=on, STORE_SUM=on, HAS_W=on, HAS_B=on, SILU=on, NUM_CHUNKS=64,
                                       BLOCK_C=16, BLOCK_P=256))
    build(K._rms_norm_kernel, dt, dict(HAS_RES=on, STORE_SUM=on, HAS_B=on, SILU=on, BLOCK_C=512, BLOCK_P=16))
"""


def test_kernels_compile_for_sm90_without_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # the current default, stated to silence its warning
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count(" ok") == 6
