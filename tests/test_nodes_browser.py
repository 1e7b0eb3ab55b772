"""Every shipped workflow in ComfyUI's own web page, in headless Chromium: no missing node, every widget
shows the workflow's value (a valid one, except the model files a user supplies), no node covers another,
no dialog; a screenshot of each.

Skipped like tests/test_nodes_comfyui.py (whose server fixture it uses) unless TURBOVAE_COMFYUI names a
ComfyUI checkout, and also without Playwright's Python package or a Chromium (TURBOVAE_CHROMIUM, default
Debian's /usr/bin/chromium; `apt-get install chromium`, `pip install playwright`; nothing is downloaded):

    TURBOVAE_COMFYUI=/path/to/ComfyUI TURBOVAE_SCREENSHOTS=docs/images python -m pytest -q tests/test_nodes_browser.py

Screenshots go to TURBOVAE_SCREENSHOTS (the README's and docs/nodes.md's come from there), else pytest's
tmp dir. Checked with ComfyUI 0.8.0 (frontend 1.35.9) and Chromium 150, and ComfyUI 0.33.0 (frontend 1.58.1)
and Chromium 156 on CPU, about 35 s.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from test_nodes_comfyui import REPO, _newer_core_nodes, comfy, load_workflow  # noqa: F401  (comfy: the server fixture)

pytestmark = pytest.mark.slow  # a real ComfyUI server or browser: the full tier (README)

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright to drive a browser")
CHROMIUM = Path(os.environ.get("TURBOVAE_CHROMIUM", "/usr/bin/chromium"))
if not CHROMIUM.is_file():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set TURBOVAE_CHROMIUM)",
                allow_module_level=True)

# a closed network: no background connections, no first-run UI (as the machine's own browser probe starts it)
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1600, "height": 1000}
# user settings for the page: no template browser on first start, no minimap in the pictures, and node text
# drawn at the zoom that fits a whole workflow
SETTINGS = {"Comfy.TutorialCompleted": True, "Comfy.Minimap.Visible": False,
            "LiteGraph.Canvas.LowQualityRenderingZoomThreshold": 0.1}
# combos whose value is a model file the user places (the server test places only the VAE files)
USER_FILES = {("UNETLoader", "unet_name"), ("CLIPLoader", "clip_name"), ("TurboVAELoadEngine", "engine")}
WORKFLOWS = sorted(p.stem for p in (REPO / "workflows").glob("*.json"))

STATE_JS = """() => {
  const T = window.LiteGraph.NODE_TITLE_HEIGHT, types = window.LiteGraph.registered_node_types;
  const nodes = window.app.graph._nodes.map(n => ({
    id: n.id, type: n.type, registered: n.type in types,
    box: [n.pos[0], n.pos[1] - T, n.size[0], n.size[1] + T],
    widgets: (n.widgets || []).map(w => ({name: w.name, type: w.type, value: w.value,
                                         options: w.options && Array.isArray(w.options.values) ? w.options.values : null})),
  }));
  const dialogs = Array.from(document.querySelectorAll('.p-dialog')).filter(d => d.offsetParent !== null)
    .map(d => d.innerText.slice(0, 300));
  const saved = Object.fromEntries(window.app.graph.serialize().nodes.map(n => [n.id, n.widgets_values || []]));
  return {nodes, dialogs, saved};
}"""


def overlaps(nodes: list[dict]) -> list[tuple[str, str]]:
    out = []
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            (ax, ay, aw, ah), (bx, by, bw, bh) = a["box"], b["box"]
            if ax < bx + bw and bx < ax + aw and ay < by + bh and by < ay + ah:
                out.append((f"{a['id']}:{a['type']}", f"{b['id']}:{b['type']}"))
    return out


@pytest.fixture(scope="module")
def page(comfy):  # noqa: F811
    comfy.request("/api/settings", SETTINGS)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport=VIEWPORT)
            tab.goto(comfy.url + "/", wait_until="domcontentloaded")
            tab.wait_for_function("() => window.app && window.app.graph && window.LiteGraph", timeout=120_000)
            yield tab
        finally:
            browser.close()


@pytest.mark.parametrize("name", WORKFLOWS)
def test_shipped_workflow_renders_in_the_browser(page, comfy, name, tmp_path):  # noqa: F811
    wf = load_workflow(name)
    needs = {n["type"] for n in wf["nodes"]} & _newer_core_nodes()
    if not needs <= set(comfy.object_info()):
        pytest.skip(f"this ComfyUI lacks {sorted(needs)} (core's native SeedVR2 nodes; docs/nodes.md)")
    page.evaluate("async ([wf, name]) => { await window.app.loadGraphData(wf, true, true, name); }", [wf, name])
    page.evaluate("() => window.app.extensionManager.command.execute('Comfy.Canvas.FitView')")
    page.wait_for_timeout(500)  # one frame after fitting
    state = page.evaluate(STATE_JS)
    nodes = {str(n["id"]): n for n in state["nodes"]}  # frontend 1.58 holds node ids as strings, 1.35 as numbers

    assert sorted(nodes) == sorted(str(n["id"]) for n in wf["nodes"]), "nodes were dropped or added on load"
    assert [n["type"] for n in state["nodes"] if not n["registered"]] == [], "missing node types"
    problems = []
    for node in wf["nodes"]:  # saving the page's graph gives back every widget value the workflow set
        saved = state["saved"][str(node["id"])]
        if saved != node.get("widgets_values", []):
            problems.append(f"{node['type']} #{node['id']}: the page holds {saved}, the workflow has "
                            f"{node.get('widgets_values')}")
        for w in nodes[str(node["id"])]["widgets"]:
            if w["options"] is not None and w["value"] not in w["options"] and (node["type"], w["name"]) not in USER_FILES:
                problems.append(f"{node['type']} #{node['id']}: {w['name']}={w['value']!r} is not one of its options")
    assert problems == []
    assert overlaps(state["nodes"]) == [], "nodes cover each other"
    assert state["dialogs"] == [], "a dialog opened (missing nodes or models?)"

    folder = Path(os.environ.get("TURBOVAE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"workflow_{name}.png"))
