"""``bench widget``: one record per notebook widget, moves as arrow keys make them, a verdict
that fails when any notebook's median move is over the target."""

from __future__ import annotations

import json
from pathlib import Path

import ipywidgets as widgets

from attn_helpers.bench import widget as bench
from attn_helpers.widgets.masking import masking_widget

ROOT = Path(__file__).resolve().parents[2]


def records(notebook_ms: dict[str, float], live32: float = 5.0) -> list[dict]:
    out = [{"widget": slug, "method": "live", "median_ms": ms, "p90_ms": ms * 1.5,
            "cpu_median_ms": ms / 2} for slug, ms in notebook_ms.items()]
    for n in bench.WIDGET_TOKENS:
        out += [{"tokens": n, "method": "live", "median_ms": live32, "p90_ms": live32},
                {"tokens": n, "method": "seaborn", "median_ms": 300.0, "p90_ms": 300.0}]
    return out


def test_every_notebook_with_a_widget_has_a_builder():
    with_widget = set()
    for path in (ROOT / "notebooks").glob("*.ipynb"):
        cells = json.loads(path.read_text())["cells"]
        if any("attn_helpers.widgets" in "".join(c["source"]) for c in cells):
            with_widget.add(path.stem.split("_", 1)[1])
    assert with_widget <= set(bench.NOTEBOOK_WIDGETS)


def test_verdict_fails_when_one_notebook_is_over_the_target():
    fast = dict.fromkeys(bench.NOTEBOOK_WIDGETS, 4.0)
    ok, text = bench.widget_verdict(records(fast))
    assert ok and "every notebook widget" in text
    ok, text = bench.widget_verdict(records({**fast, "multi_head": bench.WIDGET_TARGET_MS + 0.1}))
    assert not ok and "multi_head" in text and "NOT met" in text
    ok, _ = bench.widget_verdict(records(fast, live32=bench.WIDGET_TARGET_MS + 1))
    assert not ok


def test_moves_step_every_control_and_come_back():
    widget = masking_widget()
    start = widget.values
    sequence = bench.moves(widget)
    assert {name for name, _ in sequence} == set(widget.controls)
    assert set(bench.control_values(widget.controls["window"])) == set(range(1, 9))
    assert bench.control_values(widget.controls["mask_type"]) == list(
        widget.controls["mask_type"].options)
    assert bench.control_values(widgets.Checkbox(value=True)) == [False, True]
    assert bench.control_values(widgets.Text("a sentence")) == []
    for name, value in sequence:
        widget.controls[name].value = value
        assert widget.error is None
    assert widget.values == start


def test_a_notebook_step_drives_its_widget():
    step, count = bench.notebook_widget_step("masking")
    assert count > 10
    wall, cpu = bench.time_moves(step, 5)
    assert len(wall) == len(cpu) == 5 and all(w > 0 for w in wall)
