"""One notebook of the browser pass (:mod:`.browser`): open it in JupyterLab, *Run All*, check
that no cell shows an error, press the arrow keys on every slider of every live widget (each move
timed from the key press to the new picture on screen, :func:`lab.timed_key`), and check that the
first widget's picture and readouts change. Records and screenshots go to
``artifacts/browser/<notebook>/``."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

from . import lab

__all__ = ["KEYS_PER_SLIDER", "MIN_MOVES_PER_WIDGET", "RUN_ALL_TIMEOUT_S", "STAGES",
           "check_notebook", "add_moves"]

KEYS_PER_SLIDER = 4
#: a widget with few sliders gets more presses on each: at least this many in all
MIN_MOVES_PER_WIDGET = 12
RUN_ALL_TIMEOUT_S = 600


def _changed_pixels(before: bytes, after: bytes) -> int:
    import numpy as np
    from PIL import Image

    a, b = (np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)
            for png in (before, after))
    return a.size if a.shape != b.shape else int((np.abs(a - b).sum(axis=-1) > 0).sum())


STAGES = (("latencies_ms", "decoded"), ("swapped_ms", "swapped"), ("shown_ms", "shown"))
FLOOR_STAGES = (("floor_ms", "decoded"), ("floor_swapped_ms", "swapped"),
                ("floor_shown_ms", "shown"))


def add_moves(record: dict, moves: list[dict], stages=STAGES) -> None:
    """Append timed moves to ``record``'s lists: ``swapped_ms`` (to the new PNG in the page),
    ``latencies_ms`` (decoded) and ``shown_ms`` (on screen, the judged one)."""
    for name, stage in stages:
        record.setdefault(name, []).extend(round(m[stage], 2) for m in moves)


def _move_every_slider(page, widget, keys: int, min_moves: int = 0,
                       after_first=None) -> tuple[list[dict], int]:
    """Arrow-key presses on every slider of ``widget``: ``keys`` each, or more where the widget
    has few sliders (``min_moves`` presses in all). A slider at its end turns back, so no press
    is lost to an end stop. ``after_first()`` is called once the first move's picture is on
    screen. Returns the timed moves and the number of presses that brought no new picture within
    the timeout."""
    moves, inert = [], 0
    handles = widget.locator(".widget-slider .noUi-handle")
    count = handles.count()
    presses = max(keys, -(-min_moves // count)) if count else 0
    for h in range(count):
        handle = handles.nth(h)
        handle.click()
        key = "ArrowRight"
        for _ in range(presses):
            value = handle.get_attribute("aria-valuenow")
            if value == handle.get_attribute("aria-valuemax"):
                key = "ArrowLeft"
            elif value == handle.get_attribute("aria-valuemin"):
                key = "ArrowRight"
            stages = lab.timed_key(page, key)
            if stages is None:
                inert += 1
                continue
            moves.append(stages)
            if after_first is not None and len(moves) == 1:
                after_first()
    return moves, inert


def check_notebook(browser, base: str, token: str, name: str, shots: Path, *,
                   keys: int = KEYS_PER_SLIDER, run_timeout_s: float = RUN_ALL_TIMEOUT_S,
                   page=None, before_close=None) -> dict:
    """Run All in ``name``, check it and time every slider of every widget; returns the record
    ``{"notebook", "run_all_s", "widgets", "latencies_ms", "checks": {name: bool}, "problems"}``.
    With ``page`` (JupyterLab open in it, :func:`lab.open_lab`) the notebook is opened and closed
    there, as a learner goes from one notebook to the next, and its kernel is shut down in the
    background; without, in a page of its own. ``before_close()`` runs once the moves are done,
    the notebook still open and its kernel idle (the floor's moves between notebooks)."""
    shots.mkdir(parents=True, exist_ok=True)
    record = {"notebook": Path(name).stem, "run_all_s": None, "widgets": 0, "latencies_ms": [],
              "swapped_ms": [], "shown_ms": [], "inert_presses": 0, "phases_s": {},
              "checks": {"every cell ran, none shows an error": False,
                         "a slider move changes the first widget's picture": False,
                         "...and its readouts, entropy included": False},
              "problems": []}
    checks, phases = record["checks"], record["phases_s"]
    clock = [time.monotonic()]

    def phase(what: str) -> None:   # seconds spent in each step, to see where a pass goes
        now = time.monotonic()
        phases[what] = round(phases.get(what, 0.0) + now - clock[0], 2)
        clock[0] = now

    context = None
    if page is None:
        context = browser.new_context(viewport={"width": 1500, "height": 1100})
        page = context.new_page()
    try:
        if context is None:
            lab.open_in_lab(page, name)
        else:
            lab.open_notebook(page, base, token, name)
        phase("open")
        seconds, not_run = lab.run_all(page, run_timeout_s)
        record["run_all_s"] = round(seconds, 1)
        phase("run_all")
        page.screenshot(path=str(shots / "after_run_all.png"), full_page=True)
        errors = lab.error_outputs(page)
        checks["every cell ran, none shows an error"] = not errors and not not_run
        record["problems"] += [f"a cell shows an error:\n{text[:2000]}" for text in errors[:1]]
        if not_run:
            record["problems"].append(f"{len(not_run)} code cells did not run (Run All stopped)")
        images = page.locator(".jp-OutputArea-output img.widget-image")
        record["widgets"] = images.count()
        if not record["widgets"]:
            record["problems"].append("no live widget (an ipywidgets Image) after Run All")
        elif not page.locator(".jp-OutputArea-output .attn-readouts").count():
            record["problems"].append("no attention widget (with readouts) after Run All")
        checked = False        # the first attention widget (one with readouts) is checked
        for w in range(record["widgets"]):
            image = images.nth(w)
            widget = image.locator("xpath=ancestor::div[contains(@class, 'widget-vbox')][1]")
            if not widget.count():     # a picture with no controls (a live loss curve): no moves
                continue
            phase("checks")
            widget.scroll_into_view_if_needed()
            lab.wait(lambda image=image: image.evaluate("i => i.complete && i.naturalWidth > 0"),
                     20, "the widget's image to load")
            lab.watch_picture(image)
            check = not checked and widget.locator(".attn-readouts").count() > 0
            after_first = None
            if check:
                checked = True
                readouts = widget.locator(".attn-readouts")
                before_png, before_text = image.screenshot(), readouts.inner_text()
                widget.screenshot(path=str(shots / "widget_before.png"))

                def after_first(image=image, widget=widget, readouts=readouts,
                                before_png=before_png, before_text=before_text):
                    """The first widget's picture and readouts after one move."""
                    changed = _changed_pixels(before_png, image.screenshot())
                    checks["a slider move changes the first widget's picture"] = changed > 0
                    after_text = readouts.inner_text()
                    checks["...and its readouts, entropy included"] = (
                        after_text != before_text and "entropy" in after_text)
                    widget.screenshot(path=str(shots / "widget_after.png"))
                    record.update(changed_pixels=changed, readouts_before=before_text,
                                  readouts_after=after_text)
            moves, inert = _move_every_slider(page, widget, keys, MIN_MOVES_PER_WIDGET,
                                              after_first)
            add_moves(record, moves)
            record["inert_presses"] += inert
            phase("moves")
    except Exception as error:  # noqa: BLE001 - reported as the notebook's problem
        record["problems"].append(f"{type(error).__name__}: {error}")
    finally:
        phase("checks")
        if before_close is not None:
            before_close()
            phase("floor")
        if context is not None:
            context.close()
        else:
            try:
                lab.close_notebooks(page)
                phase("close_page")
            except Exception as error:  # noqa: BLE001 - a fresh JupyterLab for the next one
                record["problems"].append(f"closing it: {type(error).__name__}: {error}"[:300])
                lab.open_lab(page, base, token)
        lab.shut_down_kernels(base, token, keep=lab.FLOOR_NOTEBOOK, background=context is None)
        phase("close")
    (shots / "summary.json").write_text(json.dumps(record, indent=1))
    return record
