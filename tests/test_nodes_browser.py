"""Every shipped workflow in ComfyUI's own web page, in headless Chromium: no missing node, every widget
shows the workflow's value (a valid one, except the model files a user supplies), no node covers another,
no dialog; a screenshot of each.

Skipped like tests/test_nodes_comfyui.py (whose server fixture it uses) unless TURBOVAE_COMFYUI names a
ComfyUI checkout, and also without Playwright's Python package or a Chromium (TURBOVAE_CHROMIUM, default
Debian's /usr/bin/chromium; `apt-get install chromium`, `pip install playwright`; nothing is downloaded):

    TURBOVAE_COMFYUI=/path/to/ComfyUI TURBOVAE_SCREENSHOTS=docs/images python -m pytest -q tests/test_nodes_browser.py

Screenshots go to TURBOVAE_SCREENSHOTS (the README's and docs/nodes.md's come from there), else pytest's
tmp dir. Each shows only the workflow's nodes and links, framed to their bounding box with a small margin (the
side bar, menus, tabs and toasts hidden), drawn at a device scale factor of 2 and a zoom that keeps the picture
at most 880 CSS px wide (what GitHub shows of a README image): at most 100 %, and not below 70 %, so node titles
and widget values stay legible at that width. A graph too wide for that is wrapped for the picture only: its
columns of nodes (cut where no node spans) are laid in rows, in order, the links following; the workflow file
keeps its one row. Checked with ComfyUI 0.8.0 (frontend 1.35.9) and Chromium 150, ComfyUI 0.33.0 (frontend
1.58.1) and Chromium 156, and ComfyUI 0.19.3 (frontend 1.58.1) and Chromium 150 on CPU, about 45 s.
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
DEVICE_SCALE = 2  # screenshots at twice the CSS pixels: crisp text when GitHub shows them 880 px wide
# user settings for the page: no template browser on first start, no minimap or render info in the pictures,
# and node text drawn at any zoom a picture uses
SETTINGS = {"Comfy.TutorialCompleted": True, "Comfy.Minimap.Visible": False, "Comfy.Graph.CanvasInfo": False,
            "LiteGraph.Canvas.LowQualityRenderingZoomThreshold": 0.1}
# the framing of a screenshot: picture width in CSS px (GitHub shows README images at most ~880 px wide),
# the zoom range that keeps node titles and widget values legible there, margin and row gap (CSS px, graph units)
PICTURE_WIDTH, MAX_ZOOM, MIN_ZOOM, MARGIN, ROW_GAP, BADGE_HEIGHT = 880, 1.0, 0.7, 16, 60, 20
# only the canvas and the widgets the frontend lays over it (text boxes, notes) are drawn in a screenshot
ONLY_THE_GRAPH_CSS = ("body * { visibility: hidden !important; } "
                      "#graph-canvas, .dom-widget, .dom-widget * { visibility: visible !important; }")
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


def bounds(boxes: list[list[float]]) -> tuple[float, float, float, float]:
    """left, top, right, bottom of [x, y, w, h] boxes."""
    return (min(b[0] for b in boxes), min(b[1] for b in boxes),
            max(b[0] + b[2] for b in boxes), max(b[1] + b[3] for b in boxes))


def picture_layout(nodes: list[dict], max_width: float) -> dict[str, list[float]]:
    """Where each node's box goes in the picture (graph units): as it is when the graph is at most max_width
    wide, else its columns (runs of nodes cut where no node spans) laid in rows of at most max_width, in
    order, each row's columns keeping their gaps and heights; every node keeps its place inside its column."""
    boxes = {str(n["id"]): n["box"] for n in nodes}
    left, top, right, _ = bounds(list(boxes.values()))
    if right - left <= max_width:
        return boxes
    columns: list[list[str]] = []
    reach = None
    for nid in sorted(boxes, key=lambda i: boxes[i][0]):
        x, _, w, _ = boxes[nid]
        if reach is None or x >= reach:
            columns.append([])
        columns[-1].append(nid)
        reach = max(reach or x + w, x + w)
    rows: list[list[list[str]]] = [[]]
    for col in columns:
        trial = [i for c in rows[-1] + [col] for i in c]
        l, _, r, _ = bounds([boxes[i] for i in trial])
        if rows[-1] and r - l > max_width:
            rows.append([])
        rows[-1].append(col)
    placed, y = {}, top
    for row in rows:
        ids = [i for c in row for i in c]
        l, t, _, b = bounds([boxes[i] for i in ids])
        for i in ids:
            x0, y0, w, h = boxes[i]
            placed[i] = [x0 - l + left, y0 - t + y, w, h]
        y += b - t + ROW_GAP
    return placed


def screenshot_of_the_graph(page, nodes: list[dict], path: Path) -> tuple[int, int]:
    """Save a picture of only the graph's nodes and links, framed to their bounding box (module docstring);
    returns its size in CSS px."""
    layout = picture_layout(nodes, (PICTURE_WIDTH - 2 * MARGIN) / MIN_ZOOM)
    left, top, right, bottom = bounds(list(layout.values()))
    top -= BADGE_HEIGHT  # a node's source badge is drawn above its title
    zoom = max(MIN_ZOOM, min(MAX_ZOOM, (PICTURE_WIDTH - 2 * MARGIN) / (right - left)))
    width = round((right - left) * zoom + 2 * MARGIN)
    height = round((bottom - top) * zoom + 2 * MARGIN)
    page.set_viewport_size({"width": max(VIEWPORT["width"], width), "height": max(VIEWPORT["height"], height)})
    page.wait_for_timeout(300)  # the canvas follows the window's size
    page.evaluate("""([moves, zoom, ox, oy]) => {
      const T = window.LiteGraph.NODE_TITLE_HEIGHT;
      for (const n of window.app.graph._nodes) { const m = moves[String(n.id)]; n.pos = [m[0], m[1] + T]; }
      const ds = window.app.canvas.ds;
      ds.scale = zoom; ds.offset[0] = ox; ds.offset[1] = oy;
      window.app.canvas.setDirty(true, true);
    }""", [layout, zoom, MARGIN / zoom - left, MARGIN / zoom - top])
    style = page.add_style_tag(content=ONLY_THE_GRAPH_CSS)
    try:
        page.wait_for_timeout(500)  # a few frames: the canvas and the widgets over it drawn at their places
        page.screenshot(path=str(path), clip={"x": 0, "y": 0, "width": width, "height": height})
    finally:
        style.evaluate("el => el.remove()")
        page.set_viewport_size(VIEWPORT)
    return width, height


@pytest.fixture(scope="module")
def page(comfy):  # noqa: F811
    comfy.request("/api/settings", SETTINGS)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport=VIEWPORT, device_scale_factor=DEVICE_SCALE)
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
    width, height = screenshot_of_the_graph(page, state["nodes"], folder / f"workflow_{name}.png")
    assert width <= PICTURE_WIDTH, f"the picture is {width} CSS px wide"
