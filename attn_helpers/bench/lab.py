"""Plumbing of ``bench browser``: a learner's plain ``jupyter lab`` on loopback over a copy of the
notebooks, Debian's Chromium through Playwright, and the page helpers (Run All, a timed key press)."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
FLOOR_NOTEBOOK = "_floor.ipynb"

# The floor: a bare slider swapping precomputed PNGs the size of a widget's picture.
FLOOR_SOURCE = """\
import io
import ipywidgets as widgets
import numpy as np
from matplotlib.figure import Figure

frames = []
for i in range(16):
    fig = Figure(figsize=(9.6, 5.4), dpi=80)
    fig.subplots().imshow(np.random.default_rng(i).random((24, 24)), vmin=0, vmax=1)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    frames.append(buffer.getvalue())
slider = widgets.IntSlider(0, min=0, max=len(frames) - 1, description="frame")
image = widgets.Image(value=frames[0], format="png")
slider.observe(lambda change: setattr(image, "value", frames[change["new"]]), names="value")
widgets.VBox([slider, image])
"""

# For a widget's <img>: ms from the last keydown to its src swapped, decoded, and on screen (the
# next animation frame). Event driven: nothing polls.
PROBE = """
(img) => {
  const a = window.__attn = window.__attn || {key: 0, waiter: null};
  if (!window.__attnKeys) {
    window.__attnKeys = true;
    document.addEventListener('keydown', e => { a.key = e.timeStamp; }, true);
  }
  if (img.__attnObserved) return;
  img.__attnObserved = true;
  new MutationObserver(() => {
    const key = a.key, swapped = performance.now();
    img.decode().catch(() => null).then(() => {
      const decoded = performance.now();
      requestAnimationFrame(() => {
        const shown = performance.now(), waiter = a.waiter;
        if (waiter && key === a.key) {
          a.waiter = null;
          waiter({swapped: swapped - key, decoded: decoded - key, shown: shown - key});
        }
      });
    });
  }).observe(img, {attributes: true, attributeFilter: ['src']});
}
"""
_ARM = "() => { const a = window.__attn; a.next = new Promise(r => { a.waiter = r; }); }"
_AWAIT = ("t => Promise.race([window.__attn.next, "
          "new Promise(r => setTimeout(() => { window.__attn.waiter = null; r(null); }, t))])")
_ARIA = "h => ['aria-valuenow', 'aria-valuemin', 'aria-valuemax'].map(a => h.getAttribute(a))"


def wait(condition, timeout_s: float, what: str, interval_s: float = 0.25):
    """Poll ``condition()`` until it returns something truthy, or raise ``TimeoutError``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@contextmanager
def lab_server(notebooks_dir: Path, log_path: Path):
    """JupyterLab over a copy of ``notebooks_dir`` and the floor notebook, on 127.0.0.1 with a
    random token: yields ``(base_url, token)``."""
    with tempfile.TemporaryDirectory() as home:
        home = Path(home)
        shutil.copytree(notebooks_dir, home / "notebooks")
        (home / "notebooks" / FLOOR_NOTEBOOK).write_text(json.dumps({
            "cells": [{"cell_type": "code", "execution_count": None, "id": "floor",
                       "metadata": {}, "outputs": [], "source": FLOOR_SOURCE}],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                        "name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}))
        for name, value in (("apputils-extension/notification", {"fetchNews": "false"}),  # no toast
                            ("notebook-extension/tracker", {"kernelShutdown": True})):  # close stops it
            path = home / "settings" / "@jupyterlab" / f"{name}.jupyterlab-settings"
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps(value))
        token, runtime = secrets.token_hex(16), home / "runtime"
        env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
                   JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), JUPYTER_RUNTIME_DIR=str(runtime))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w") as log:
            server = subprocess.Popen(
                [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                 "--ServerApp.port=0", f"--IdentityProvider.token={token}",
                 f"--ServerApp.root_dir={home / 'notebooks'}", "--ServerApp.allow_root=True",
                 "--LabApp.expose_app_in_browser=True"],   # window.jupyterapp
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=home / "notebooks")
            try:
                def up() -> str | None:    # the server writes its port once it listens
                    if server.poll() is not None:
                        raise RuntimeError(f"JupyterLab exited; see {log_path}")
                    try:
                        port = json.loads(next(runtime.glob("jpserver-*.json")).read_text())["port"]
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}",
                                                    timeout=2):
                            return f"http://127.0.0.1:{port}"
                    except (StopIteration, ValueError, KeyError, OSError):   # not yet
                        return None

                yield wait(up, 90, "JupyterLab to answer", 0.5), token
            finally:
                server.terminate()
                try:
                    server.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    server.kill()


def missing() -> list[str]:
    """What the browser pass needs and this machine lacks (Chromium, Playwright for Python)."""
    lacking = []
    if not (Path(CHROMIUM).exists() and os.access(CHROMIUM, os.X_OK)):
        lacking.append(f"Chromium not found at {CHROMIUM} (install Debian's 'chromium' package "
                       "or set $CHROMIUM)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        lacking.append("Playwright for Python is not installed (pip install -r requirements.txt)")
    return lacking


@contextmanager
def chromium():
    """Headless Chromium (Debian's, not Playwright's download) through Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync"])
        try:
            yield browser
        finally:
            browser.close()


def _idle(page) -> bool:
    return "| Idle" in page.locator("#jp-main-statusbar").inner_text()


def _prompts(page) -> list[str]:
    """The code cells' prompts: '[ ]:' not run, '[*]:' running, '[3]:' done."""
    return [t.strip() for t in page.locator(".jp-CodeCell .jp-InputPrompt").all_text_contents()
            if t.strip()]


def open_lab(page, base: str, token: str, ready: bool = True) -> None:
    """JupyterLab in ``page``, an empty workspace (``ready=False``: :func:`lab_ready` waits)."""
    page.goto(f"{base}/lab/workspaces/{secrets.token_hex(4)}?token={token}&reset",
              wait_until="commit")
    if ready:
        lab_ready(page)


def lab_ready(page) -> None:
    page.wait_for_function("() => window.jupyterapp !== undefined", timeout=60_000)
    page.evaluate("() => jupyterapp.started.then(() => jupyterapp.restored).then(() => null)")


def open_in_lab(page, name: str) -> None:
    """Open ``name`` in the JupyterLab of ``page`` and wait for its kernel."""
    page.evaluate("path => { jupyterapp.commands.execute('docmanager:open', "
                  "{path, factory: 'Notebook'}); }", name)
    page.locator(".jp-NotebookPanel .jp-Cell").first.wait_for(timeout=60_000)
    wait(lambda: _idle(page), 60, "the kernel to start", interval_s=0.1)


def close_notebooks(page) -> None:
    """Close every notebook in ``page`` without saving (no dialog); their kernels shut down."""
    page.evaluate("""() => {
      for (const widget of Array.from(jupyterapp.shell.widgets('main'))) {
        if (widget.context) { widget.context.model.dirty = false; }
        widget.close();
      }
    }""")
    page.locator(".jp-NotebookPanel").first.wait_for(state="detached", timeout=30_000)


def run_all(page, timeout_s: float, upto: int | None = None) -> tuple[float, list[str]]:
    """Run all cells (or up to index ``upto``) and wait until the kernel is idle with nothing
    queued; returns the seconds and the prompts of cells not run."""
    started = time.monotonic()
    for _attempt in range(3):  # a command before the kernel is connected can be lost
        page.evaluate("""i => {
          const notebook = jupyterapp.shell.currentWidget.content, commands = jupyterapp.commands;
          if (i === null) return void commands.execute('notebook:run-all-cells');
          notebook.activeCellIndex = i;
          commands.execute('notebook:run-all-above').then(() => {
            notebook.activeCellIndex = i;
            return commands.execute('notebook:run-cell');
          });
        }""", upto)
        try:
            wait(lambda: any(p != "[ ]:" for p in _prompts(page)), 20, "Run All to start")
            break
        except TimeoutError:
            continue
    quiet = [0]

    def finished() -> bool:   # idle, nothing queued or running, on three polls in a row
        quiet[0] = quiet[0] + 1 if _idle(page) and "[*]:" not in _prompts(page) else 0
        return quiet[0] >= 3

    wait(finished, timeout_s, "Run All to finish", interval_s=0.2)
    return (time.monotonic() - started,
            [p for p in _prompts(page) if not re.fullmatch(r"\[\d+\]:", p)])


def error_outputs(page) -> list[str]:
    """The texts of the page's error outputs (a traceback, or stderr naming an error)."""
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    return [t for t in errors.all_text_contents() if "Error" in t or "Traceback" in t]


def press_keys(page, image, handle, presses: int, after_first=None) -> tuple[list[dict], int]:
    """``presses`` arrow keys on a slider ``handle`` (turning at its ends), each timed to ``image``'s
    new picture (``{"swapped", "decoded", "shown"}`` ms); returns the moves and the number of
    presses with no picture within 3 s. ``after_first()`` runs after the first move."""
    image.evaluate(PROBE)
    handle.click()
    moves, inert, key = [], 0, "ArrowRight"
    for _ in range(presses):
        now, low, high = handle.evaluate(_ARIA)
        key = "ArrowLeft" if now == high else "ArrowRight" if now == low else key
        page.evaluate(_ARM)
        page.keyboard.press(key)
        stages = page.evaluate(_AWAIT, 3000)
        if stages is None:
            inert += 1
            continue
        moves.append({k: round(v, 2) for k, v in stages.items()})
        if after_first is not None and len(moves) == 1:
            after_first()
    return moves, inert
