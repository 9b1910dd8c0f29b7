"""Model Explorer itself opens a graphc `.gir` through graphc's adapter: its server is started
with the extension (as `model-explorer FILE.gir --extensions=graphc.tools.model_explorer`
does) and its page is loaded in headless Chromium; the page's graph info names the graph and
counts its nodes. Skips, saying why, without the explorer extra, Playwright or a Chromium."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from graphc.ir.printer import format_graph
from graphc.tools.model_explorer import explorer_graphs
from tests.viewer_support import chromium, training_step

SERVER = """
import sys
from model_explorer import config, visualize_from_config
visualize_from_config(config().add_model_from_path(sys.argv[1]), port=int(sys.argv[2]),
                      extensions=["graphc.tools.model_explorer"], no_open_in_browser=True)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_model_explorer_opens_a_gir_file(tmp_path):
    pytest.importorskip("model_explorer", reason="ai-edge-model-explorer is not installed "
                                                 "(pip install 'graphc[explorer]')")
    playwright = pytest.importorskip("playwright.sync_api",
                                     reason="playwright is not installed (the viewer-test extra)")
    executable = chromium()
    if executable is None:
        pytest.skip("no Chromium found (apt-get install chromium, or set GRAPHC_CHROMIUM)")
    graph = training_step()
    gir = tmp_path / "step.gir"
    gir.write_text(format_graph(graph) + "\n")
    leaves = len(explorer_graphs(graph)["graphs"][0]["nodes"])
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(gir), str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait(f"http://127.0.0.1:{port}/check_health", 90)
        data = urllib.parse.quote(json.dumps({"models": [{"url": str(gir)}]}))
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(f"http://127.0.0.1:{port}/?data={data}")
                page.wait_for_function(  # the graph info panel, from the adapter's graph
                    "() => document.body.innerText.includes('@step')", timeout=60_000)
                body = page.inner_text("body")
                assert f"{leaves} nodes" in body and "fused nodes" in body
                assert "Error" not in body
            finally:
                browser.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
