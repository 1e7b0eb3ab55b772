"""UI-format ComfyUI workflow (version 0.4, what the frontend saves) -> API prompt, using a server's
/object_info. Our own small test helper (tests/test_nodes_comfyui.py), not ComfyUI or frontend code.

What the frontend saves and this module relies on:
- each node's `widgets_values` list follows the node's widget inputs (INT, FLOAT, STRING, BOOLEAN, COMBO) in
  /object_info `input_order` (required, then optional); a widget turned into a linked socket keeps its slot;
- the frontend adds UI-only slots: a `control_after_generate` value ("fixed", "randomize", ...) after an INT
  with that option (or named seed / noise_seed) and an "image" slot after a combo with `image_upload`;
- links are `[id, from_node, from_slot, to_node, to_slot, type]`; the prompt wants `[str(from_node), from_slot]`.

Only what the shipped workflows use is supported: Note / MarkdownNote are dropped and muted nodes (mode 2)
left out; Reroute, PrimitiveNode, bypassed nodes (mode 4), subgraphs and dict-form `widgets_values` raise
`UnsupportedWorkflow` instead of being converted wrongly.
"""

from __future__ import annotations

import copy
from typing import Any, Iterable

NOTE_TYPES = {"Note", "MarkdownNote"}
UNSUPPORTED_TYPES = {"Reroute", "PrimitiveNode"}
# A V3 DynamicCombo (e.g. core's Split SeedVR2 Latent `chunking_mode`): a combo of option keys whose selected option
# may add widgets of its own; the API prompt names those `<combo>.<input>`. Only options without inputs are modelled.
DYNAMIC_COMBO = "COMFY_DYNAMICCOMBO_V3"
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO", DYNAMIC_COMBO}
CONTROL_VALUES = ("fixed", "increment", "decrement", "randomize")
MODE_ALWAYS, MODE_MUTED, MODE_BYPASS = 0, 2, 4


class UnsupportedWorkflow(ValueError):
    """A workflow feature this converter does not model."""


def input_specs(info: dict) -> list[tuple[str, str, dict, bool]]:
    """(name, type, options, optional) of a node's inputs in /object_info order.

    V1 combos (a list of choices as the type) come back as ("COMBO", {"options": [...], ...}) like V3 ones.
    """
    order = info.get("input_order") or {k: list(v) for k, v in info["input"].items()}
    specs = []
    for section in ("required", "optional"):
        for name in order.get(section, []):
            spec = info["input"][section][name]
            kind = spec[0]
            opts = dict(spec[1]) if len(spec) > 1 and isinstance(spec[1], dict) else {}
            if isinstance(kind, list):
                kind, opts = "COMBO", {**opts, "options": kind}
            specs.append((name, kind, opts, section == "optional"))
    return specs


def widget_slots(info: dict) -> list[tuple[str, str, dict]]:
    """The `widgets_values` layout: (input name, type, options); UI-only slots are ("<control>", "CONTROL",
    {}) and ("<upload>", "UPLOAD", {})."""
    slots = []
    for name, kind, opts, _ in input_specs(info):
        if kind not in WIDGET_TYPES or opts.get("forceInput"):  # forceInput: a socket only, no widget
            continue
        slots.append((name, kind, opts))
        if kind == "INT" and (opts.get("control_after_generate") or name in ("seed", "noise_seed")):
            slots.append(("<control>", "CONTROL", {}))
        if opts.get("image_upload"):
            slots.append(("<upload>", "UPLOAD", {}))
    return slots


def check_value(kind: str, opts: dict, value: Any) -> str | None:
    """Why `value` is not valid for a widget of this type/options, or None."""
    if kind == "CONTROL":
        return None if value in CONTROL_VALUES else f"{value!r} is not a control_after_generate value"
    if kind == "UPLOAD":
        return None if value == "image" else f"{value!r} is not the image upload slot"
    if kind == "COMBO":
        options = opts.get("options", [])
        shown = options if len(options) <= 8 else [*options[:8], "..."]
        return None if value in options else f"{value!r} is not one of {shown}"
    if kind == DYNAMIC_COMBO:
        chosen = [o for o in opts.get("options", []) if o.get("key") == value]
        if not chosen:
            return f"{value!r} is not one of {[o.get('key') for o in opts.get('options', [])]}"
        if any(chosen[0].get("inputs", {}).get(section) for section in ("required", "optional")):
            raise UnsupportedWorkflow(f"dynamic combo option {value!r} has inputs of its own; not modelled")
    if kind == "BOOLEAN":
        return None if isinstance(value, bool) else f"{value!r} is not a boolean"
    if kind == "STRING":
        return None if isinstance(value, str) else f"{value!r} is not a string"
    if kind in ("INT", "FLOAT"):
        ok = (int,) if kind == "INT" else (int, float)
        if not isinstance(value, ok) or isinstance(value, bool):
            return f"{value!r} is not {'an int' if kind == 'INT' else 'a number'}"
        if "min" in opts and value < opts["min"] or "max" in opts and value > opts["max"]:
            return f"{value} is outside [{opts.get('min')}, {opts.get('max')}]"
    return None


def _runnable_nodes(workflow: dict) -> list[dict]:
    if workflow.get("definitions", {}).get("subgraphs"):
        raise UnsupportedWorkflow("subgraphs are not supported")
    nodes = []
    for node in workflow["nodes"]:
        if node["type"] in NOTE_TYPES or node.get("mode", MODE_ALWAYS) == MODE_MUTED:
            continue
        if node["type"] in UNSUPPORTED_TYPES:
            raise UnsupportedWorkflow(f"node {node['id']}: {node['type']} is not supported")
        if node.get("mode", MODE_ALWAYS) != MODE_ALWAYS:
            raise UnsupportedWorkflow(f"node {node['id']}: mode {node.get('mode')} (bypass) is not supported")
        if not isinstance(node.get("widgets_values", []), list):
            raise UnsupportedWorkflow(f"node {node['id']}: dict-form widgets_values are not supported")
        nodes.append(node)
    return nodes


def convert(workflow: dict, object_info: dict,
            unchecked: Iterable[tuple[str, str]] = ()) -> tuple[dict[str, dict], list[str]]:
    """The API prompt for `workflow` and the problems found against `object_info`.

    Problems: unknown node types, widget values that are invalid for their input (type, bounds, combo
    options), too many or too few widget values, unconnected required inputs, links whose type differs
    from the output or input they join. `unchecked` lists (node type, input) pairs whose values are not
    checked, e.g. model files the test does not have. An empty list means the prompt is well formed.
    """
    unchecked = set(unchecked)
    links = {link[0]: link for link in workflow["links"]}
    by_id = {node["id"]: node for node in workflow["nodes"]}
    prompt, problems = {}, []
    for node in _runnable_nodes(workflow):
        cls, where = node["type"], f"{node['type']} #{node['id']}"
        info = object_info.get(cls)
        if info is None:
            problems.append(f"{where}: unknown node type")
            continue
        specs = {name: (kind, opts, optional) for name, kind, opts, optional in input_specs(info)}
        linked = {i["name"]: i["link"] for i in node.get("inputs", []) if i.get("link") is not None}
        values = node.get("widgets_values", [])
        slots = widget_slots(info)
        if len(values) != len(slots):
            problems.append(f"{where}: {len(values)} widget values for {len(slots)} widget slots "
                            f"{[s[0] for s in slots]}")
        inputs: dict[str, Any] = {}
        for (name, kind, opts), value in zip(slots, values):
            if name in linked:
                continue  # the socket's link wins over the kept widget value
            err = None if (cls, name) in unchecked else check_value(kind, opts, value)
            if err:
                problems.append(f"{where}: {name}: {err}")
            if not name.startswith("<"):  # UI-only slots are not inputs
                inputs[name] = value
        for name, link_id in linked.items():
            if name not in specs:
                problems.append(f"{where}: linked input {name!r} is not an input of {cls}")
                continue
            _, src_id, src_slot, _, _, link_type = links[link_id]
            outputs = object_info.get(by_id[src_id]["type"], {}).get("output", [])
            src_type = outputs[src_slot] if src_slot < len(outputs) else None
            in_type = specs[name][0]
            if link_type != src_type or in_type not in (link_type, "*"):
                problems.append(f"{where}: link {link_id} {by_id[src_id]['type']}[{src_slot}] {src_type} -> "
                                f"{name} {in_type} is labelled {link_type}")
            inputs[name] = [str(src_id), src_slot]
        for name, (kind, _, optional) in specs.items():
            if not optional and name not in inputs:
                problems.append(f"{where}: required input {name} ({kind}) has no value or link")
        prompt[str(node["id"])] = {"class_type": cls, "inputs": inputs}
    return prompt, problems


def set_widget(workflow: dict, node_type: str, name: str, value: Any, object_info: dict) -> dict:
    """A copy of `workflow` with widget `name` of its only `node_type` node set to `value` (what a user
    changing that widget in the UI saves)."""
    wf = copy.deepcopy(workflow)
    nodes = [n for n in wf["nodes"] if n["type"] == node_type]
    if len(nodes) != 1:
        raise ValueError(f"expected one {node_type} node, found {len(nodes)}")
    names = [slot[0] for slot in widget_slots(object_info[node_type])]
    nodes[0]["widgets_values"][names.index(name)] = value
    return wf
