"""Static checks on the committed notebooks: what strict nbval relies on, and the course rules.

Every notebook in notebooks/ is checked, so notebooks added later are covered automatically.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found in notebooks/"


@pytest.fixture(params=NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def notebook(request):
    path = request.param
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    return path, nb


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_executed_top_to_bottom_in_a_fresh_kernel(notebook):
    path, nb = notebook
    counts = [c.execution_count for c in code_cells(nb)]
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: execution counts {counts}"


def test_no_error_or_stderr_outputs(notebook):
    path, nb = notebook
    for i, cell in enumerate(code_cells(nb), start=1):
        for output in cell.outputs:
            assert output.output_type != "error", f"{path.name} cell {i}: error output"
            is_stderr = output.output_type == "stream" and output.name == "stderr"
            assert not is_stderr, f"{path.name} cell {i}: stderr output {output.text[:200]!r}"


def test_uses_attn_helpers_and_the_setup_call(notebook):
    path, nb = notebook
    source = "\n".join(c.source for c in code_cells(nb))
    assert "attn_helpers" in source, f"{path.name} does not import attn_helpers"
    assert ".setup(" in source, f"{path.name} does not call attn_helpers.setup()"


def test_shows_a_live_widget_in_an_ignored_cell_followed_by_a_strict_one(notebook):
    path, nb = notebook
    cells = code_cells(nb)
    shown = [i for i, c in enumerate(cells)
             if any(WIDGET_MIME in o.get("data", {}) for o in c.outputs)]
    assert shown, f"{path.name} shows no live widget"
    for i in shown:
        tags = cells[i].metadata.get("tags", [])
        assert "nbval-ignore-output" in tags, f"{path.name}: widget cell {i + 1} is not tagged"
        follower = cells[i + 1] if i + 1 < len(cells) else None
        assert follower is not None and "nbval-ignore-output" not in follower.metadata.get(
            "tags", []), f"{path.name}: the cell after widget cell {i + 1} must be compared strictly"


def test_no_leftover_markers_and_no_machine_paths(notebook):
    path, nb = notebook
    text = json.dumps([c.source for c in nb.cells])
    for marker in ("TODO", "FIXME", "XXX"):
        assert marker not in text, f"{path.name} contains {marker}"
    outputs = json.dumps([c.get("outputs", []) for c in code_cells(nb)])
    for fragment in ("/tmp/", "/home/", "/root/", ".venv/"):
        assert fragment not in outputs, f"{path.name}: an output contains the path {fragment!r}"


def test_kernel_is_the_plain_python3_kernel(notebook):
    path, nb = notebook
    assert nb.metadata.kernelspec.name == "python3", path.name


def test_every_widget_output_carries_its_picture(notebook):
    """GitHub, nbviewer and exported HTML cannot run a kernel: each stored widget output must carry
    a static ``image/png`` (and a short ``text/plain``) beside its widget view."""
    path, nb = notebook
    views = [o for c in code_cells(nb) for o in c.get("outputs", [])
             if WIDGET_MIME in o.get("data", {})]
    for output in views:
        assert "image/png" in output["data"] and "text/plain" in output["data"], path.name
        assert not output["data"]["text/plain"].startswith("VBox("), path.name


def test_html_export_shows_every_widget_picture(notebook):
    """``jupyter nbconvert --to html`` of the stored notebook shows each widget as its picture:
    no widget state is stored (with state, the export embeds a live widget that needs a kernel
    or the internet), so the exporter falls back to the ``image/png``."""
    from nbconvert import HTMLExporter

    path, nb = notebook
    assert "widgets" not in nb.metadata, (
        f"{path.name}: stored widget state; re-execute with `python3 course.py execute`")
    pictures = sum(1 for c in code_cells(nb) for o in c.get("outputs", [])
                   if "image/png" in o.get("data", {}))
    html, _ = HTMLExporter().from_notebook_node(nb)
    assert html.count('src="data:image/png;base64,') >= pictures, path.name
