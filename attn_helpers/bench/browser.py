"""``python -m attn_helpers bench browser [notebooks...] [--check]``: every notebook as a learner
meets it, checked and timed in one pass of JupyterLab in headless Chromium.

JupyterLab runs on loopback (a free port, a random token, a copy of the notebooks), started as a
plain ``jupyter lab`` is, Debian's Chromium driven by Playwright (see :mod:`.lab`).

* **The floor**: a bare ipywidgets slider that swaps precomputed PNGs in an ``ipywidgets.Image``,
  what any widget costs on this machine, browser, server and kernel included. Its page stays
  open for the whole pass: :data:`FLOOR_MOVES` moves first, then :data:`FLOOR_MOVES_BETWEEN`
  after each notebook, so that the floor is sampled at the same moments as the notebooks on a
  machine whose load changes (CI runners, other jobs).
* **Every notebook**: *Run All*; no cell may show an error; then every slider of every live widget
  gets :data:`KEYS_PER_SLIDER` arrow-key presses. The first widget's picture must change (pixel
  difference) and its readouts, entropy included, must update. Screenshots (after Run All, the
  first widget before and after) and ``summary.json`` go to ``artifacts/browser/<notebook>/``.

**How a move is timed**, identically for the floor and every widget, in the page
(:data:`lab.PROBE`), from the ``keydown`` time stamp: a ``MutationObserver`` sees the ``<img>``'s
``src`` swapped (``swapped_ms``: the kernel's PNG arrived), ``img.decode()`` resolves
(``latencies_ms``: decoded), and the first animation frame after that shows it (``shown_ms``: on
screen). The judged latency is **on screen**, what the learner sees; the other two are printed
beside it. Chromium draws at a fixed 60 Hz, also headless, so on-screen times come a frame apart
in bins; the next key is pressed only once the last picture is on screen (moves never queue), and
the floor's moves are sampled between the notebooks' (the same machine load). The wait for the
picture is event driven (no polling by animation frames).

Prints the floor and, per notebook, the median and p90 of its moves and the ratio of its median
to the floor's; writes every record to ``artifacts/browser/results.json``. Exits 1 when a check
fails (an error, a picture or readout that did not change); with ``--check`` also when a
notebook's median is over :data:`MAX_RATIO` times the floor. Nothing is compared with a fixed
number of milliseconds: machines differ by 3x and more. ``--results FILE`` re-judges a recorded
pass (``tests/notebooks/test_browser.py`` records one) without starting a browser.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

from . import lab
from .widget import summarize

__all__ = ["MAX_RATIO", "KEYS_PER_SLIDER", "Floor", "browser_pass", "check_notebook", "judged",
           "measure_floor", "verdict", "main"]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
MAX_RATIO = 2.0
KEYS_PER_SLIDER = 4
FLOOR_MOVES = 20
FLOOR_MOVES_BETWEEN = 6
RUN_ALL_TIMEOUT_S = 600


def _changed_pixels(before: bytes, after: bytes) -> int:
    import numpy as np
    from PIL import Image

    a, b = (np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)
            for png in (before, after))
    return a.size if a.shape != b.shape else int((np.abs(a - b).sum(axis=-1) > 0).sum())


class Floor:
    """The floor notebook, open in a page of its own for the whole pass, so that its moves can be
    taken between the notebooks' (the same moments of a machine whose load changes)."""

    def __init__(self, browser, base: str, token: str):
        self.context = browser.new_context(viewport={"width": 1500, "height": 1100})
        self.page = self.context.new_page()
        self.moves: list[dict] = []
        lab.open_notebook(self.page, base, token, lab.FLOOR_NOTEBOOK)
        _, not_run = lab.run_all(self.page, 120)
        if not_run:
            raise RuntimeError(f"the floor notebook did not run: {lab.error_outputs(self.page)}")
        image = self.page.locator(".jp-OutputArea-output img.widget-image").first
        image.wait_for(timeout=30_000)
        lab.watch_picture(image)
        self.handle = self.page.locator(".widget-slider .noUi-handle").first
        self.key = "ArrowRight"

    def move(self, count: int) -> list[dict]:
        """``count`` presses on the floor's slider (right to its end, then left, and so on)."""
        self.handle.click()
        taken = []
        for _ in range(count):
            value = self.handle.get_attribute("aria-valuenow")
            if value == self.handle.get_attribute("aria-valuemax"):
                self.key = "ArrowLeft"
            elif value == self.handle.get_attribute("aria-valuemin"):
                self.key = "ArrowRight"
            stages = lab.timed_key(self.page, self.key)
            if stages is not None:
                taken.append(stages)
        self.moves += taken
        return taken

    def close(self) -> None:
        self.context.close()


def measure_floor(browser, base: str, token: str, moves: int = FLOOR_MOVES) -> list[float]:
    """Milliseconds from key press to new picture decoded for ``moves`` presses on the floor's
    slider, in a page opened and closed for them."""
    floor = Floor(browser, base, token)
    try:
        return [m["decoded"] for m in floor.move(moves)]
    finally:
        floor.close()
        lab.shut_down_kernels(base, token)


def _move_every_slider(page, widget, keys: int) -> list[dict]:
    moves = []
    handles = widget.locator(".widget-slider .noUi-handle")
    for h in range(handles.count()):
        handle = handles.nth(h)
        handle.click()
        key = ("ArrowLeft" if handle.get_attribute("aria-valuenow")
               == handle.get_attribute("aria-valuemax") else "ArrowRight")
        for _ in range(keys):
            stages = lab.timed_key(page, key)
            if stages is not None:
                moves.append(stages)
    return moves


def check_notebook(browser, base: str, token: str, name: str, shots: Path, *,
                   keys: int = KEYS_PER_SLIDER, run_timeout_s: float = RUN_ALL_TIMEOUT_S) -> dict:
    """Run All in ``name``, check it and time every slider of every widget; returns the record
    ``{"notebook", "run_all_s", "widgets", "latencies_ms", "checks": {name: bool}, "problems"}``."""
    shots.mkdir(parents=True, exist_ok=True)
    record = {"notebook": Path(name).stem, "run_all_s": None, "widgets": 0, "latencies_ms": [],
              "swapped_ms": [], "shown_ms": [],
              "checks": {"every cell ran, none shows an error": False,
                         "a slider move changes the first widget's picture": False,
                         "...and its readouts, entropy included": False},
              "problems": []}
    checks = record["checks"]
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    page = context.new_page()
    try:
        lab.open_notebook(page, base, token, name)
        seconds, not_run = lab.run_all(page, run_timeout_s)
        record["run_all_s"] = round(seconds, 1)
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
            widget.scroll_into_view_if_needed()
            lab.wait(lambda image=image: image.evaluate("i => i.complete && i.naturalWidth > 0"),
                     20, "the widget's image to load")
            lab.watch_picture(image)
            check = not checked and widget.locator(".attn-readouts").count() > 0
            if check:
                readouts = widget.locator(".attn-readouts")
                before_png, before_text = image.screenshot(), readouts.inner_text()
                widget.screenshot(path=str(shots / "widget_before.png"))
            _add_moves(record, _move_every_slider(page, widget, keys))
            if check:
                checked = True
                changed = _changed_pixels(before_png, image.screenshot())
                checks["a slider move changes the first widget's picture"] = changed > 0
                after_text = readouts.inner_text()
                checks["...and its readouts, entropy included"] = (
                    after_text != before_text and "entropy" in after_text)
                widget.screenshot(path=str(shots / "widget_after.png"))
                record.update(changed_pixels=changed, readouts_before=before_text,
                              readouts_after=after_text)
    except Exception as error:  # noqa: BLE001 - reported as the notebook's problem
        record["problems"].append(f"{type(error).__name__}: {error}")
    finally:
        context.close()
        lab.shut_down_kernels(base, token, keep=lab.FLOOR_NOTEBOOK)
    (shots / "summary.json").write_text(json.dumps(record, indent=1))
    return record


STAGES = (("latencies_ms", "decoded"), ("swapped_ms", "swapped"), ("shown_ms", "shown"))
FLOOR_STAGES = (("floor_ms", "decoded"), ("floor_swapped_ms", "swapped"),
                ("floor_shown_ms", "shown"))


def _add_moves(record: dict, moves: list[dict], stages=STAGES) -> None:
    """Append timed moves to ``record``'s lists: ``swapped_ms`` (to the new PNG in the page),
    ``latencies_ms`` (decoded) and ``shown_ms`` (on screen, the judged one)."""
    for name, stage in stages:
        record.setdefault(name, []).extend(round(m[stage], 2) for m in moves)


def browser_pass(names: list[str], *, keys: int = KEYS_PER_SLIDER, artifacts: Path = ARTIFACTS,
                 lab_args: tuple[str, ...] = (), report=print) -> dict:
    """The whole pass: the floor's first :data:`FLOOR_MOVES` moves, then every notebook of
    ``names`` (file names in ``notebooks/``), each followed by :data:`FLOOR_MOVES_BETWEEN` more
    floor moves (the floor's page stays open). Returns ``{"floor_ms": [...], "notebooks":
    [record, ...]}`` and writes it to ``artifacts/results.json``; ``report(line)`` gets a line
    per notebook as it finishes."""
    artifacts.mkdir(parents=True, exist_ok=True)
    results = {"floor_ms": [], "floor_swapped_ms": [], "floor_shown_ms": [], "notebooks": [],
               "lab_args": list(lab_args)}
    started = time.monotonic()
    with lab.chromium() as browser, lab.lab_server(ROOT / "notebooks", artifacts / "jupyterlab.log",
                                                   lab_args) as (base, token):
        floor = Floor(browser, base, token)
        try:
            _add_moves(results, floor.move(FLOOR_MOVES), FLOOR_STAGES)
            report(f"{'floor':>24}: {len(results['floor_ms'])} moves, median on screen "
                   f"{summarize(judged(results, floor=True))['median_ms']} ms")
            for name in names:
                record = check_notebook(browser, base, token, name, artifacts / Path(name).stem,
                                        keys=keys)
                results["notebooks"].append(record)
                report(_line(record, None))
                try:
                    _add_moves(results, floor.move(FLOOR_MOVES_BETWEEN), FLOOR_STAGES)
                except Exception as error:  # noqa: BLE001 - the floor's first moves still judge
                    results.setdefault("floor_problems", []).append(
                        f"after {record['notebook']}: {type(error).__name__}: {error}"[:300])
        finally:
            floor.close()
            lab.shut_down_kernels(base, token)
    results["seconds"] = round(time.monotonic() - started)
    results["server"] = [line.split("] ", 1)[-1] for line in
                         (artifacts / "jupyterlab.log").read_text().splitlines()
                         if "attn_helpers.labserver:" in line][:1]
    (artifacts / "results.json").write_text(json.dumps(results, indent=1))
    return results


def _stages(swapped: list[float] | None, decoded: list[float] | None) -> str:
    """The medians of the other two stages, when recorded (older results have none)."""
    if not swapped or not decoded:
        return ""
    return (f" (PNG in the page {summarize(swapped)['median_ms']:.1f} ms, decoded "
            f"{summarize(decoded)['median_ms']:.1f} ms)")


def judged(record: dict, floor: bool = False) -> list[float]:
    """The judged latencies: on screen (``shown_ms``), or an older record's ``latencies_ms``."""
    shown, other = ("floor_shown_ms", "floor_ms") if floor else ("shown_ms", "latencies_ms")
    return record.get(shown) or record.get(other) or []


def _line(record: dict, floor: float | None) -> str:
    failed = [name for name, ok in record["checks"].items() if not ok]
    text = f"{record['notebook']:>24}: {len(record['latencies_ms']):3d} moves"
    if judged(record):
        s = summarize(judged(record))
        text += f", median {s['median_ms']:6.1f} ms, p90 {s['p90_ms']:6.1f} ms"
        if floor:
            text += f", {s['median_ms'] / floor:4.2f}x the floor"
        text += _stages(record.get("swapped_ms"), record.get("latencies_ms"))
    text += f"; Run All {record['run_all_s']} s"
    return text + (f"; FAILED: {'; '.join(failed)}" if failed else "; checks pass")


def verdict(results: dict) -> tuple[bool, bool, str]:
    """``(checks pass, ratios met, text)`` for a pass: every notebook's checks, and every
    notebook's median at most :data:`MAX_RATIO` times the floor's (a notebook with no timed move
    does not meet it)."""
    floor = summarize(judged(results, floor=True)) if judged(results, floor=True) else None
    lines = [f"server: {(results.get('server') or ['attn_helpers.labserver not loaded'])[0]}",
             f"floor (bare slider swapping a precomputed PNG): {len(results['floor_ms'])} moves, "
             + (f"median {floor['median_ms']:.1f} ms, p90 {floor['p90_ms']:.1f} ms"
                + _stages(results.get("floor_swapped_ms"), results.get("floor_ms"))
                if floor else "NOT measured"),
             "(each move: key press to the new picture on screen, the first animation frame after "
             "img.decode(); PNG in the page and decoded: the earlier stages)"
             if results.get("floor_shown_ms") else
             "(an older record: each move timed as it was recorded)"]
    lines += [f"floor moves lost {problem}" for problem in results.get("floor_problems", [])]
    checks_ok, ratios_ok = bool(results["notebooks"]), floor is not None
    for record in results["notebooks"]:
        lines.append(_line(record, floor and floor["median_ms"]))
        lines += [f"{'':>26}{problem.splitlines()[0][:300]}" for problem in record["problems"]]
        checks_ok &= all(record["checks"].values()) and not record["problems"]
        median = summarize(judged(record))["median_ms"] if judged(record) else None
        ratios_ok &= bool(floor) and median is not None and median <= MAX_RATIO * floor["median_ms"]
    lines.append(f"checks (every cell ran without error, the first widget's picture and readouts "
                 f"change): {'pass' if checks_ok else 'FAIL'}")
    lines.append(f"speed: every notebook's median at most {MAX_RATIO:g}x the floor: "
                 f"{'met' if ratios_ok else 'NOT met'}")
    return checks_ok, ratios_ok, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_helpers bench browser",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", help="notebook files or stems (default: all)")
    parser.add_argument("--keys", type=int, default=KEYS_PER_SLIDER,
                        help="arrow-key presses per slider")
    parser.add_argument("--check", action="store_true",
                        help=f"exit with status 1 also when a notebook's median is over "
                             f"{MAX_RATIO:g}x the floor")
    parser.add_argument("--results", type=Path, metavar="FILE",
                        help="judge a recorded pass (results.json) instead of running one")
    parser.add_argument("--lab-arg", action="append", default=[], metavar="ARG",
                        help="extra JupyterLab argument, e.g. to compare server settings")
    args = parser.parse_args(argv)
    if args.keys < 1:
        parser.error("--keys must be >= 1")
    if args.results is not None:
        if not args.results.exists():
            parser.error(f"--results: no file {args.results}")
        results = json.loads(args.results.read_text())
    else:
        folder = ROOT / "notebooks"
        every = sorted(p.name for p in folder.glob("*.ipynb"))
        chosen = [n for n in every if not args.notebooks
                  or any(n == a or Path(n).stem == Path(a).stem or n.startswith(a)
                         for a in args.notebooks)]
        if not chosen:
            parser.error(f"no notebook matches {args.notebooks}; known: {every}")
        if not Path(lab.CHROMIUM).exists():
            parser.error(f"Chromium not found at {lab.CHROMIUM} (Debian's 'chromium', or set "
                         "$CHROMIUM)")
        results = browser_pass(chosen, keys=args.keys, lab_args=tuple(args.lab_arg),
                               report=lambda line: print(line, file=sys.stderr, flush=True))
    checks_ok, ratios_ok, text = verdict(results)
    print(json.dumps([{"notebook": r["notebook"], "moves": len(judged(r)),
                       **(summarize(judged(r)) if judged(r) else {})}
                      for r in results["notebooks"]]
                     + [{"notebook": "floor", "moves": len(judged(results, floor=True)),
                         **(summarize(judged(results, floor=True)) if results["floor_ms"] else {})}],
                     indent=1))
    print(text, file=sys.stderr)
    return 0 if checks_ok and (ratios_ok or not args.check) else 1


if __name__ == "__main__":
    raise SystemExit(main())
