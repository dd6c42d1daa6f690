"""``bench browser``'s verdict on a recorded pass (no browser): checks fail on an error or an
unchanged picture; speed fails only on the same-run ratio to the floor around each notebook."""

from __future__ import annotations

import json

from attn_helpers import bench
from attn_helpers.bench import browser


def moves(latencies) -> list[dict]:
    return [{"swapped": ms / 2, "decoded": ms - 1, "shown": ms} for ms in latencies]


def record(name: str, latencies: list[float], ok: bool = True, problems=()) -> dict:
    return {"notebook": name, "run_all_s": 12.0, "widgets": 1, "moves": moves(latencies),
            "checks": dict.fromkeys(browser.CHECKS, ok), "problems": list(problems)}


def results(*records, floor=(30.0,) * 30) -> dict:
    return {"floor": moves(floor), "notebooks": list(records),
            "server": ["attn_helpers.labserver: kernel websocket without Nagle's delay"]}


def test_the_ratio_to_the_floor_decides_speed_and_a_failed_check_always_fails():
    checks, fast, text = browser.verdict(results(record("00_a", [40.0] * 8),
                                                 record("01_b", [59.0] * 8)))
    assert checks and fast
    assert "median   59.0 ms" in text and "1.97x the pass's floor" in text
    assert "without Nagle's delay" in text
    checks, fast, text = browser.verdict(results(record("00_a", [61.0] * 8)))
    assert checks and not fast and "NOT met" in text
    # a slow machine: everything 5x slower, floor included, still meets the ratio
    assert browser.verdict(results(record("00_a", [250.0] * 8), floor=[150.0] * 30))[1]
    # no timed move, or no floor: the ratio is not met
    assert not browser.verdict(results(record("00_a", [])))[1]
    assert not browser.verdict(results(record("00_a", [40.0] * 8), floor=[]))[1]
    assert not browser.verdict(results(record("00_a", [31.0] * 8, ok=False)))[0]
    checks, _, text = browser.verdict(results(record("00_a", [31.0] * 8,
                                                     problems=["TimeoutError: Run All"])))
    assert not checks and "TimeoutError: Run All" in text


def test_each_notebook_is_judged_against_the_floor_around_it():
    floor = [20.0] * 20 + [20.0] * 12 + [60.0] * 12 + [60.0] * 12   # the load rises mid-pass
    rec = results(record("00_a", [39.0] * 8), record("01_b", [110.0] * 8), record("02_c", [119.0] * 8),
                  floor=floor)
    rec["floor_marks"] = [20, 32, 44, 56]
    assert browser.local_floor(rec, 0) == [20.0] * 32
    assert browser.local_floor(rec, 1) == [20.0] * 12 + [60.0] * 12
    assert browser.local_floor(rec, 2) == [60.0] * 24
    checks, fast, text = browser.verdict(rec)
    assert "1.95x the floor around it (20.0 ms)" in text
    assert "1.98x the floor around it (60.0 ms)" in text
    assert "2.75x the floor around it (40.0 ms)" in text and not fast  # 01_b: the mean of 20, 60
    rec["notebooks"][1]["moves"] = moves([79.0] * 8)
    assert browser.verdict(rec)[1]
    # by the pass's floor (median 20 ms) the last two would fail
    assert not browser.verdict({**rec, "floor_marks": None})[1]
    # too few moves around a notebook (lost floor moves): the pass's floor judges it
    rec["floor_marks"] = [20, 20, 20, 56]
    assert "the pass's floor" in browser.verdict(rec)[2]


def test_results_are_judged_and_confirm_measures_only_the_missed_notebooks(tmp_path, monkeypatch,
                                                                           capsys):
    """``--results`` judges a recorded pass; with ``--check --confirm`` a notebook over the ratio
    is measured once more, alone, and fails only if it misses again."""
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results(record("00_a", [40.0] * 8), record("01_b", [90.0] * 8))))
    assert bench.main(["browser", "--results", str(path)]) == 0            # printed, not failed
    assert "x the floor around it: NOT met" in capsys.readouterr().err
    passes = []

    def again(names, **kwargs):
        assert kwargs["widgets_only"]                # run up to the last widget: checked before
        passes.append(names)
        return results(record("01_b", [latency] * 8))

    monkeypatch.setattr(browser, "browser_pass", again)
    latency = 55.0                                   # 1.83x: confirmed within the target
    assert bench.main(["browser", "--results", str(path), "--check", "--confirm"]) == 0
    assert passes == [["01_b.ipynb"]] and "01_b.ipynb; measured once more" in capsys.readouterr().err
    latency = 61.0                                   # 2.03x again: fails
    assert bench.main(["browser", "--results", str(path), "--check", "--confirm"]) == 1
    assert bench.main(["browser", "--results", str(path), "--check"]) == 1   # no second pass
    assert len(passes) == 2
    path.write_text(json.dumps(results(record("00_a", [40.0] * 8, ok=False))))
    assert bench.main(["browser", "--results", str(path)]) == 1            # a check always fails
    assert bench.main(["browser", "--results", str(path), "--check", "--confirm"]) == 1
    assert len(passes) == 2                          # a failed check is never re-measured


def test_the_last_widget_cell_is_found_in_the_stored_outputs():
    cells = json.loads((browser.ROOT / "notebooks" / "00_start_here.ipynb").read_text())["cells"]
    last, code_cells = browser.last_widget_cell("00_start_here.ipynb")
    widget = ["application/vnd.jupyter.widget-view+json" in "".join(map(str, c.get("outputs", [])))
              for c in cells]
    assert widget[last] and not any(widget[last + 1:]) and 0 < code_cells <= last + 1
