"""Every shipped workflow (workflows/*.json, UI format 0.4) is checked against our node schemas and the
core node signatures it uses (tests/data/core_node_signatures.json, extracted from real ComfyUI and
re-checked against a running ComfyUI by tests/test_nodes_comfyui.py, which also converts the workflows to API
prompts and runs them there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import node_helpers  # noqa: E402
from comfy_workflow import DYNAMIC_COMBO  # noqa: E402

node_helpers.use_comfy_stubs()

from turbovae.nodes import all_nodes  # noqa: E402

OUR_NODES = all_nodes()  # while the doubles are importable: the engine nodes import comfy at module level
node_helpers.hide_comfy_stubs()

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / "workflows").glob("*.json"))
CORE = {k: v for k, v in json.loads((Path(__file__).parent / "data" / "core_node_signatures.json").read_text()).items()
        if not k.startswith("_")}
UI_ONLY = {"Note", "MarkdownNote", "Reroute", "PrimitiveNode"}
FILE_COMBOS = {("TurboVAELoader", "vae_name"), ("TurboVAEBuildEngine", "vae_name"),  # options are the user's files
               ("TurboVAELoadEngine", "engine"), ("TurboVAELoadEngine", "fallback_vae")}


def our_signatures() -> dict:
    """Our nodes in the core table's shape, built from the live schemas."""
    out = {}
    for node in OUR_NODES:
        schema = node.GET_SCHEMA()
        inputs = {}
        for inp in schema.inputs:
            entry = {"type": inp.io_type, "optional": bool(inp.optional)}
            if inp.io_type == "COMBO":
                entry["options"] = None if (schema.node_id, inp.id) in FILE_COMBOS else list(inp.options)
            for key in ("min", "max"):
                if getattr(inp, key, None) is not None:
                    entry[key] = getattr(inp, key)
            inputs[inp.id] = entry
        out[schema.node_id] = {"input_order": [i.id for i in schema.inputs], "inputs": inputs,
                               "outputs": [o.io_type for o in schema.outputs],
                               "output_node": bool(schema.is_output_node)}
    return out


SIGNATURES = {**CORE, **our_signatures()}
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO", DYNAMIC_COMBO}


def widget_names(sig: dict) -> list[tuple[str, dict]]:
    """Widget inputs in widgets_values order, with the frontend's extra UI-only slots."""
    slots = []
    for name in sig["input_order"]:
        spec = sig["inputs"][name]
        if spec["type"] not in WIDGET_TYPES or spec.get("force_input"):  # a socket only, no widget
            continue
        slots.append((name, spec))
        if spec.get("control_after_generate") or name in ("seed", "noise_seed"):
            slots.append(("<control>", {"type": "CONTROL"}))
        if spec.get("image_upload"):
            slots.append(("<upload>", {"type": "UPLOAD"}))
    return slots


def check_widget(node_type: str, name: str, spec: dict, value) -> str | None:
    kind = spec["type"]
    if kind == "CONTROL":
        return None if value in ("fixed", "increment", "decrement", "randomize") else f"bad control {value!r}"
    if kind == "UPLOAD":
        return None if value == "image" else f"bad upload slot {value!r}"
    if kind == DYNAMIC_COMBO:  # the table lists its option keys
        return None if value in spec["options"] else f"{name}={value!r} not in {spec['options']}"
    if kind == "COMBO":
        if not isinstance(value, (str, int)):
            return f"{name}: combo value {value!r}"
        opts = spec.get("options")
        return None if opts is None or value in opts else f"{name}={value!r} not in {opts}"
    if kind == "INT" and (not isinstance(value, int) or isinstance(value, bool)):
        return f"{name}: {value!r} is not an int"
    if kind == "FLOAT" and not isinstance(value, (int, float)):
        return f"{name}: {value!r} is not a number"
    if kind == "BOOLEAN" and not isinstance(value, bool):
        return f"{name}: {value!r} is not a boolean"
    if kind == "STRING" and not isinstance(value, str):
        return f"{name}: {value!r} is not a string"
    if kind in ("INT", "FLOAT"):
        if "min" in spec and value < spec["min"] or "max" in spec and value > spec["max"]:
            return f"{name}={value} outside [{spec.get('min')}, {spec.get('max')}]"
    return None


def validate_workflow(wf: dict) -> list[str]:
    errors = []
    if wf.get("version") != 0.4:
        errors.append(f"version {wf.get('version')!r}, expected 0.4")
    nodes = {n["id"]: n for n in wf["nodes"]}
    has_output = False
    for node in wf["nodes"]:
        t = node["type"]
        if t in UI_ONLY:
            continue
        sig = SIGNATURES.get(t)
        if sig is None:
            errors.append(f"node {node['id']}: unknown type {t}")
            continue
        has_output |= sig["output_node"]
        slots = widget_names(sig)
        values = node.get("widgets_values", [])
        if len(values) != len(slots):  # the frontend assigns values to widgets by position
            errors.append(f"{t} #{node['id']}: {len(values)} widget values for {len(slots)} widgets")
        for (name, spec), value in zip(slots, values):
            err = check_widget(t, name, spec, value)
            if err:
                errors.append(f"{t} #{node['id']}: {err}")
        linked = {i["name"] for i in node.get("inputs", []) if i.get("link") is not None}
        for name in sig["input_order"]:
            spec = sig["inputs"][name]
            if (spec["type"] not in WIDGET_TYPES or spec.get("force_input")) and not spec["optional"] and name not in linked:
                errors.append(f"{t} #{node['id']}: required input {name} is not connected")
        if [o["type"] for o in node.get("outputs", [])] != sig["outputs"]:
            errors.append(f"{t} #{node['id']}: outputs {[o['type'] for o in node['outputs']]} != {sig['outputs']}")
    for link_id, src, src_slot, dst, dst_slot, ltype in wf["links"]:
        s, d = nodes.get(src), nodes.get(dst)
        if s is None or d is None or s["type"] not in SIGNATURES or d["type"] not in SIGNATURES:
            errors.append(f"link {link_id}: missing or unknown node")
            continue
        out_type = SIGNATURES[s["type"]]["outputs"][src_slot]
        in_name = d["inputs"][dst_slot]["name"]
        in_type = SIGNATURES[d["type"]]["inputs"][in_name]["type"]
        if d["inputs"][dst_slot].get("link") != link_id or link_id not in s["outputs"][src_slot]["links"]:
            errors.append(f"link {link_id}: node slots do not reference it")
        if not (out_type == in_type == ltype):
            errors.append(f"link {link_id}: {s['type']}[{src_slot}] {out_type} -> {d['type']}.{in_name} "
                          f"{in_type} (link says {ltype})")
    if not has_output:
        errors.append("no output node")
    return errors


def test_workflows_are_shipped():
    names = {p.name for p in WORKFLOWS}
    assert {"seedvr2_video_decode_tiled.json", "qwen_image_t2i_turbovae.json",
            "tiled_encode_decode_roundtrip.json"} <= names


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.stem for p in WORKFLOWS])
def test_workflow_is_valid(path):
    wf = json.loads(path.read_text())
    assert validate_workflow(wf) == []
    assert any(n["type"].startswith("TurboVAE") for n in wf["nodes"])


def test_validator_catches_broken_workflows():
    wf = json.loads((ROOT / "workflows" / "tiled_encode_decode_roundtrip.json").read_text())
    broken = json.loads(json.dumps(wf))
    dec = next(n for n in broken["nodes"] if n["type"] == "TurboVAETiledDecode")
    dec["widgets_values"][3] = "fastest"  # invalid mode
    dec["widgets_values"][0] = 99999  # above max
    broken["links"][0][5] = "LATENT"  # IMAGE link mislabelled
    errors = validate_workflow(broken)
    assert any("mode='fastest'" in e for e in errors)
    assert any("tile_size=99999" in e for e in errors)
    assert any(e.startswith("link 1:") for e in errors)
    broken["nodes"][0]["type"] = "VAEDecodeTiledTypo"
    assert any("unknown type VAEDecodeTiledTypo" in e for e in validate_workflow(broken))
