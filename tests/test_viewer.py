"""The interactive HTML viewer: its view model, the page, its script under node, and the page
in a real headless Chromium driven by Playwright (search, expand, collapse, labels fit)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from graphc.ir import parse
from graphc.ir.export import LINE_CHARS
from graphc.tools.viewer import node_regions, render_html, view_model
from graphc.tools.viewer_assets import CORE_JS
from tests.viewer_support import chromium, fused_graph, training_step


@pytest.fixture(scope="module")
def step_graph():
    return training_step()


# ---- the view model ---------------------------------------------------------------------------
def test_fused_body_is_a_collapsed_group_of_its_instructions():
    model = view_model(fused_graph())
    groups = {g["id"]: g for g in model["groups"]}
    assert groups["n0"]["kind"] == "fused" and groups["n0"]["collapsed"]
    assert groups["n0"]["lines"][0] == "fused(add, relu)"
    parents = {n["id"]: n["parent"] for n in model["nodes"]}
    assert parents["n0.0"] == parents["n0.1"] == "n0"
    assert parents["n1"] == parents["n2"] == "group:1"  # the `group` attribute
    edges = {(e["src"], e["dst"]) for e in model["edges"]}
    # the body's inputs come from the graph inputs, its output goes to the users of %0
    assert {("in0", "n0.0"), ("in1", "n0.0"), ("n0.0", "n0.1"), ("n0.1", "n1"),
            ("n0.1", "out1")} <= edges


def test_regions_from_backward_locations_and_from_source_lines(step_graph):
    assert node_regions(fused_graph()) == ["forward", "forward", "forward", "backward"]
    # a traced training step: the forward call, loss.backward() and opt.step() lines
    regions = node_regions(step_graph)
    assert len(set(regions)) == 3 and None not in regions
    one_line = parse("graph @f(%x: f32[3]) -> (f32[3]) {\n  %0: f32[3] = exp(%x)  # a.py:1\n"
                     "  %1: f32[3] = neg(%0)  # a.py:1\n  return (%1)\n}")
    assert node_regions(one_line) == [None, None]
    one_line.meta["regions"] = ["forward", "optimizer"]
    assert node_regions(one_line) == ["forward", "optimizer"]
    assert {g["id"] for g in view_model(one_line)["groups"]} == {"region:forward",
                                                                   "region:optimizer"}


def test_every_label_line_fits_the_width(step_graph):
    model = view_model(step_graph)
    lines = [line for item in model["nodes"] + model["groups"] for line in item["lines"]]
    assert max(len(line) for line in lines) <= LINE_CHARS
    adam = [g for g in model["groups"] if g["kind"] == "fused" and g["size"] > 30]
    assert adam and adam[0]["lines"][2].startswith("\u2026 +")  # long op lists are cut...
    assert "fused[body=" in adam[0]["text"]  # ...and the whole IR line is the tooltip


def test_search_index_names_ops_values_and_lines(step_graph):
    model = view_model(step_graph)
    node = next(n for n in model["nodes"] if n["defines"] == ["27"])
    assert node["id"].startswith("n1.") and "gt" in node["find"] and "%27" in node["find"]


def test_page_is_self_contained(tmp_path, step_graph):
    path = tmp_path / "step.html"
    page = render_html(step_graph, path)
    assert path.read_text(encoding="utf-8") == page
    # nothing fetched: no external script, style, link, image or font
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "<link" not in page
    data = re.search(r'<script type="application/json" id="graphc-data">(.*?)</script>', page,
                     re.S).group(1)
    assert json.loads(data)["name"] == "step"


# ---- the layout and search script, under node ------------------------------------------------
NODE_DRIVER = """
const {graphcCore} = require(process.argv[2]);
const data = JSON.parse(require('fs').readFileSync(process.argv[3], 'utf8'));
const core = graphcCore(data, () => ({charW: 7.2, lineH: 15}));
function snapshot() {
  const vis = core.visibleGraph(), placed = core.layout(vis);
  return {ids: vis.ids, edges: vis.edges,
          boxes: Object.fromEntries([...placed.box].map(([k, b]) => [k, b])),
          layers: placed.layers};
}
const out = {collapsed: snapshot()};
out.search = core.search('%27');
out.groups = core.search('fused(matmul, add');
out.ops = core.search('matmul');
out.revealed = core.reveal(out.search[0]);
out.expanded = snapshot();
core.collapsed.clear();
for (const g of data.groups) core.collapsed.add(g.id);
out.allCollapsed = snapshot();
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None,
                    reason="node is not installed: the viewer's layout script is not run")
def test_layout_script_under_node(tmp_path, step_graph):
    core = tmp_path / "core.js"
    core.write_text(CORE_JS)
    model = tmp_path / "model.json"
    model.write_text(json.dumps(view_model(step_graph)))
    driver = tmp_path / "driver.js"
    driver.write_text(NODE_DRIVER)
    proc = subprocess.run(["node", str(driver), str(core), str(model)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for view in (out["collapsed"], out["expanded"], out["allCollapsed"]):
        boxes = view["boxes"]
        assert sorted(boxes) == sorted(view["ids"])
        for row in view["layers"]:  # boxes of a layer do not overlap
            for a, b in zip(row, row[1:]):
                assert boxes[a]["x"] + boxes[a]["w"] / 2 < boxes[b]["x"] - boxes[b]["w"] / 2
        for e in view["edges"]:  # the graph is acyclic: every edge points down
            assert boxes[e["src"]]["y"] < boxes[e["dst"]]["y"]
    # fused groups start collapsed; searching a value inside one expands it
    assert "n1" in out["collapsed"]["ids"] and "n1.4" not in out["collapsed"]["ids"]
    assert out["search"] == ["n1.4"] and out["revealed"]
    # a fused group's label is found as the group, its instructions are not listed again
    assert out["groups"] == ["n1", "n3"]
    assert {"n1", "n3", "n11"} <= set(out["ops"])
    assert not [i for i in out["ops"] if i.split(".")[0] in ("n1", "n3", "n11") and "." in i]
    assert "n1.4" in out["expanded"]["ids"] and "n1" not in out["expanded"]["ids"]
    # all collapsed: the three regions and the graph's inputs and outputs
    regions = [i for i in out["allCollapsed"]["ids"] if i.startswith("region:")]
    assert len(regions) == 3
    assert len(out["allCollapsed"]["ids"]) < len(out["collapsed"]["ids"])


# ---- the page in a headless browser -----------------------------------------------------------
def _browser():
    playwright = pytest.importorskip(
        "playwright.sync_api",
        reason="playwright is not installed (pip install 'graphc[viewer-test]'): "
               "the page is not tested in a browser")
    executable = chromium()
    if executable is None:
        pytest.skip("no Chromium found (apt-get install chromium, or set GRAPHC_CHROMIUM): "
                    "the page is not tested in a browser")
    return playwright, executable


LABELS_FIT = """() => {
  const bad = [];
  for (const g of document.querySelectorAll('#nodes .node')) {
    const box = g.querySelector('rect.box').getBBox();
    const text = g.querySelector('text').getBBox();
    if (text.x < box.x - 0.5 || text.x + text.width > box.x + box.width + 0.5 ||
        text.y < box.y - 0.5 || text.y + text.height > box.y + box.height + 0.5)
      bad.push(g.getAttribute('data-id'));
  }
  return bad;
}"""


def test_page_in_headless_chromium(tmp_path, step_graph):
    playwright, executable = _browser()
    path = tmp_path / "step.html"
    render_html(step_graph, path)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.goto(path.as_uri())
            assert page.locator('#nodes .node.group[data-id="n1"]').count() == 1
            assert page.locator('#nodes .node[data-id="n1.4"]').count() == 0
            assert page.evaluate(LABELS_FIT) == []

            # search a value defined inside the fused group n1: the group opens, the node
            # that defines it is marked and centred
            page.fill("#search", "%27")
            page.press("#search", "Enter")
            current = page.locator('#nodes .node.current')
            assert current.count() == 1 and current.get_attribute("data-id") == "n1.4"
            assert page.locator('#clusters .cluster[data-id="n1"]').count() == 1
            assert page.inner_text("#count") == "1 of 1"
            box = current.bounding_box()
            centre = (box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            canvas = page.locator("#canvas").bounding_box()
            assert abs(centre[0] - (canvas["x"] + canvas["width"] / 2)) < 5
            assert abs(centre[1] - (canvas["y"] + canvas["height"] / 2)) < 5
            assert "%27" in page.inner_text("#details")
            assert page.evaluate(LABELS_FIT) == []
            page.screenshot(path=str(tmp_path / "viewer.png"))
            if os.environ.get("GRAPHC_SCREENSHOT_DIR"):  # docs/images/viewer.png comes from here
                page.screenshot(path=os.path.join(os.environ["GRAPHC_SCREENSHOT_DIR"],
                                                  "viewer.png"))

            # collapse it again from its frame's title, then a region from the group tree
            page.locator('#clusters .cluster[data-id="n1"] text').dispatch_event("click")
            assert page.locator('#nodes .node[data-id="n1.4"]').count() == 0
            assert page.locator('#nodes .node.group[data-id="n1"]').count() == 1
            before = page.locator("#nodes .node").count()
            page.click('#groups .toggle[data-id^="region:"] >> nth=2')
            assert page.locator("#nodes .node").count() < before
            assert page.locator('#nodes .node.group[data-id^="region:"]').count() == 1

            # zoom with the wheel changes the scale; fit brings the graph into view
            k = page.evaluate("() => window.graphcViewer.view().k")
            page.mouse.move(600, 400)
            page.mouse.wheel(0, -300)
            assert page.evaluate("() => window.graphcViewer.view().k") > k
            page.click("#fit")
            page.keyboard.press("Escape")  # clears the search and its marks
            assert page.locator("#nodes .node.match").count() == 0
            assert page.input_value("#search") == ""
            assert errors == []
        finally:
            browser.close()
    assert (tmp_path / "viewer.png").read_bytes()[:4] == b"\x89PNG"


def test_a_large_graph_opens_collapsed():
    inputs = ", ".join(f"%x{i}: f32[2]" for i in range(13))
    body = [f"  %{i}: f32[2] = exp(%x{i % 13})  # a.py:{1 + i % 2}" for i in range(401)]
    text = f"graph @big({inputs}) -> (f32[2]) {{\n" + "\n".join(body) + "\n  return (%0)\n}"
    groups = {g["id"]: g for g in view_model(parse(text))["groups"]}
    assert groups["io:inputs"]["collapsed"] and groups["io:inputs"]["size"] == 13
    assert "io:outputs" not in groups  # one output: shown as it is
    assert groups["region:a.py:1"]["collapsed"] and groups["region:a.py:1"]["size"] == 201
    assert groups["region:a.py:2"]["lines"] == ["a.py:2", "200 nodes"]


def test_viewing_doc_examples_run():
    """The `>>>` examples of docs/viewing.md run and print what they say."""
    import doctest
    import pathlib
    import textwrap

    text = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "viewing.md").read_text()
    text = "\n".join("" if line.startswith("```") else line for line in text.splitlines())
    test = doctest.DocTestParser().get_doctest(textwrap.dedent(text), {}, "viewing.md",
                                               "viewing.md", 0)
    assert test.examples
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    runner.run(test)
    assert runner.failures == 0, f"{runner.failures} example(s) in docs/viewing.md failed"


def test_inputs_and_updates_group_by_module(step_graph):
    groups = {g["id"]: g for g in view_model(step_graph)["groups"]}
    assert not groups["io:inputs"]["collapsed"]  # its module groups are
    layer = groups["io:inputs/model.0"]
    assert layer["collapsed"] and layer["kind"] == "module"
    assert layer["lines"] == ["model.0", "8 values"]  # weight, bias, and Adam's 3 states of each
    assert groups["io:outputs/model.2"]["lines"][0] == "model.2 \u2190"
    parents = {n["id"]: n["parent"] for n in view_model(step_graph)["nodes"]}
    assert parents["in0"] == "io:inputs"  # %x belongs to no module
