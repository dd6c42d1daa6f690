"""End to end, as a learner: every notebook in JupyterLab in headless Chromium, in ONE pass that is
also the speed benchmark's (:mod:`attn_helpers.bench.browser`): run up to its last widget, no cell
shows an error, every slider moved, the first widget's picture and readouts change. Screenshots and
timings go to ``artifacts/browser/`` (``$BROWSER_ARTIFACTS``); ``bench browser --check --results``
judges the timings, these tests assert no time. Without Chromium or Playwright they skip, except
under ``CI=true``, where they fail."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import NOTEBOOKS

from attn_helpers.bench import browser as bench_browser
from attn_helpers.bench import lab

ARTIFACTS = Path(os.environ.get("BROWSER_ARTIFACTS", bench_browser.ARTIFACTS))

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser_pass() -> dict:
    """The one pass over every notebook: ``{"floor": [move, ...], "notebooks": [record, ...]}``."""
    if missing := lab.missing():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but the browser test cannot run: {'; '.join(missing)}")
        pytest.skip("; ".join(missing))
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
