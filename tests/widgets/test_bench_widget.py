"""``bench widget``: one record per notebook widget, moves as arrow keys make them, and a verdict
that fails only on the same-run ratio to the seaborn re-plot (made-up records: no time asserted)."""

from __future__ import annotations

from pathlib import Path

import ipywidgets as widgets

from attn_helpers.bench import widget as bench
from attn_helpers.widgets.masking import masking_widget

ROOT = Path(__file__).resolve().parents[2]


def records(notebook_ms: dict[str, float], live: float = 5.0, seaborn: float = 300.0) -> list[dict]:
    out = [{"widget": slug, "median_ms": ms, "p90_ms": ms * 1.5, "cpu_median_ms": ms / 2}
           for slug, ms in notebook_ms.items()]
    return out + [{"widget": "generic view", "median_ms": live, "p90_ms": live},
                  {"widget": "seaborn", "median_ms": seaborn, "p90_ms": seaborn}]


def test_every_notebook_with_a_widget_has_a_builder():
    with_widget = {path.stem.split("_", 1)[1] for path in (ROOT / "notebooks").glob("*.ipynb")
                   if "attn_helpers.widgets" in path.read_text()}
    assert with_widget <= set(bench.NOTEBOOK_WIDGETS)


def test_verdict_fails_only_on_the_same_run_ratio_and_prints_it():
    fast = dict.fromkeys(bench.NOTEBOOK_WIDGETS, 4.0)
    ok, text = bench.widget_verdict(records(fast))
    assert ok and "target: every move at most 0.1 of re-creating a seaborn heatmap" in text
    assert "masking" in text and "0.013 of seaborn's (1/75)" in text and "met" in text
    ok, text = bench.widget_verdict(records({**fast, "multi_head": 30.1}))   # 30.1 > 300 / 10
    assert not ok and "NOT met" in text
    assert [line for line in text.splitlines() if "OVER" in line][0].strip().startswith("multi_head")
    assert not bench.widget_verdict(records(fast, live=31.0))[0]
    # 10x slower moves pass when seaborn is 10x slower too; fast moves fail next to a faster seaborn
    assert bench.widget_verdict(records(dict.fromkeys(fast, 200.0), live=50.0, seaborn=3000.0))[0]
    assert not bench.widget_verdict(records(fast, live=5.0, seaborn=30.0))[0]


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
    step, count = bench.notebook_widget_step("masking")
    assert count == len(sequence) > 10
    wall, cpu = bench.time_moves(step, count)          # every move redraws without an error
    assert len(wall) == len(cpu) == count and all(w > 0 for w in wall)
    for name, value in sequence:
        widget.controls[name].value = value
    assert widget.values == start
