"""``python -m attn_helpers bench browser [notebooks...] [--check]``: every notebook as a learner
meets it, checked and timed in one pass of JupyterLab in headless Chromium.

JupyterLab runs on loopback (a free port, a random token, a copy of the notebooks), started as a
plain ``jupyter lab`` is, Debian's Chromium driven by Playwright (see :mod:`.lab`).

* **The floor**: a bare ipywidgets slider that swaps precomputed PNGs in an ``ipywidgets.Image``,
  what any widget costs on this machine, browser, server and kernel included. Its page stays
  open for the whole pass: :data:`FLOOR_MOVES` moves first, then :data:`FLOOR_MOVES_BETWEEN`
  after each notebook's moves (that notebook still open, its kernel idle), so that the floor is
  sampled at the same moments as the notebooks on a machine whose load changes (CI runners,
  other jobs). Each notebook is judged against **the floor around it**: the floor's moves just
  before and just after its own (``floor_marks`` in the record; over one CI pass, run alone, the
  floor rose from 36 ms in its first moves to about 60 ms), or the whole pass's floor when fewer than
  :data:`MIN_LOCAL_FLOOR` of those moves were recorded (an older record, lost moves).
* **Every notebook**, one after the other in one JupyterLab page, as a learner goes through the
  course (JupyterLab's default windowing: every cell in the page, off-screen ones skipped by
  layout and paint): *Run All*; no cell may show an error; then every slider of every live widget
  gets :data:`KEYS_PER_SLIDER` arrow-key presses, more where a widget has few sliders
  (:data:`MIN_MOVES_PER_WIDGET` in all), turning back at the slider's end. After the first move
  the first widget's picture must have changed (pixel difference) and its readouts, entropy
  included, too. Then the notebook is closed and its kernel shut down (in the background).
  Screenshots (after Run All, the first widget before and after) and ``summary.json`` (with the
  seconds each step took, ``phases_s``) go to ``artifacts/browser/<notebook>/``.

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
to the median of the floor around it; writes every record to ``artifacts/browser/results.json``.
Exits 1 when a check fails (an error, a picture or readout that did not change); with
``--check`` also when a notebook's median is over :data:`MAX_RATIO` times the floor around it
(with ``--confirm``, only when a pass of its own, with its own floor, confirms the miss).
Nothing is compared with a fixed
number of milliseconds: machines differ by 3x and more. ``--results FILE`` re-judges a recorded
pass (``tests/notebooks/test_browser.py`` records one) without starting a browser.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from . import lab
from .browser_notebook import FLOOR_STAGES, KEYS_PER_SLIDER, add_moves, check_notebook
from .widget import summarize

__all__ = ["MAX_RATIO", "KEYS_PER_SLIDER", "Floor", "browser_pass", "check_notebook", "judged",
           "local_floor", "measure_floor", "verdict", "main"]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
MAX_RATIO = 2.0
FLOOR_MOVES = 20
FLOOR_MOVES_BETWEEN = 12
MIN_LOCAL_FLOOR = 8   # floor moves around a notebook needed to judge it by them


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
        context = browser.new_context(viewport={"width": 1500, "height": 1100})
        page = context.new_page()     # one JupyterLab for every notebook, as a learner has
        lab.open_lab(page, base, token, wait=False)   # loads while the floor starts
        floor = Floor(browser, base, token)
        try:
            lab.lab_ready(page)
            add_moves(results, floor.move(FLOOR_MOVES), FLOOR_STAGES)
            report(f"{'floor':>24}: {len(results['floor_ms'])} moves, median on screen "
                   f"{summarize(judged(results, floor=True))['median_ms']} ms")
            results["setup_s"] = round(time.monotonic() - started, 1)
            results["floor_marks"] = [len(results["floor_ms"])]   # where each segment ends
            for name in names:
                def floor_moves(name=name) -> None:   # the floor between the notebooks
                    try:
                        add_moves(results, floor.move(FLOOR_MOVES_BETWEEN), FLOOR_STAGES)
                    except Exception as error:  # noqa: BLE001 - the first moves still judge
                        results.setdefault("floor_problems", []).append(
                            f"after {Path(name).stem}: {type(error).__name__}: {error}"[:300])

                record = check_notebook(browser, base, token, name, artifacts / Path(name).stem,
                                        keys=keys, page=page, before_close=floor_moves)
                results["floor_marks"].append(len(results["floor_ms"]))
                results["notebooks"].append(record)
                report(_line(record, None))
        finally:
            context.close()
            floor.close()
            for thread in threading.enumerate():   # kernels still shutting down
                if thread.name == "shut-down-kernels":
                    thread.join(timeout=30)
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


def _line(record: dict, floor: float | None, which: str = "the floor") -> str:
    failed = [name for name, ok in record["checks"].items() if not ok]
    text = f"{record['notebook']:>24}: {len(record['latencies_ms']):3d} moves"
    if judged(record):
        s = summarize(judged(record))
        text += f", median {s['median_ms']:6.1f} ms, p90 {s['p90_ms']:6.1f} ms"
        if floor:
            text += f", {s['median_ms'] / floor:4.2f}x {which} ({floor:.1f} ms)"
        text += _stages(record.get("swapped_ms"), record.get("latencies_ms"))
    if record.get("inert_presses"):
        text += f" ({record['inert_presses']} presses brought no new picture)"
    text += f"; Run All {record['run_all_s']} s"
    return text + (f"; FAILED: {'; '.join(failed)}" if failed else "; checks pass")


def local_floor(results: dict, index: int) -> list[float]:
    """The judged floor moves just before and just after notebook ``index``'s moves (``[]`` for a
    record without ``floor_marks``)."""
    marks = results.get("floor_marks")
    if not marks or index + 1 >= len(marks):
        return []
    start = marks[index - 1] if index > 0 else 0
    return judged(results, floor=True)[start:marks[index + 1]]


def verdict(results: dict) -> tuple[bool, bool, str]:
    """``(checks pass, ratios met, text)`` for a pass: every notebook's checks, and every
    notebook's median at most :data:`MAX_RATIO` times the floor around it (the whole pass's floor
    when too few moves were recorded around it; a notebook with no timed move does not meet it).
    The notebooks that miss the ratio are listed in ``results["missed"]``."""
    results["missed"] = []
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
    for index, record in enumerate(results["notebooks"]):
        around = local_floor(results, index)
        near = summarize(around)["median_ms"] if len(around) >= MIN_LOCAL_FLOOR else None
        lines.append(_line(record, near or (floor and floor["median_ms"]),
                           "the floor around it" if near else "the pass's floor"))
        lines += [f"{'':>26}{problem.splitlines()[0][:300]}" for problem in record["problems"]]
        checks_ok &= all(record["checks"].values()) and not record["problems"]
        median = summarize(judged(record))["median_ms"] if judged(record) else None
        met = (bool(floor) and median is not None
               and median <= MAX_RATIO * (near or floor["median_ms"]))
        ratios_ok &= met
        if not met:
            results.setdefault("missed", []).append(record["notebook"])
    lines.append(f"checks (every cell ran without error, the first widget's picture and readouts "
                 f"change): {'pass' if checks_ok else 'FAIL'}")
    lines.append(f"speed: every notebook's median at most {MAX_RATIO:g}x the floor around it: "
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
    parser.add_argument("--confirm", action="store_true",
                        help="with --check: measure the notebooks that miss the ratio once more, "
                             "in a pass of their own, and fail only if one misses it again")
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
    if checks_ok and not ratios_ok and args.check and args.confirm:
        missed = [f"{name}.ipynb" for name in results["missed"]]
        print(f"over {MAX_RATIO:g}x the floor around it: {', '.join(missed)}; measured once more, "
              "in a pass of their own", file=sys.stderr, flush=True)
        again = browser_pass(missed, keys=args.keys, lab_args=tuple(args.lab_arg),
                             artifacts=ARTIFACTS / "confirm",
                             report=lambda line: print(line, file=sys.stderr, flush=True))
        checks_ok, ratios_ok, text = verdict(again)
        print(text, file=sys.stderr)
    return 0 if checks_ok and (ratios_ok or not args.check) else 1


if __name__ == "__main__":
    raise SystemExit(main())
