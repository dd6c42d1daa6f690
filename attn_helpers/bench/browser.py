"""``python -m attn_helpers bench browser [notebooks...] [--check] [--confirm] [--results FILE]``:
each notebook run in JupyterLab in headless Chromium (:mod:`.lab`), checked (no error; the first
widget's picture and readouts change) and every slider moved, timed from key press to picture.
``--check``: each median at most :data:`MAX_RATIO` times the floor moves (a bare slider swapping
PNGs) around it; ``--confirm`` re-measures a miss in a pass of its own, pressing each slider and
taking floor moves :data:`CONFIRM_KEYS` times as often. ``--results`` judges a recorded pass."""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

from . import lab, summarize

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
MAX_RATIO = 2.0
KEYS_PER_SLIDER = 4
MIN_MOVES_PER_WIDGET = 12
FLOOR_MOVES, FLOOR_MOVES_BETWEEN = 20, 12
CONFIRM_KEYS = 3
MIN_LOCAL_FLOOR = 8       # floor moves around a notebook needed to judge it by them
CHECKS = ("every cell ran, none shows an error", "a slider move changes the first widget's picture",
          "...and its readouts, entropy included")


def _changed_pixels(before: bytes, after: bytes) -> int:
    import numpy as np
    from PIL import Image

    a, b = (np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)
            for png in (before, after))
    return a.size if a.shape != b.shape else int((np.abs(a - b).sum(axis=-1) > 0).sum())


def shown(moves: list[dict]) -> list[float]:
    """The judged latencies: key press to the new picture on screen."""
    return [m["shown"] for m in moves]


def last_widget_cell(name: str) -> tuple[int | None, int]:
    """Index of the last cell with a stored widget output (or ``None``), and the code cells up to
    it."""
    cells = json.loads((ROOT / "notebooks" / name).read_text())["cells"]
    last = max((i for i, cell in enumerate(cells) for output in cell.get("outputs", [])
                if "application/vnd.jupyter.widget-view+json" in output.get("data", {})),
               default=None)
    upto = cells if last is None else cells[:last + 1]
    return last, sum(cell["cell_type"] == "code" for cell in upto)


def check_first_widget(record: dict, image, widget, readouts, shots: Path):
    """Screenshot the first widget; returns the check to run after its first move."""
    before_png = image.screenshot()
    record["readouts_before"] = before_text = readouts.inner_text()
    widget.screenshot(path=str(shots / "widget_before.png"))

    def after_first():
        if "changed_pixels" in record:
            return
        changed, after_text = _changed_pixels(before_png, image.screenshot()), readouts.inner_text()
        record["checks"][CHECKS[1]] = changed > 0
        record["checks"][CHECKS[2]] = after_text != before_text and "entropy" in after_text
        widget.screenshot(path=str(shots / "widget_after.png"))
        record.update(changed_pixels=changed, readouts_after=after_text)

    return after_first


def check_notebook(page, name: str, shots: Path, keys: int = KEYS_PER_SLIDER,
                   widgets_only: bool = False) -> dict:
    """Open ``name``, Run All (``widgets_only``: up to its last widget), check it and time every
    slider of every widget; returns its record."""
    shots.mkdir(parents=True, exist_ok=True)
    record = {"notebook": Path(name).stem, "run_all_s": None, "widgets": 0, "moves": [],
              "inert_presses": 0, "checks": dict.fromkeys(CHECKS, False), "problems": []}
    try:
        lab.open_in_lab(page, name)
        last, code_cells = last_widget_cell(name)
        seconds, not_run = lab.run_all(page, 600, last if widgets_only else None)
        not_run = not_run[:code_cells] if widgets_only else not_run    # among the cells it ran
        record["run_all_s"] = round(seconds, 1)
        page.screenshot(path=str(shots / "after_run_all.png"), full_page=True)
        errors = lab.error_outputs(page)
        record["checks"][CHECKS[0]] = not errors and not not_run
        record["problems"] += [f"a cell shows an error:\n{text[:2000]}" for text in errors[:1]]
        if not_run:
            record["problems"].append(f"{len(not_run)} code cells did not run (Run All stopped)")
        images = page.locator(".jp-OutputArea-output img.widget-image")
        record["widgets"] = images.count()
        if not page.locator(".jp-OutputArea-output .attn-readouts").count():
            record["problems"].append("no attention widget (with readouts) after Run All")
        for w in range(record["widgets"]):
            image = images.nth(w)
            widget = image.locator("xpath=ancestor::div[contains(@class, 'widget-vbox')][1]")
            if not widget.count():     # a picture with no controls
                continue
            widget.scroll_into_view_if_needed()
            lab.wait(lambda image=image: image.evaluate("i => i.complete && i.naturalWidth > 0"),
                     20, "the widget's image to load")
            after_first, readouts = None, widget.locator(".attn-readouts")
            if "readouts_before" not in record and readouts.count():     # the first widget's
                after_first = check_first_widget(record, image, widget, readouts, shots)
            handles = widget.locator(".widget-slider .noUi-handle")
            for h in range(handles.count()):
                presses = max(keys, -(-MIN_MOVES_PER_WIDGET // handles.count()))
                moves, inert = lab.press_keys(page, image, handles.nth(h), presses, after_first)
                record["moves"] += moves
                record["inert_presses"] += inert
    except Exception as error:  # noqa: BLE001 - reported as the notebook's problem
        record["problems"].append(f"{type(error).__name__}: {error}")
    (shots / "summary.json").write_text(json.dumps(record, indent=1))
    return record


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def browser_pass(names: list[str], *, keys: int = KEYS_PER_SLIDER, artifacts: Path = ARTIFACTS,
                 widgets_only: bool = False) -> dict:
    """The pass over ``names`` (in ``notebooks/``), floor moves before and after each; returns the
    results and writes ``results.json``."""
    artifacts.mkdir(parents=True, exist_ok=True)
    results = {"floor": [], "floor_marks": [], "notebooks": []}
    started = time.monotonic()
    with lab.chromium() as browser, lab.lab_server(ROOT / "notebooks",
                                                   artifacts / "jupyterlab.log") as (base, token):
        page, floor_page = (browser.new_context(viewport={"width": 1500, "height": 1100}).new_page()
                            for _ in range(2))
        lab.open_lab(page, base, token, ready=False)   # loads while the floor starts
        lab.open_lab(floor_page, base, token)
        lab.open_in_lab(floor_page, lab.FLOOR_NOTEBOOK)
        if lab.run_all(floor_page, 120)[1]:
            raise RuntimeError(f"the floor did not run: {lab.error_outputs(floor_page)}")
        floor_image = floor_page.locator(".jp-OutputArea-output img.widget-image").first
        floor_image.wait_for(timeout=30_000)
        floor_slider = floor_page.locator(".widget-slider .noUi-handle").first

        def floor_moves(count: int) -> None:
            try:
                results["floor"] += lab.press_keys(floor_page, floor_image, floor_slider, count)[0]
            except Exception as error:  # noqa: BLE001 - the moves before still judge
                results.setdefault("floor_problems", []).append(f"{type(error).__name__}: {error}")
            results["floor_marks"].append(len(results["floor"]))

        lab.lab_ready(page)
        scale = max(1, keys // KEYS_PER_SLIDER)
        floor_moves(FLOOR_MOVES * scale)
        say(f"{'floor':>24}: median {summarize(shown(results['floor']))['median_ms']} ms")
        for name in names:
            record = check_notebook(page, name, artifacts / Path(name).stem, keys, widgets_only)
            floor_moves(FLOOR_MOVES_BETWEEN * scale)   # its kernel still idle, the notebook open
            try:
                lab.close_notebooks(page)
            except Exception as error:  # noqa: BLE001 - a fresh JupyterLab for the next one
                record["problems"].append(f"closing it: {type(error).__name__}: {error}"[:300])
                lab.open_lab(page, base, token)
            results["notebooks"].append(record)
            say(_line(record, None))
    results["seconds"] = round(time.monotonic() - started)
    results["server"] = [line.split("] ", 1)[-1] for line in
                         (artifacts / "jupyterlab.log").read_text().splitlines()
                         if "attn_helpers.labserver:" in line][:1]
    (artifacts / "results.json").write_text(json.dumps(results, indent=1))
    return results


def _line(record: dict, floor: float | None, which: str = "the floor") -> str:
    failed = [name for name, ok in record["checks"].items() if not ok]
    text = f"{record['notebook']:>24}: {len(record['moves']):3d} moves"
    if record["moves"]:
        s = summarize(shown(record["moves"]))
        text += f", median {s['median_ms']:6.1f} ms, p90 {s['p90_ms']:6.1f} ms"
        if floor:
            text += f", {s['median_ms'] / floor:4.2f}x {which} ({floor:.1f} ms)"
        swapped, decoded = (summarize([m[k] for m in record["moves"]])["median_ms"]
                            for k in ("swapped", "decoded"))
        text += f" (PNG in the page {swapped:.1f} ms, decoded {decoded:.1f} ms)"
    if record.get("inert_presses"):
        text += f" ({record['inert_presses']} presses brought no new picture)"
    text += f"; Run All {record['run_all_s']} s"
    return text + (f"; FAILED: {'; '.join(failed)}" if failed else "; checks pass")


def local_floor(results: dict, index: int) -> list[float]:
    """The floor moves just before and just after notebook ``index``'s moves."""
    marks = results.get("floor_marks") or []
    if index + 1 >= len(marks):
        return []
    return shown(results["floor"][marks[index - 1] if index > 0 else 0:marks[index + 1]])


def verdict(results: dict) -> tuple[bool, bool, str]:
    """``(checks pass, ratios met, text)``: each notebook's median at most :data:`MAX_RATIO` times
    the floor around it (or the pass's floor). Sets ``results["missed"]``."""
    results["missed"] = []
    floor = summarize(shown(results["floor"])) if results["floor"] else None
    lines = [f"server: {(results.get('server') or ['attn_helpers.labserver not loaded'])[0]}",
             f"floor (bare slider swapping a precomputed PNG): {len(results['floor'])} moves, "
             + (f"median {floor['median_ms']:.1f} ms, p90 {floor['p90_ms']:.1f} ms" if floor
                else "NOT measured") + " (key press to the new picture on screen)"]
    lines += [f"floor moves lost: {problem}" for problem in results.get("floor_problems", [])]
    checks_ok, ratios_ok = bool(results["notebooks"]), floor is not None
    for index, record in enumerate(results["notebooks"]):
        around = local_floor(results, index)
        near = summarize(around)["median_ms"] if len(around) >= MIN_LOCAL_FLOOR else None
        judge = near or (floor and floor["median_ms"])     # None: no floor, not met
        lines.append(_line(record, judge, "the floor around it" if near else "the pass's floor"))
        lines += [f"{'':>26}{problem.splitlines()[0][:300]}" for problem in record["problems"]]
        checks_ok &= all(record["checks"].values()) and not record["problems"]
        met = bool(judge and record["moves"]) and (
            summarize(shown(record["moves"]))["median_ms"] <= MAX_RATIO * judge)
        ratios_ok &= met
        if not met:
            results["missed"].append(record["notebook"])
    lines.append(f"checks (every cell ran without error, the first widget's picture and readouts "
                 f"change): {'pass' if checks_ok else 'FAIL'}")
    lines.append(f"speed: every notebook's median at most {MAX_RATIO:g}x the floor around it: "
                 f"{'met' if ratios_ok else 'NOT met'}")
    return checks_ok, ratios_ok, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_helpers bench browser", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", help="notebook files or stems (default: all)")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 also when a notebook's median is over {MAX_RATIO:g}x the floor")
    parser.add_argument("--confirm", action="store_true",
                        help="with --check: measure the notebooks that miss the ratio once more, "
                             "in a pass of their own, and fail only if one misses it again")
    parser.add_argument("--results", type=Path, metavar="FILE",
                        help="judge a recorded pass (results.json) instead of running one")
    args = parser.parse_args(argv)
    if args.results is not None:
        if not args.results.exists():
            parser.error(f"--results: no file {args.results}")
        results = json.loads(args.results.read_text())
    else:
        every = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
        chosen = [n for n in every if not args.notebooks or any(
            n == a or n.startswith(Path(a).stem) for a in args.notebooks)]
        if not chosen:
            parser.error(f"no notebook matches {args.notebooks}; known: {every}")
        if lacking := lab.missing():
            parser.error("; ".join(lacking))
        results = browser_pass(chosen)
    checks_ok, ratios_ok, text = verdict(results)
    say(text)
    if checks_ok and not ratios_ok and args.check and args.confirm:
        missed = [f"{name}.ipynb" for name in results["missed"]]
        say(f"over {MAX_RATIO:g}x the floor around it: {', '.join(missed)}; measured once more, "
            f"in a pass of their own (up to the last widget, {CONFIRM_KEYS}x the key presses)")
        again = browser_pass(missed, keys=CONFIRM_KEYS * KEYS_PER_SLIDER,
                             artifacts=ARTIFACTS / "confirm", widgets_only=True)
        checks_ok, ratios_ok, text = verdict(again)
        say(text)
    return 0 if checks_ok and (ratios_ok or not args.check) else 1
