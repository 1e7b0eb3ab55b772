"""The TurboVAE nodes inside a real ComfyUI server: pack import, /object_info (our nodes and the core
signature table), every shipped workflow, core VAE nodes given our VAE, and a real interrupt.

Skipped unless TURBOVAE_COMFYUI names a ComfyUI checkout (CI has none; nothing is ever downloaded):

    TURBOVAE_COMFYUI=/path/to/ComfyUI python -m pytest -q tests/test_nodes_comfyui.py

The server runs under TURBOVAE_COMFYUI_PYTHON if set, else the first of <checkout>/venv, <checkout>/.venv
and <checkout>/../cvenv (bin/python) that exists, else this interpreter; it needs ComfyUI's requirements
(and a C compiler for the AOTInductor engine build). Checked with ComfyUI 0.3.64, 0.8.0 (3cd7b32f) and 0.33.0
(de6b062f, frontend 1.58.1) on CPU, about 1 minute for 0.8.0, 10 for 0.33.0 (7 of them core's SeedVR2 comparison). ComfyUI imports torchvision at startup; on a CPU-only machine PyPI's torchvision wheel
(built for CUDA torch) cannot load its C ops next to the CPU torch, so that venv needs a torchvision that imports
(the 0.8.0 check skipped torchvision's op registrations when its ops are absent, a change to the venv only).

One server for the module (`--cpu`, a free port, `--base-directory` under pytest's tmp dir, in-memory
database, no API nodes): models, inputs, outputs, user files and the inductor cache stay in that folder,
and the pack is symlinked into its custom_nodes under a folder name that is not a Python identifier.
VAE files are random weights with the real key sets and shapes under the names the workflows use, kept in a
store folder and linked into models/vae and into an extra_model_paths.yaml root, as users sharing one store keep them
(the loader has no config seam in a server, so real-size configs at tiny image sizes: 64x48 images and
ComfyUI's own input name `example.png`, a 64x64 engine); nothing else is placed, so a workflow that needs any
other file fails here as it would for a user. Workflows are converted UI -> API by tests/comfy_workflow.py
against the live /object_info, then queued; only file-name and engine widgets are changed, the way a
user would. The build is an AOTInductor one (TensorRT needs a GPU). 2 to 2.5 minutes on 2 shared CPU
cores, most of it the engine build.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

_CHECKOUT = os.environ.get("TURBOVAE_COMFYUI")
if not _CHECKOUT:
    pytest.skip("set TURBOVAE_COMFYUI to a ComfyUI checkout to run the nodes in a real ComfyUI server",
                allow_module_level=True)
CHECKOUT = Path(_CHECKOUT).expanduser().resolve()
if not (CHECKOUT / "main.py").is_file() or not (CHECKOUT / "comfy").is_dir():
    pytest.skip(f"TURBOVAE_COMFYUI={_CHECKOUT} is not a ComfyUI checkout (no main.py and comfy/)",
                allow_module_level=True)

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import comfy_workflow  # noqa: E402
import node_helpers  # noqa: E402
import test_workflows as offline  # noqa: E402  (our node signatures as the offline validator sees them)

import turbovae  # noqa: E402
from turbovae.vae.seedvr2 import SeedVR2Config, expected_shapes as seedvr2_shapes  # noqa: E402
from turbovae.vae.wan import WAN21, expected_shapes as wan_shapes  # noqa: E402
from turbovae.vae.wan.keys import diffusers_to_original  # noqa: E402

pytestmark = pytest.mark.slow  # a real ComfyUI server or browser: the full tier (README)

REPO = Path(__file__).resolve().parents[1]
PACK_DIRNAME = "Turbo VAE-pack.v2"  # spaces, dash and dot: the pack must load under any folder name
OUR_NODE_IDS = sorted(node.GET_SCHEMA().node_id for node in offline.OUR_NODES)
CORE_TABLE = Path(__file__).parent / "data" / "core_node_signatures.json"
STARTUP_TIMEOUT_S = 240
RUN_TIMEOUT_S = 420
IMAGE_W, IMAGE_H = 64, 48  # example.png
ENGINE_SIZE = 64  # Build Engine's minimum
PACK_FAILURE_MARKERS = ("IMPORT FAILED", "Cannot import", "Error while calling comfy_entrypoint",
                        "did not return", "Skip ", "engine nodes unavailable")
# Post-Process SeedVR2 Output's lab correction histogram-matches pixels by rank: inputs equal to 1e-7 can still
# swap two pixels' ranks, moving an output by the gap between neighbouring values (measured: docs/nodes.md).
LAB_RANK_TOLERANCE = 1e-2
ENGINE_FALLBACK_MARKERS = ("TurboVAE engine", "are not used", "EngineFallbackWarning")


def comfy_python() -> str:
    return node_helpers.comfy_python(CHECKOUT)


# -- files the server reads ------------------------------------------------------------------------------
def write_random_vae(path: Path, shapes: dict, seed: int, to_original=None) -> None:
    """Random fp16 weights with exactly these keys and shapes (what the strict loader checks)."""
    gen = torch.Generator().manual_seed(seed)
    sd = {k: torch.empty(s, dtype=torch.float16).normal_(0.0, 0.02, generator=gen) for k, s in shapes.items()}
    save_file(to_original(sd) if to_original else sd, str(path))


def write_png(path: Path, width: int, height: int) -> None:
    """An RGB gradient PNG (zlib only)."""
    rows = b"".join(b"\x00" + bytes(v for x in range(width) for v in (4 * x % 256, 5 * y % 256, 128))
                    for y in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


# Model files as users keep them (issue 41): one store shared by several installs, reached through symbolic
# links in models/vae and through an extra_model_paths.yaml root whose entries are links too.
MODEL_STORE = "model_store"  # under the base folder, outside every model folder
EXTRA_ROOT = "shared_models"  # the extra_model_paths.yaml base_path
LINKED_INTO_MODELS = ("qwen_image_vae.safetensors", "ema_vae_fp16.safetensors")
LINKED_INTO_EXTRA_ROOT = ("qwen_image_layered_vae.safetensors",)


def prepare_base(base: Path) -> None:
    (base / "custom_nodes").mkdir(parents=True)
    (base / "custom_nodes" / PACK_DIRNAME).symlink_to(REPO, target_is_directory=True)
    for sub in ("input", "models/vae", "output", MODEL_STORE, f"{EXTRA_ROOT}/vae"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "extra_model_paths.yaml").write_text(f"shared_store:\n    base_path: {base / EXTRA_ROOT}\n    vae: vae/\n")


def write_inputs(base: Path) -> None:
    """The VAE files in the store, linked into models/vae and into the extra root (what the server lists)."""
    store = base / MODEL_STORE
    write_random_vae(store / "qwen_image_vae.safetensors", wan_shapes(WAN21), seed=0,
                     to_original=lambda sd: diffusers_to_original(sd, WAN21))  # ComfyUI's key format
    write_random_vae(store / "ema_vae_fp16.safetensors", seedvr2_shapes(SeedVR2Config()), seed=1)
    layered = replace(WAN21, image_channels=4)  # Qwen-Image-Layered: RGBA in and out
    write_random_vae(store / "qwen_image_layered_vae.safetensors", wan_shapes(layered), seed=2,
                     to_original=lambda sd: diffusers_to_original(sd, layered))
    for folder, names in ((base / "models" / "vae", LINKED_INTO_MODELS),
                          (base / EXTRA_ROOT / "vae", LINKED_INTO_EXTRA_ROOT)):
        for name in names:
            (folder / name).symlink_to(store / name)
    write_png(base / "input" / "example.png", IMAGE_W, IMAGE_H)


# -- the server ------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ComfyServer:
    url: str
    base: Path
    log_path: Path
    proc: subprocess.Popen
    startup_log: str = ""

    def request(self, path: str, body: dict | None = None, timeout: float = 60):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
        return json.loads(body) if body else None

    def object_info(self) -> dict:
        return self.request("/object_info")

    def log(self, start: int = 0) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(start)
            return f.read().decode("utf-8", "replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def log_tail(self, lines: int = 60) -> str:
        return "\n--- ComfyUI log (tail) ---\n" + "\n".join(self.log().splitlines()[-lines:])

    def queue(self, prompt: dict, client_id: str = "turbovae-tests") -> str:
        try:
            return self.request("/prompt", {"prompt": prompt, "client_id": client_id})["prompt_id"]
        except urllib.error.HTTPError as e:
            pytest.fail(f"/prompt refused the prompt: {e.read().decode(errors='replace')}{self.log_tail()}")

    def history(self, prompt_id: str) -> dict | None:
        """The finished prompt's history entry, or None while it is queued or running."""
        entry = self.request(f"/history/{prompt_id}").get(prompt_id)
        return entry if entry and entry.get("status", {}).get("completed") is not None else None

    def wait(self, prompt_id: str, timeout: float = RUN_TIMEOUT_S) -> dict:
        """The history entry of `prompt_id` once it has finished."""
        deadline = time.monotonic() + timeout
        while (entry := self.history(prompt_id)) is None:
            assert self.proc.poll() is None, f"ComfyUI exited ({self.proc.returncode}){self.log_tail()}"
            if time.monotonic() > deadline:
                self.request("/interrupt", {})
                pytest.fail(f"prompt did not finish within {timeout} s{self.log_tail()}")
            time.sleep(0.2)
        return entry

    def run(self, prompt: dict, timeout: float = RUN_TIMEOUT_S) -> dict:
        """Queue `prompt`, wait for its history entry and require success; failures carry the log tail."""
        entry = self.wait(self.queue(prompt), timeout)
        status = entry["status"]
        errors = [f"{d.get('node_type')} #{d.get('node_id')}: {d.get('exception_type')}: "
                  f"{d.get('exception_message')}\n{''.join(d.get('traceback', []))[-3000:]}"
                  for event, d in status.get("messages", []) if event == "execution_error"]
        assert status.get("status_str") == "success" and not errors, \
            f"prompt failed: {status.get('status_str')}\n" + "\n".join(errors) + self.log_tail()
        return entry

    def saved_files(self, entry: dict, node_id: str) -> list[Path]:
        """Files a save node reported in the history entry (images, videos)."""
        folders = {"output": self.base / "output", "temp": self.base / "temp", "input": self.base / "input"}
        return [folders[r["type"]] / r.get("subfolder", "") / r["filename"]
                for value in entry["outputs"].get(node_id, {}).values() if isinstance(value, list)
                for r in value if isinstance(r, dict) and "filename" in r]


class EventStream:
    """The server's /ws messages for one client id (progress, executing, execution_*): a minimal stdlib
    WebSocket client (RFC 6455 handshake; the server's frames are unmasked; binary previews are skipped)."""

    def __init__(self, url: str, client_id: str, timeout: float = 120):
        host, port = url.removeprefix("http://").split(":")
        self.client_id, self.buf = client_id, b""
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /ws?clientId={client_id} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the websocket")
        self.buf += data

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def next(self) -> dict:
        """The next JSON (text) message."""
        while True:
            b0, b1 = self._take(2)
            size = b1 & 0x7F
            if size >= 126:
                size = int.from_bytes(self._take(2 if size == 126 else 8), "big")
            payload, opcode = self._take(size), b0 & 0x0F
            if opcode == 0x1:
                return json.loads(payload)
            if opcode == 0x8:
                raise ConnectionError("the server closed the websocket")

    def next_for(self, prompt_id: str) -> dict:
        """The next message about `prompt_id`."""
        while (msg := self.next()).get("data", {}).get("prompt_id") != prompt_id:
            pass
        return msg

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    base = tmp_path_factory.mktemp("comfyui_base")
    prepare_base(base)
    log_path = base / "comfyui.log"
    port = free_port()
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(base / "torchinductor"), "HF_HUB_OFFLINE": "1"}
    cmd = [comfy_python(), "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
           "--disable-auto-launch", "--base-directory", str(base), "--database-url", "sqlite:///:memory:",
           "--disable-api-nodes", "--extra-model-paths-config", str(base / "extra_model_paths.yaml")]
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, cwd=CHECKOUT, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # own group: inductor workers
    server = ComfyServer(f"http://127.0.0.1:{port}", base, log_path, proc)
    try:
        write_inputs(base)  # while the server starts; file combos are listed per request
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ComfyUI exited with code {proc.returncode} during startup: {' '.join(cmd)}"
                            f"{server.log_tail()}")
            try:
                server.object_info()
                server.startup_log = server.log()
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                if time.monotonic() > deadline:
                    pytest.fail(f"ComfyUI did not answer /object_info within {STARTUP_TIMEOUT_S} s{server.log_tail()}")
                time.sleep(0.5)
        yield server
    finally:
        _stop(proc)
        for big in ("models", MODEL_STORE, "torchinductor"):  # ~1.2 GB of weights, engines and compiler cache
            shutil.rmtree(base / big, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def load_workflow(name: str) -> dict:
    return json.loads((REPO / "workflows" / f"{name}.json").read_text())


def node_id(workflow: dict, node_type: str) -> str:
    (found,) = [str(n["id"]) for n in workflow["nodes"] if n["type"] == node_type]
    return found


def run_workflow(comfy: ComfyServer, workflow: dict) -> tuple[dict, str]:
    """Convert against the live /object_info (every widget value must be valid), run, return the history
    entry and the server log written meanwhile."""
    prompt, problems = comfy_workflow.convert(workflow, comfy.object_info())
    assert problems == []
    start = comfy.log_size()
    entry = comfy.run(prompt)
    return entry, comfy.log(start)


# -- tests -----------------------------------------------------------------------------------------------
def test_pack_imports_and_registers_every_node(comfy):
    info = comfy.object_info()
    pack_lines = [line for line in comfy.startup_log.splitlines() if PACK_DIRNAME in line or "TurboVAE" in line]
    failures = [line for line in pack_lines if any(m in line for m in PACK_FAILURE_MARKERS)]
    assert failures == [], f"the pack did not import cleanly: {failures}{comfy.log_tail()}"
    assert any(line.rstrip().endswith(f"seconds: {comfy.base / 'custom_nodes' / PACK_DIRNAME}")
               for line in pack_lines), f"no import-time line for the pack{comfy.log_tail()}"
    module = f"custom_nodes.{PACK_DIRNAME}"
    ours = sorted(k for k, v in info.items() if v.get("python_module") == module)
    assert ours == OUR_NODE_IDS, f"nodes registered by the pack: {ours}"
    assert all(info[k]["category"] == "TurboVAE" for k in OUR_NODE_IDS)


def signature_of(info: dict, like: dict) -> dict:
    """An /object_info entry in the shape of the signature table entry `like`: input order, type,
    optional, combo options (not for file combos, marked `options: null`), min / max, and the options that
    change the widget layout or the widget (control_after_generate, image_upload, multiline)."""
    inputs = {}
    for name, kind, opts, optional in comfy_workflow.input_specs(info):
        want = like["inputs"].get(name, {})
        entry = {"type": kind, "optional": optional}
        if kind == "COMBO":
            entry["options"] = None if want.get("options", ...) is None else list(opts["options"])
        if kind == comfy_workflow.DYNAMIC_COMBO:  # the table lists the option keys
            entry["options"] = [option["key"] for option in opts["options"]]
        for key in ("min", "max", "control_after_generate", "image_upload", "multiline"):
            if key in opts and (key != "multiline" or key in want):
                entry[key] = opts[key]
        if opts.get("forceInput"):
            entry["force_input"] = True
        inputs[name] = entry
    return {"input_order": [name for name, *_ in comfy_workflow.input_specs(info)], "inputs": inputs,
            "outputs": list(info["output"]), "output_node": bool(info["output_node"])}


def _newer_core_nodes() -> set[str]:
    """Core nodes of the table that only newer cores have (native SeedVR2): absent from a release is allowed."""
    return set(json.loads(CORE_TABLE.read_text())["_newer_core_nodes"]["nodes"])


def test_vae_files_are_links_and_the_server_lists_them(comfy):
    """Every VAE file the workflows use is a symbolic link into the store, in models/vae or in the
    extra_model_paths.yaml root, and the loader offers each (the workflows below run on these links)."""
    vae_dirs = {name: comfy.base / "models" / "vae" for name in LINKED_INTO_MODELS}
    vae_dirs.update({name: comfy.base / EXTRA_ROOT / "vae" for name in LINKED_INTO_EXTRA_ROOT})
    for name, folder in vae_dirs.items():
        assert (folder / name).is_symlink() and (folder / name).resolve().parent == (comfy.base / MODEL_STORE).resolve()
    (options,) = [opts["options"] for name, _kind, opts, _optional in
                  comfy_workflow.input_specs(comfy.object_info()["TurboVAELoader"]) if name == "vae_name"]
    assert set(vae_dirs) <= set(options), options


def test_core_node_signature_table_matches_object_info(comfy):
    table = {k: v for k, v in json.loads(CORE_TABLE.read_text()).items() if not k.startswith("_")}
    info = comfy.object_info()
    missing = sorted(set(table) - set(info) - _newer_core_nodes())
    assert missing == [], f"core nodes missing from this ComfyUI: {missing}"
    table = {k: v for k, v in table.items() if k in info}
    diffs = {name: {"table": sig, "object_info": live}
             for name, sig in table.items() if (live := _compatible_growth_as_table(signature_of(info[name], sig), sig)) != sig}
    assert diffs == {}, json.dumps(diffs, indent=1)


def _compatible_growth_as_table(live: dict, table: dict) -> dict:
    """`live` with what a later ComfyUI may add without breaking a workflow saved against the table shown as the
    table's, so only real breaks remain as differences:
    - a combo (or a combo turned dynamic combo, ComfyUI 0.33) whose options are a superset of the table's: every
      value the table (and so a shipped workflow) allows stays valid;
    - optional inputs appended after the table's inputs (0.33's CreateVideo bit_depth): a saved workflow's
      widget values keep their positions and the new input takes its default;
    - outputs appended after the table's (0.33's SaveImage / PreviewImage pass their IMAGE on): links name
      output slots by index, so existing links keep theirs.
    Removed, renamed, retyped or reordered inputs and outputs still show as a difference."""
    inputs = {}
    for name, entry in live["inputs"].items():
        want = table["inputs"].get(name)
        if want is None:
            inputs[name] = entry
            continue
        if (entry.get("type") in ("COMBO", comfy_workflow.DYNAMIC_COMBO) and want.get("type") in ("COMBO", comfy_workflow.DYNAMIC_COMBO)
                and isinstance(entry.get("options"), list) and isinstance(want.get("options"), list)
                and set(want["options"]) <= set(entry["options"])):
            entry = dict(entry, type=want["type"], options=want["options"])
        inputs[name] = entry
    order = live["input_order"]
    known = len(table["input_order"])
    if order[:known] == table["input_order"] and all(inputs[n]["optional"] for n in order[known:]):
        order = order[:known]
        inputs = {n: inputs[n] for n in order}
    outputs = live["outputs"]
    if outputs[:len(table["outputs"])] == table["outputs"]:
        outputs = table["outputs"]
    return dict(live, input_order=order, inputs=inputs, outputs=outputs)


def test_offline_view_of_our_nodes_matches_object_info(comfy):
    """tests/test_workflows.py validates workflows against signatures built from our schemas through the
    ComfyUI test doubles; the real server must publish the same."""
    info = comfy.object_info()
    ours = offline.our_signatures()
    diffs = {name: {"offline": sig, "object_info": signature_of(info[name], sig)}
             for name, sig in ours.items() if signature_of(info[name], sig) != sig}
    assert diffs == {}, json.dumps(diffs, indent=1)


def test_tiled_encode_decode_roundtrip_workflow(comfy):
    wf = load_workflow("tiled_encode_decode_roundtrip")
    entry, _ = run_workflow(comfy, wf)
    files = comfy.saved_files(entry, node_id(wf, "SaveImage"))
    assert len(files) == 1 and png_size(files[0]) == (IMAGE_W, IMAGE_H), files


def test_core_vae_nodes_accept_the_turbovae_vae(comfy):
    prompt = {
        "1": {"class_type": "TurboVAELoader", "inputs": {"vae_name": "qwen_image_vae.safetensors", "dtype": "auto"}},
        "2": {"class_type": "LoadImage", "inputs": {"image": "example.png"}},
        "3": {"class_type": "VAEEncode", "inputs": {"pixels": ["2", 0], "vae": ["1", 0]}},
        "4": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["1", 0]}},
        "5": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "core_vae"}},
        "6": {"class_type": "VAEEncodeTiled", "inputs": {"pixels": ["2", 0], "vae": ["1", 0], "tile_size": 512,
                                                         "overlap": 64, "temporal_size": 64, "temporal_overlap": 8}},
        "7": {"class_type": "VAEDecodeTiled", "inputs": {"samples": ["6", 0], "vae": ["1", 0], "tile_size": 512,
                                                         "overlap": 64, "temporal_size": 64, "temporal_overlap": 8}},
        "8": {"class_type": "SaveImage", "inputs": {"images": ["7", 0], "filename_prefix": "core_vae_tiled"}},
    }
    entry = comfy.run(prompt)
    for save in ("5", "8"):
        files = comfy.saved_files(entry, save)
        assert len(files) == 1 and png_size(files[0]) == (IMAGE_W, IMAGE_H), files


def _decode_prompt(size: int) -> dict:
    """TurboVAE tiled decode (64 px fast tiles) of an empty Qwen-Image latent of size x size pixels."""
    return {
        "1": {"class_type": "TurboVAELoader", "inputs": {"vae_name": "qwen_image_vae.safetensors", "dtype": "auto"}},
        "2": {"class_type": "EmptySD3LatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "3": {"class_type": "TurboVAETiledDecode", "inputs": {"samples": ["2", 0], "vae": ["1", 0], "tile_size": 64,
                                                              "overlap": 0, "temporal_slice": 0, "mode": "fast"}},
        "4": {"class_type": "PreviewImage", "inputs": {"images": ["3", 0]}},
    }


def test_interrupt_stops_a_tiled_decode_between_tiles_and_the_vae_stays_usable(comfy):
    """POST /interrupt once our node has reported a tile (a 16-tile decode, about 30 s on 2 CPU cores):
    at most the tile in flight completes, the prompt ends interrupted in that node, and the same cached
    VAE then decodes normally."""
    comfy.run(_decode_prompt(64))  # loads and caches the VAE, so the next prompt starts in the decode
    with EventStream(comfy.url, "turbovae-interrupt") as events:
        prompt_id = comfy.queue(_decode_prompt(256), client_id=events.client_id)
        progress = []
        while not progress or progress[-1]["value"] < 1:
            msg = events.next_for(prompt_id)
            assert msg["type"] not in ("execution_success", "execution_error"), msg
            if msg["type"] == "progress" and msg["data"]["node"] == "3":
                progress.append(msg["data"])
        done_at_interrupt, interrupted_at = progress[-1]["value"], time.monotonic()
        comfy.request("/interrupt", {})
        while (msg := events.next_for(prompt_id))["type"] != "execution_interrupted":
            assert msg["type"] not in ("execution_success", "execution_error"), msg
            if msg["type"] == "progress" and msg["data"]["node"] == "3":
                progress.append(msg["data"])
        latency = time.monotonic() - interrupted_at
    assert msg["data"]["node_type"] == "TurboVAETiledDecode", msg
    total = progress[0]["max"]
    assert total >= 16 and progress[-1]["value"] <= done_at_interrupt + 1 < total, progress
    assert latency < 10, f"the interrupt took {latency:.1f} s to stop the decode"
    assert comfy.wait(prompt_id)["status"]["status_str"] == "error"

    entry = comfy.run(_decode_prompt(64))
    files = comfy.saved_files(entry, "4")
    assert len(files) == 1 and png_size(files[0]) == (64, 64), files


def test_seedvr2_workflow_runs_as_shipped(comfy):
    """Only the SeedVR2 VAE file and ComfyUI's example.png are placed: image -> encode -> decode -> save,
    and each TurboVAE node's text output says what ran."""
    wf = load_workflow("seedvr2_video_decode_tiled")
    entry, log = run_workflow(comfy, wf)
    files = comfy.saved_files(entry, node_id(wf, "SaveImage"))
    assert len(files) == 1 and png_size(files[0]) == (IMAGE_W, IMAGE_H), files
    for node_type, what in (("TurboVAETiledEncode", "encode"), ("TurboVAETiledDecode", "decode")):
        text = entry["outputs"][node_id(wf, node_type)]["text"][0]
        assert text.startswith(f"TurboVAE {what}: auto: ") and text in log, text


def test_engine_build_then_engine_load_decode_workflows(comfy):
    """The two engine workflows connect as shipped on a machine without TensorRT: Build Engine's backend
    auto builds AOTInductor engines into the folder whose manifest.json the load workflow names."""
    info = comfy.object_info()
    build = load_workflow("engine_build")
    for name, value in (("width", ENGINE_SIZE), ("height", ENGINE_SIZE)):  # a CPU-sized engine; backend as shipped
        build = comfy_workflow.set_widget(build, "TurboVAEBuildEngine", name, value, info)
    _, build_log = run_workflow(comfy, build)
    folder_name = build["nodes"][0]["widgets_values"][1]
    engines = sorted(p.name for p in (comfy.base / "models" / "tensorrt" / folder_name).iterdir())
    size = f"{ENGINE_SIZE}x{ENGINE_SIZE}"
    assert engines == [f"decoder_{size}.pt2", f"encoder_{size}.pt2", "manifest.json"], build_log

    info = comfy.object_info()  # the new engines are offered without a restart
    load = load_workflow("engine_load_decode")
    engine = load["nodes"][0]["widgets_values"][0]
    assert engine == f"{folder_name}/manifest.json"
    assert engine in info["TurboVAELoadEngine"]["input"]["required"]["engine"][1]["options"]
    # as shipped (pad_to_bucket off): the 64x48 image is not a size the 64x64 engines compute exactly, so it
    # runs on the PyTorch VAE, exactly, with a warning naming the option
    entry, log = run_workflow(comfy, load)
    files = comfy.saved_files(entry, node_id(load, "SaveImage"))
    assert len(files) == 1 and png_size(files[0]) == (IMAGE_W, IMAGE_H), files
    assert "EngineVAE(" in log and "pad_to_bucket=True would run it padded" in log, log
    # the user opts in: padded to 64x64 on the engines, cropped back, no fallback
    entry, log = run_workflow(comfy, comfy_workflow.set_widget(load, "TurboVAELoadEngine", "pad_to_bucket", True, info))
    files = comfy.saved_files(entry, node_id(load, "SaveImage"))
    assert len(files) == 1 and png_size(files[0]) == (IMAGE_W, IMAGE_H), files
    assert "ApproximateResultWarning" in log and "EngineFallbackWarning" not in log, log
    for what in ("encode", "decode"):  # each node's own line: the engines ran
        assert re.search(rf"TurboVAE {what}: [^\n]*, engines, ", log), log


def _refused_only_for_missing_models(comfy, workflow: str) -> dict:
    """A workflow that needs a diffusion model and text encoder the test does not have: every widget value but
    those two file names must be valid for its input, and the server's own validation must agree. Returns
    the converted prompt."""
    wf = load_workflow(workflow)
    missing_files = {(n["type"], name) for n in wf["nodes"] for t, name in
                     (("UNETLoader", "unet_name"), ("CLIPLoader", "clip_name")) if n["type"] == t}
    prompt, problems = comfy_workflow.convert(wf, comfy.object_info(), unchecked=missing_files)
    assert problems == []
    assert {v["class_type"] for v in prompt.values()} == {n["type"] for n in wf["nodes"]} - comfy_workflow.NOTE_TYPES
    with pytest.raises(urllib.error.HTTPError) as refused:
        comfy.request("/prompt", {"prompt": prompt})
    body = json.loads(refused.value.read())
    bad = {(prompt[nid]["class_type"], e["extra_info"]["input_name"])
           for nid, node in body["node_errors"].items() for e in node["errors"]}
    assert bad == missing_files, body
    return prompt


def test_qwen_image_t2i_workflow_converts(comfy):
    _refused_only_for_missing_models(comfy, "qwen_image_t2i_turbovae")


def png_color_type(path: Path) -> int:
    return path.read_bytes()[25]  # IHDR: width, height, bit depth, then colour type (2 RGB, 6 RGBA)


def test_qwen_image_layered_workflow_converts_and_its_vae_part_runs(comfy):
    """The Image-to-Layers graph stops only for the diffusion model and text encoder; its VAE part (image ->
    scale -> core VAE Encode -> core VAE Decode with the layered TurboVAE VAE -> save) runs and writes RGBA."""
    prompt = _refused_only_for_missing_models(comfy, "qwen_image_layered_turbovae")
    by_type = {v["class_type"]: k for k, v in prompt.items()}
    vae_part = {k: prompt[by_type[k]] for k in ("TurboVAELoader", "LoadImage", "ImageScaleToMaxDimension", "VAEEncode")}
    vae_part["ImageScaleToMaxDimension"] = dict(vae_part["ImageScaleToMaxDimension"],
                                                inputs=dict(vae_part["ImageScaleToMaxDimension"]["inputs"],
                                                            largest_size=IMAGE_W))  # CPU time: keep it small
    run = {by_type[k]: v for k, v in vae_part.items()}
    run["90"] = {"class_type": "VAEDecode", "inputs": {"samples": [by_type["VAEEncode"], 0],
                                                       "vae": [by_type["TurboVAELoader"], 0]}}
    run["91"] = {"class_type": "SaveImage", "inputs": {"images": ["90", 0], "filename_prefix": "layered_vae"}}
    entry = comfy.run(run)
    files = comfy.saved_files(entry, "91")
    assert len(files) == 1 and png_color_type(files[0]) == 6, files  # RGBA


def _needs_native_seedvr2(comfy) -> None:
    if not _newer_core_nodes() <= set(comfy.object_info()):
        pytest.skip(f"this ComfyUI has no native SeedVR2 nodes ({CHECKOUT}); assemble one with "
                    "scripts/assemble_comfyui_tree.py (docs/nodes.md)")


def test_seedvr2_upscale_core_nodes_workflow_validates(comfy):
    """Core's native SeedVR2 pipeline with our VAE: as shipped, the server refuses it only for the DiT the user
    supplies."""
    _needs_native_seedvr2(comfy)
    prompt = _refused_only_for_missing_models(comfy, "seedvr2_upscale_core_nodes_turbovae")
    assert {v["class_type"] for v in prompt.values()} >= _newer_core_nodes()


def test_core_seedvr2_nodes_with_our_vae_equal_cores_vae(comfy, tmp_path):
    """Core's SeedVR2 nodes and core VAE nodes run in-process in this ComfyUI (tests/comfy_seedvr2_nodes_check.py)
    with core's VAE and ours on the same seeded weights: latents, conditioning, merged chunks, decoded frames,
    tiled passes and core's seedvr2_tiling option agree within 1e-4 (fp32)."""
    _needs_native_seedvr2(comfy)
    weights = tmp_path / "seedvr2_seeded.safetensors"
    write_random_vae(weights, seedvr2_shapes(SeedVR2Config()), seed=7)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path(turbovae.__file__).parents[1]),
                                                                    os.environ.get("PYTHONPATH")])))
    run = subprocess.run([comfy_python(), str(Path(__file__).parent / "comfy_seedvr2_nodes_check.py"), str(CHECKOUT),
                          str(weights)], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["core_vae"] == "comfy.ldm.seedvr.vae.VideoAutoencoderKLWrapper", report
    assert report["encode"]["core_shape"] == report["encode"]["ours_shape"]
    assert report["decode"]["core_shape"] == report["decode"]["ours_shape"]
    assert report["chunks"]["count"] == 2 and report["chunks"]["condition_channels"] == 17
    exact = [report["encode"]["max_abs"], report["chunks"]["condition_max_abs"], report["chunks"]["merged_max_abs"],
             report["decode"]["max_abs"], report["decode"]["own_latents_max_abs"], report["tiled"]["decode_max_abs"],
             report["tiled"]["encode_max_abs"], report["seedvr2_tiling_option_max_abs"]]
    exact += [report["postprocess"][m]["max_abs"] for m in ("none", "adain", "wavelet")]
    assert max(exact) <= 1e-4, report
    # lab: histogram matching ranks pixels, so rounding-level input differences can swap neighbours' values
    assert report["postprocess"]["lab"]["max_abs"] <= LAB_RANK_TOLERANCE, report


def test_every_shipped_workflow_is_exercised():
    covered = {"tiled_encode_decode_roundtrip", "seedvr2_video_decode_tiled", "engine_build", "engine_load_decode",
               "qwen_image_t2i_turbovae", "qwen_image_layered_turbovae", "seedvr2_upscale_core_nodes_turbovae"}
    assert {p.stem for p in (REPO / "workflows").glob("*.json")} == covered
