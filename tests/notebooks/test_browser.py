"""End to end, as a learner: every notebook in JupyterLab, in headless Chromium.

For each notebook (found by glob, so new notebooks are covered without editing this file):
open it in JupyterLab, run all cells, wait for the kernel to go idle, check that no cell shows an
error, find the first live widget, move one of its sliders with the keyboard as a user would, and
check that the widget's image changed (pixel difference) and its readouts, entropy included,
updated. Screenshots before and after the move go to ``artifacts/browser/`` (or
``$BROWSER_ARTIFACTS``), which CI keeps.

Needs Chromium (Debian's ``chromium`` package, at /usr/bin/chromium or ``$CHROMIUM``) and
Playwright for Python (in requirements.txt; its own browser download is not used). Without
Chromium the test skips with the reason, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ARTIFACTS = Path(os.environ.get("BROWSER_ARTIFACTS", ROOT / "artifacts" / "browser"))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
]
RUN_ALL_TIMEOUT_S = 300
IN_CI = os.environ.get("CI", "").lower() == "true"

pytestmark = pytest.mark.browser


def _missing_requirements() -> list[str]:
    missing = []
    if not (Path(CHROMIUM).exists() and os.access(CHROMIUM, os.X_OK)):
        missing.append(f"Chromium not found at {CHROMIUM} (install Debian's 'chromium' package "
                       "or set $CHROMIUM)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("Playwright for Python is not installed (pip install -r requirements.txt)")
    return missing


@pytest.fixture(scope="module")
def browser():
    missing = _missing_requirements()
    if missing:
        reason = "; ".join(missing)
        if IN_CI:
            pytest.fail(f"CI=true but the browser test cannot run: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(browser, tmp_path_factory):
    """JupyterLab on loopback, a free port and a random token, over a copy of the notebooks."""
    home = tmp_path_factory.mktemp("lab")
    workdir = home / "notebooks"
    shutil.copytree(ROOT / "notebooks", workdir)
    settings = home / "settings" / "@jupyterlab"
    (settings / "apputils-extension").mkdir(parents=True)
    (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    # render every cell (no windowing), so every prompt and output is in the page
    (settings / "notebook-extension").mkdir(parents=True)
    (settings / "notebook-extension" / "tracker.jupyterlab-settings").write_text(
        json.dumps({"windowingMode": "none"}))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = open(ARTIFACTS / "jupyterlab.log", "w")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
         f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={workdir}",
         "--ServerApp.allow_root=True"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            log.close()
            pytest.fail(f"JupyterLab did not start; see {ARTIFACTS / 'jupyterlab.log'}")
        time.sleep(0.5)
    yield base, token
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


def _pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)


def _changed_pixels(before: bytes, after: bytes) -> int:
    a, b = _pixels(before), _pixels(after)
    if a.shape != b.shape:
        return a.size
    return int((np.abs(a - b).sum(axis=-1) > 0).sum())


def _wait_until(condition, timeout_s: float, what: str, interval_s: float = 0.25):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _run_all_cells(page) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator('.lm-Menu-item[data-command="runmenu:run-all"]').click()


def _prompts(page) -> list[str]:
    """The input prompts of the code cells: '[ ]:' not run, '[*]:' running, '[3]:' done."""
    return [t.strip() for t in page.locator(".jp-CodeCell .jp-InputPrompt").all_text_contents()]


def _all_done(page) -> bool:
    """Every code cell ran (cells with a hidden source show no prompt) and the kernel is idle."""
    prompts = [p for p in _prompts(page) if p]
    return (bool(prompts) and all(re.fullmatch(r"\[\d+\]:", p) for p in prompts)
            and _kernel_idle(page))


def _started(page) -> bool:
    return any(p and p != "[ ]:" for p in _prompts(page))


def _kernel_idle(page) -> bool:
    status = page.locator("#jp-main-statusbar").inner_text()
    return "| Idle" in status


def _shut_down_kernels(base: str, token: str) -> None:
    """Stop every kernel of the server, so notebooks do not compete for the CPU."""
    with urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=10) as response:
        sessions = json.load(response)
    for session in sessions:
        request = urllib.request.Request(
            f"{base}/api/sessions/{session['id']}?token={token}", method="DELETE")
        urllib.request.urlopen(request, timeout=20).close()


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_its_first_widget_responds(notebook, lab, browser):
    base, token = lab
    shots = ARTIFACTS / notebook.stem
    shots.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    page = context.new_page()
    try:
        # a workspace of its own, reset: only this notebook is open
        page.goto(f"{base}/lab/workspaces/{notebook.stem}/tree/{notebook.name}"
                  f"?token={token}&reset")
        page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=60_000)
        _wait_until(lambda: _kernel_idle(page), 60, "the kernel to start")
        started = time.monotonic()
        for _attempt in range(3):  # a click before the kernel is connected can be lost
            _run_all_cells(page)
            try:
                _wait_until(lambda: _started(page), 20, "the first cell to start")
                break
            except AssertionError:
                continue
        _wait_until(lambda: _all_done(page), RUN_ALL_TIMEOUT_S,
                    f"{notebook.name} to finish running", interval_s=1.0)
        run_seconds = time.monotonic() - started
        page.screenshot(path=str(shots / "after_run_all.png"))

        errors = page.locator(".jp-OutputArea-output[data-mime-type="
                              "'application/vnd.jupyter.stderr']")
        error_texts = [t for t in errors.all_text_contents()
                       if "Error" in t or "Traceback" in t]
        assert not error_texts, f"{notebook.name}: a cell shows an error:\n{error_texts[0][:2000]}"

        image = page.locator(".jp-OutputArea-output img.widget-image").first
        image.wait_for(timeout=30_000)
        widget = image.locator("xpath=ancestor::div[contains(@class, 'widget-vbox')][1]")
        widget.scroll_into_view_if_needed()
        _wait_until(lambda: image.evaluate("img => img.complete && img.naturalWidth > 0"), 20,
                    "the widget's image to load")
        readouts = widget.locator(".attn-readouts")
        before_png = image.screenshot()
        before_text = readouts.inner_text()
        widget.screenshot(path=str(shots / "widget_before.png"))

        # Move the sliders one at a time, as a user would, until the picture changes (a slider
        # can be inert in the current state, e.g. the window size while the mask is "padding").
        handles = widget.locator(".widget-slider .noUi-handle")
        assert handles.count() > 0, f"{notebook.name}: the first widget has no slider"
        changed, moved = 0, []
        for index in range(handles.count()):
            handle = handles.nth(index)
            handle.click()
            key = "ArrowLeft" if (handle.get_attribute("aria-valuenow")
                                  == handle.get_attribute("aria-valuemax")) else "ArrowRight"
            for _ in range(6):
                page.keyboard.press(key)
            moved.append(handle.get_attribute("aria-valuenow"))
            try:
                changed = _wait_until(lambda: _changed_pixels(before_png, image.screenshot()), 10,
                                      "the heatmap image to change after the slider move")
                break
            except AssertionError:
                continue
        assert changed, f"{notebook.name}: no slider move changed the picture (values {moved})"
        _wait_until(lambda: readouts.inner_text() != before_text, 20, "the readouts to update")
        widget.screenshot(path=str(shots / "widget_after.png"))
        after_text = readouts.inner_text()
        assert "entropy" in after_text, f"{notebook.name}: the widget shows no entropy readout"
        (shots / "summary.json").write_text(json.dumps({
            "notebook": notebook.name, "run_all_seconds": round(run_seconds, 1),
            "changed_pixels": changed, "readouts_before": before_text,
            "readouts_after": after_text,
        }, indent=1))
    finally:
        context.close()
        _shut_down_kernels(base, token)
