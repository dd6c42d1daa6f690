"""End to end, as a learner: every notebook in JupyterLab, in headless Chromium, in ONE pass that
is also the speed benchmark's (``python -m attn_helpers bench browser``, :mod:`attn_helpers.bench.
browser`).

The pass (run once for this module, notebooks found by glob, so a new notebook is covered without
editing this file): open each notebook, run its cells up to its last widget (the cells after it
draw no widget and strict nbval runs them twice), check that no cell shows an error, move every
slider of every live widget with the arrow keys, check that the first widget's picture (pixel
difference) and its readouts, entropy included, changed. Screenshots and ``summary.json`` per
notebook go to ``artifacts/browser/<notebook>/`` (or ``$BROWSER_ARTIFACTS``), which CI keeps. The
same pass times each move from the key press to the new picture (decoded, and its stages), and a
bare slider's floor; these tests assert no time: the timings go to ``results.json`` there, and
``python -m attn_helpers bench browser --check --results artifacts/browser/results.json`` (run by
``course.py test`` right after pytest) judges them as same-run ratios.

Needs Chromium (Debian's ``chromium`` package, at /usr/bin/chromium or ``$CHROMIUM``) and
Playwright for Python (in requirements.txt; its own browser download is not used). Without
Chromium the tests skip with the reason, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attn_helpers.bench import browser as bench_browser
from attn_helpers.bench import lab

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ARTIFACTS = Path(os.environ.get("BROWSER_ARTIFACTS", ROOT / "artifacts" / "browser"))
IN_CI = os.environ.get("CI", "").lower() == "true"

pytestmark = pytest.mark.browser


def _missing_requirements() -> list[str]:
    missing = []
    if not (Path(lab.CHROMIUM).exists() and os.access(lab.CHROMIUM, os.X_OK)):
        missing.append(f"Chromium not found at {lab.CHROMIUM} (install Debian's 'chromium' "
                       "package or set $CHROMIUM)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("Playwright for Python is not installed (pip install -r requirements.txt)")
    return missing


@pytest.fixture(scope="module")
def browser_pass() -> dict:
    """The one pass over every notebook: ``{"floor": [move, ...], "notebooks": [record, ...]}``."""
    missing = _missing_requirements()
    if missing:
        reason = "; ".join(missing)
        if IN_CI:
            pytest.fail(f"CI=true but the browser test cannot run: {reason}")
        pytest.skip(reason)
    (ARTIFACTS / "results.json").unlink(missing_ok=True)     # never judge a stale pass
    return bench_browser.browser_pass([p.name for p in NOTEBOOKS], artifacts=ARTIFACTS,
                                      widgets_only=True)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_its_widgets_respond(notebook, browser_pass):
    record = next(r for r in browser_pass["notebooks"] if r["notebook"] == notebook.stem)
    failed = [name for name, ok in record["checks"].items() if not ok]
    assert not failed and not record["problems"], (
        f"{notebook.name}: {'; '.join(failed) or 'a problem'}\n" + "\n".join(record["problems"])
        + f"\n(screenshots: {ARTIFACTS / notebook.stem})")
    assert record["widgets"] >= 1 and record["moves"], (
        f"{notebook.name}: no slider move gave a new picture")


def test_the_pass_recorded_the_floor_and_every_notebook(browser_pass):
    """What ``bench browser --check --results`` needs: the floor and a record per notebook; every
    move's stages in their order (PNG in the page, decoded, on screen)."""
    assert len(browser_pass["floor"]) >= 20
    for move in [*browser_pass["floor"], *(m for r in browser_pass["notebooks"] for m in r["moves"])]:
        assert 0 < move["swapped"] <= move["decoded"] <= move["shown"]
    assert [r["notebook"] for r in browser_pass["notebooks"]] == [p.stem for p in NOTEBOOKS]
    assert (ARTIFACTS / "results.json").exists()
