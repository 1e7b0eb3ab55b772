"""Engine logic without building engines: bucket table, geometry, identity, atomic writes, TensorRT
decisions (with a mock `tensorrt`), CLI parsing, and that the pack works without TensorRT."""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from turbovae.trt import trt_logic as L
from turbovae.trt.interface import BackendUnavailable, EngineRunError
from turbovae.trt.buckets import (
    Bucket,
    BucketTable,
    Profile,
    crop_to,
    multi_profile_table,
    multi_ratio_table,
    pad_to,
    static_table,
)
from turbovae.trt.fileio import atomic_file, atomic_write_bytes
from turbovae.trt.identity import EngineIdentity, IdentityError, mismatches, verify_file


# -- bucket table ---------------------------------------------------------------------------------
def test_smallest_containing_bucket_and_tie_break():
    t = multi_ratio_table()
    assert t.choose(512, 512).padded == (512, 512)  # not the 1024² engine (LightX2V tie-break defect)
    assert t.choose(520, 520).padded == (1024, 1024)
    assert t.choose(900, 1600).padded == (928, 1664)
    assert t.choose(1100, 1400).padded == (1104, 1472)
    assert t.choose(3000, 100) is None
    tie = multi_ratio_table([Bucket(64, 128), Bucket(128, 64)])
    assert tie.choose(48, 48).padded == (64, 128)  # equal area and overshoot: smaller H wins, deterministically


def test_table_rejects_bad_sizes_and_duplicates():
    with pytest.raises(ValueError, match="multiples of 16"):
        static_table(Bucket(1140, 1472))
    with pytest.raises(ValueError, match="twice"):
        multi_ratio_table([Bucket(64, 64), Bucket(64, 64)])
    with pytest.raises(ValueError, match="repeats"):
        multi_profile_table([Profile("a", (64, 64), (128, 128), (256, 256)), Profile("b", (64, 64), (64, 64), (256, 256))])
    with pytest.raises(ValueError, match="WIDTHxHEIGHT"):
        Bucket.parse("1024")
    assert Bucket.parse("1664x928") == Bucket(928, 1664)


def test_profiles_chosen_by_containment_each_shape_exactly_one():
    t = multi_profile_table()
    assert t.choose(1024, 1024).label == "profile le1mp"
    assert t.choose(1040, 512).label == "profile le2.8mp"
    assert t.choose(1088, 1920).label == "profile le4mp"
    sel = t.choose(1000, 1000)  # rounded up to the multiple, not exact
    assert sel.padded == (1008, 1008) and not sel.exact
    assert t.choose(4096, 4096) is None


def test_table_json_round_trip():
    for t in (static_table(Bucket(64, 48)), multi_ratio_table(), multi_profile_table()):
        assert BucketTable.from_json(t.to_json()) == t


def test_pad_crop_geometry_restores_request_for_odd_sizes():
    rng = random.Random(0)
    t = multi_ratio_table([Bucket(64, 64), Bucket(48, 96), Bucket(96, 48)])
    for _ in range(40):
        h, w = 8 * rng.randint(1, 12), 8 * rng.randint(1, 6)
        sel = t.choose(h, w)
        assert sel is not None and sel.padded[0] >= h and sel.padded[1] >= w
        x = torch.randn(1, 3, h, w)
        y = pad_to(x, *sel.padded)
        assert y.shape[-2:] == sel.padded
        assert torch.equal(crop_to(y, h, w), x)
        assert torch.equal(y[..., -1, :w], x[..., -1, :])  # replicate, not zeros


# -- files ---------------------------------------------------------------------------------------
def test_atomic_write_refuses_overwrite_and_leaves_no_partial(tmp_path):
    p = tmp_path / "e.engine"
    atomic_write_bytes(p, b"abc")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        atomic_write_bytes(p, b"xyz")
    assert p.read_bytes() == b"abc"
    with pytest.raises(KeyboardInterrupt):
        with atomic_file(tmp_path / "f.engine") as f:
            f.write(b"half")
            assert not any(q.name.endswith(".engine") for q in tmp_path.iterdir() if q.name != "e.engine")
            raise KeyboardInterrupt  # interrupted mid-write
    assert sorted(q.name for q in tmp_path.iterdir()) == ["e.engine"]
    atomic_write_bytes(p, b"xyz", overwrite=True)
    assert p.read_bytes() == b"xyz"


def _ident(**kw) -> EngineIdentity:
    base = dict(model_hash="h", model_kind="toy", component="decoder", dtype="fp32",
                table=static_table(Bucket(64, 64)).to_json(), entries=(0,), input_names=("latents",),
                output_names=("pixels",), backend="aoti", backend_version="v1", device_type="cpu", gpu_name=None,
                compute_capability=None, torch_version=torch.__version__,
                latent_format={"channels": 4, "spatial_factor": 8})
    base.update(kw)
    return EngineIdentity(**base)


def test_identity_round_trip_and_mismatch_reasons(tmp_path):
    ident = _ident()
    assert EngineIdentity.from_json(ident.to_json()) == ident
    assert mismatches(ident, backend_version="v1", device=torch.device("cpu"), model_hash_now="h") == []
    why = mismatches(_ident(device_type="cuda", backend_version="v0", model_hash="x"), backend_version="v1",
                     device=torch.device("cpu"), model_hash_now="h")
    assert len(why) == 3 and "cuda" in why[0] and "v0" in why[1] and "different weights" in why[2]
    eng = tmp_path / "d.pt2"
    eng.write_bytes(b"0123456789")
    from turbovae.trt.fileio import file_sha256

    ok = _ident(engine_bytes=10, engine_sha256=file_sha256(eng))
    verify_file(eng, ok)
    eng.write_bytes(b"01234")
    with pytest.raises(IdentityError, match="truncated"):
        verify_file(eng, ok)


# -- TensorRT decisions, no TensorRT needed ----------------------------------------------------------
TRT10_FLAGS = ["FP16", "BF16", "INT8", "TF32", "REFIT", "REFIT_IDENTICAL", "OBEY_PRECISION_CONSTRAINTS", "STRIP_PLAN"]
TRT11_FLAGS = ["DEBUG", "GPU_FALLBACK", "REFIT", "TF32", "REFIT_IDENTICAL", "STRIP_PLAN", "VERSION_COMPATIBLE"]


def test_flags_for_trt10_and_trt11():
    for flags in (TRT10_FLAGS, TRT11_FLAGS):
        chosen = L.builder_flags(flags, refit=True)
        assert "FP16" not in chosen and "BF16" not in chosen and chosen == ["TF32", "REFIT_IDENTICAL"]
    assert L.builder_flags(["TF32", "REFIT"], refit=True) == ["TF32", "REFIT"]
    assert L.network_flags(["EXPLICIT_BATCH", "STRONGLY_TYPED"], 1) == 2
    assert L.network_flags(["PREFER_JIT_PYTHON_PLUGINS"], None) == 0  # 11: always strongly typed
    with pytest.raises(Exception, match="10.12"):
        L.check_version("10.8.0")
    assert L.check_version("11.4.0.106") == (11, 4)


def test_profile_choice_dtype_map_workspace_and_cache_key(tmp_path):
    r = lambda lo, hi: ((1, 16, lo, lo), (1, 16, hi, hi), (1, 16, hi, hi))  # noqa: E731
    ranges = [[r(8, 128)], [r(8, 64)], [r(64, 256)]]
    assert L.choose_profile(ranges, [(1, 16, 32, 32)]) == 1
    assert L.choose_profile(ranges, [(1, 16, 100, 100)]) == 0
    with pytest.raises(EngineRunError, match="outside every"):
        L.choose_profile(ranges, [(1, 16, 300, 8)])
    assert L.torch_dtype("DataType.HALF") is torch.float16 and L.torch_dtype("BF16") is torch.bfloat16
    assert L.workspace_bytes(10 << 30) == int((9 << 30) * 0.75)
    with pytest.raises(Exception, match="Unload"):
        L.workspace_bytes(1 << 30)
    a = L.timing_cache_path(tmp_path, "9.0", "11.4.0.106")
    assert a != L.timing_cache_path(tmp_path, "8.9", "11.4.0.106") != L.timing_cache_path(tmp_path, "9.0", "10.12")
    with pytest.raises(EngineRunError, match="execute"):
        L.check(False, "execute_async_v3")
    with pytest.raises(EngineRunError):
        L.check(None, "create_execution_context")


class _MockContext:
    def __init__(self, fail=None):
        self.fail, self.calls = fail, []

    def _ret(self, name):
        self.calls.append(name)
        return name != self.fail

    def set_optimization_profile_async(self, k, s):
        return self._ret("profile")

    def set_input_shape(self, n, shape):
        self.shape = tuple(shape)
        return self._ret("shape")

    def set_tensor_address(self, n, p):
        return self._ret("address")

    def get_tensor_shape(self, n):
        b, c, h, w = self.shape
        return (b, 3, h * 8, w * 8)

    def execute_async_v3(self, s):
        return self._ret("execute")


def _mock_trt(version="11.4.0.106", ctx=None):
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.TensorIOMode = types.SimpleNamespace(INPUT="in", OUTPUT="out")

    class Engine:
        num_io_tensors = 2
        num_optimization_profiles = 1
        device_memory_size_v2 = 1000

        def get_tensor_name(self, i):
            return ["latents", "pixels"][i]

        def get_tensor_mode(self, n):
            return "in" if n == "latents" else "out"

        def get_tensor_dtype(self, n):
            return "DataType.HALF" if n == "latents" else "DataType.FLOAT"

        def get_tensor_shape(self, n):
            return (-1, 4, -1, -1) if n == "latents" else (-1, 3, -1, -1)

        def get_tensor_profile_shape(self, n, k):
            return [(1, 4, 1, 1), (1, 4, 8, 8), (1, 4, 16, 16)]

        def create_execution_context(self):
            return ctx

    trt.Engine = Engine
    return trt


@pytest.mark.parametrize("fail", [None, "shape", "address", "execute"])
def test_trt_runtime_checks_every_return(tmp_path, fail):
    from turbovae.trt.tensorrt_backend import TRTEngine

    ctx = _MockContext(fail)
    trt = _mock_trt(ctx=ctx)
    plan = tmp_path / "d.engine"
    plan.write_bytes(b"x" * 10)
    eng = TRTEngine(trt, plan, trt.Engine(), [], ("latents",), ("pixels",), torch.device("cpu"))
    z = torch.randn(1, 4, 2, 3)
    if fail is None:
        out = eng.run({"latents": z})["pixels"]
        assert out.shape == (1, 3, 16, 24) and out.dtype is torch.float32  # dtype read from the engine
        assert ctx.calls[-1] == "execute"
        assert eng.memory_bytes == 1010
    else:
        with pytest.raises(EngineRunError, match="failed"):
            eng.run({"latents": z})
    with pytest.raises(EngineRunError, match="outside"):
        eng.run({"latents": torch.randn(1, 4, 32, 32)})


def test_trt_engine_is_compared_with_its_manifest_before_the_first_run(tmp_path):
    """dtype of every I/O tensor and the profile ranges the manifest records, checked at load."""
    from turbovae.trt.interface import EngineLoadError
    from turbovae.trt.tensorrt_backend import TRTEngine

    trt = _mock_trt(ctx=_MockContext())
    plan = tmp_path / "d.engine"
    plan.write_bytes(b"x")
    recorded = [{"latents": ((1, 4, 1, 1), (1, 4, 8, 8), (1, 4, 16, 16))}]
    with pytest.raises(EngineLoadError, match="dtypes .*pixels.*differ from the manifest's torch.float16"):
        TRTEngine(trt, plan, trt.Engine(), recorded, ("latents",), ("pixels",), torch.device("cpu"), torch.float16)
    trt.Engine.get_tensor_dtype = lambda self, n: "DataType.HALF"
    TRTEngine(trt, plan, trt.Engine(), recorded, ("latents",), ("pixels",), torch.device("cpu"), torch.float16)
    other = [{"latents": ((1, 4, 1, 1), (1, 4, 8, 8), (1, 4, 32, 32))}]
    with pytest.raises(EngineLoadError, match="profile 0 is .* in the engine"):
        TRTEngine(trt, plan, trt.Engine(), other, ("latents",), ("pixels",), torch.device("cpu"), torch.float16)
    with pytest.raises(EngineLoadError, match="1 optimization profile"):
        TRTEngine(trt, plan, trt.Engine(), recorded * 2, ("latents",), ("pixels",), torch.device("cpu"))


def test_trt_none_context_and_missing_module(monkeypatch, tmp_path):
    from turbovae.trt import tensorrt_backend as TB
    from turbovae.trt.interface import EngineLoadError

    trt = _mock_trt(ctx=None)
    plan = tmp_path / "d.engine"
    plan.write_bytes(b"x")
    with pytest.raises(EngineLoadError, match="execution context"):
        TB.TRTEngine(trt, plan, trt.Engine(), [], ("latents",), ("pixels",), torch.device("cpu"))
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import fails like an absent package
    with pytest.raises(BackendUnavailable, match="pip install tensorrt"):
        TB.import_tensorrt()
    monkeypatch.setitem(sys.modules, "tensorrt", _mock_trt("10.8.1"))
    with pytest.raises(Exception, match="too old"):
        TB.import_tensorrt()


class _StaticMultiIOContext(_MockContext):
    """Outputs have the engine's static shapes (a fully static engine resolves them without inputs)."""

    def __init__(self, shapes):
        super().__init__()
        self.shapes, self.inputs_set, self.addresses = shapes, [], []

    def set_input_shape(self, n, shape):
        self.inputs_set.append((n, tuple(shape)))
        return self._ret("shape")

    def set_tensor_address(self, n, p):
        self.addresses.append(n)
        return self._ret("address")

    def get_tensor_shape(self, n):
        return self.shapes[n]


def _mock_static_slice_engine(shapes):
    """A video slice engine as TensorRT describes it: two static inputs (latents + one causal cache),
    two outputs, no profile dimensions to query for static inputs."""

    class Engine:
        num_io_tensors = 4
        num_optimization_profiles = 1
        device_memory_size_v2 = 0
        names = ["latents", "memory_0", "pixels", "memory_0_out"]

        def get_tensor_name(self, i):
            return self.names[i]

        def get_tensor_mode(self, n):
            return "in" if n in ("latents", "memory_0") else "out"

        def get_tensor_dtype(self, n):
            return "DataType.BF16"

        def get_tensor_shape(self, n):
            return shapes[n]

        def get_tensor_profile_shape(self, n, k):
            raise RuntimeError("static input: no profile dimensions")

        def create_execution_context(self):
            return self.ctx

    return Engine


def test_trt_static_multi_input_multi_output_engine(tmp_path):
    from turbovae.trt.tensorrt_backend import TRTEngine

    shapes = {"latents": (1, 16, 1, 2, 3), "memory_0": (1, 16, 2, 2, 3), "pixels": (1, 3, 4, 16, 24),
              "memory_0_out": (1, 16, 2, 2, 3)}
    trt = _mock_trt()
    Engine = _mock_static_slice_engine(shapes)
    Engine.ctx = ctx = _StaticMultiIOContext(shapes)
    plan = tmp_path / "decode_slice_next_24x16.engine"
    plan.write_bytes(b"x")
    eng = TRTEngine(trt, plan, Engine(), [], ("latents", "memory_0"), ("pixels", "memory_0_out"),
                    torch.device("cpu"))
    assert eng.ranges == [[(shapes["latents"],) * 3, (shapes["memory_0"],) * 3]]
    out = eng.run({"latents": torch.randn(shapes["latents"]), "memory_0": torch.randn(shapes["memory_0"])}, 0)
    assert {k: tuple(v.shape) for k, v in out.items()} == {"pixels": shapes["pixels"],
                                                           "memory_0_out": shapes["memory_0_out"]}
    assert all(v.dtype is torch.bfloat16 for v in out.values())
    assert [n for n, _ in ctx.inputs_set] == ["latents", "memory_0"]
    assert sorted(ctx.addresses) == sorted(shapes)  # every input and every output bound
    with pytest.raises(EngineRunError, match="outside"):
        eng.run({"latents": torch.randn(1, 16, 1, 4, 6), "memory_0": torch.randn(shapes["memory_0"])}, 0)


def test_trt_profiles_only_for_dynamic_inputs():
    assert L.dynamic_inputs({"latents": (1, 16, 1, 90, 160), "memory_0": (1, 16, 2, 90, 160)}) == []
    assert L.dynamic_inputs({"latents": (1, 16, -1, -1)}) == ["latents"]
    assert L.input_range((1, 2, 3), lambda: 1 / 0) == ((1, 2, 3),) * 3  # static: the profile is never asked
    assert L.input_range((1, -1), lambda: [(1, 1), (1, 4), (1, 8)]) == ((1, 1), (1, 4), (1, 8))


# -- CLI and packaging --------------------------------------------------------------------------------
def test_cli_tables():
    from turbovae.cli import build

    p = argparse.ArgumentParser()
    build.add_arguments(p)
    a = p.parse_args(["--vae", "v.safetensors", "--out", "o", "--static", "1024x1024"])
    assert build.table_from_args(a).mode == "static"
    a = p.parse_args(["--vae", "v", "--out", "o", "--static", "512x512", "1664x928"])
    assert build.table_from_args(a).buckets == (Bucket(512, 512), Bucket(928, 1664))
    assert build.table_from_args(p.parse_args(["--vae", "v", "--out", "o", "--multi-ratio"])).mode == "multi_ratio"
    assert build.table_from_args(p.parse_args(["--vae", "v", "--out", "o", "--multi-profile"])).mode == "multi_profile"
    assert not a.video and p.parse_args(["--vae", "v", "--out", "o", "--static", "1280x720", "--video"]).video


def test_pack_imports_without_tensorrt():
    code = ("import sys; sys.modules['tensorrt'] = None\n"
            "import turbovae, turbovae.trt.engine_vae, turbovae.trt.tensorrt_backend, turbovae.cli.build\n"
            "from turbovae.trt.interface import BackendUnavailable\n"
            "from turbovae.trt.backends import get_backend\n"
            "try:\n    get_backend('tensorrt').check_available('cuda')\nexcept BackendUnavailable as e:\n"
            "    print('OK', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OK") and "aoti" in out.stdout


def test_auto_backend_builds_with_tensorrt_only_where_it_can(monkeypatch):
    """`auto` (the Build Engine node's default): AOTInductor here (no TensorRT on a CPU), TensorRT once every
    check passes; a named backend is kept."""
    import torch

    from turbovae.trt import backends as be

    name, why = be.resolve_backend("auto", torch.device("cpu"))
    assert name == "aoti" and why
    assert be.resolve_backend("tensorrt", torch.device("cpu")) == ("tensorrt", "asked for")

    class Ready:
        def check_available(self, device):
            return None

    monkeypatch.setattr(be, "get_backend", lambda n: Ready())
    monkeypatch.setattr(be, "missing_onnx_export", lambda: [])
    assert be.resolve_backend("auto", torch.device("cpu"))[0] == "tensorrt"
    monkeypatch.setattr(be, "missing_onnx_export", lambda: ["onnxscript"])
    assert be.resolve_backend("auto", torch.device("cpu")) == (
        "aoti", "TensorRT builds need onnxscript for the ONNX export")


def test_cpu_aoti_builds_compile_with_freezing_and_cuda_builds_with_inductor_defaults(monkeypatch, tmp_path):
    """The package step asks Inductor for `freezing` on a CPU program (oneDNN-prepacked convs instead of the
    reference conv3d for small batch-1 convs) and keeps the I/O dtype metadata; CUDA keeps Inductor's defaults."""
    from turbovae.trt import aoti

    program = torch.export.export(torch.nn.Conv3d(2, 2, 3).eval(), (torch.randn(1, 2, 3, 4, 4),))
    assert aoti.program_device(program) == torch.device("cpu")
    seen = {}
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", lambda prog, package_path, inductor_configs:
                        seen.update(inductor_configs, grad=torch.is_grad_enabled()))
    with torch.enable_grad():
        aoti.AOTIBackend().compile_package(program, tmp_path / "x.pt2")
    assert seen["freezing"] is True and aoti.IO_METADATA_KEY in seen["aot_inductor.metadata"]
    assert seen["grad"] is False  # Inductor skips freezing while grad is on
    assert aoti.inductor_options(torch.device("cuda")) == {}
