"""Static checks on every committed notebook: what strict nbval relies on, and the course's rules."""

from __future__ import annotations

import json

import nbformat

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_valid_executed_top_to_bottom_without_errors_in_the_python3_kernel(notebook):
    path, nb = notebook
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3", path.name
    counts = [c.execution_count for c in code_cells(nb)]
    assert counts == list(range(1, len(counts) + 1)), f"{path.name}: execution counts {counts}"
    for i, cell in enumerate(code_cells(nb), start=1):
        for output in cell.outputs:
            assert output.output_type != "error", f"{path.name} cell {i}: error output"
            assert output.get("name") != "stderr", f"{path.name} cell {i}: stderr {output.text[:200]!r}"


def test_setup_called_no_leftover_markers_and_no_machine_paths(notebook):
    path, nb = notebook
    source = "\n".join(c.source for c in code_cells(nb))
    assert "attn_helpers" in source and ".setup(" in source, f"{path.name}: no attn_helpers setup()"
    text = json.dumps([c.source for c in nb.cells])
    for marker in ("TODO", "FIXME", "XXX"):
        assert marker not in text, f"{path.name} contains {marker}"
    outputs = json.dumps([[{k: v for k, v in o.get("data", {}).items() if not k.startswith("image/")}
                            if "data" in o else o for o in c.get("outputs", [])]
                           for c in code_cells(nb)])   # text only: base64 images can spell "/tmp/"
    for fragment in ("/tmp/", "/home/", "/root/", ".venv/"):
        assert fragment not in outputs, f"{path.name}: an output contains the path {fragment!r}"


def test_going_deeper_heading_is_stored_collapsed(notebook):
    path, nb = notebook
    heads = [c for c in nb.cells
             if c.cell_type == "markdown" and c.source.lstrip().startswith("## Going deeper")]
    assert len(heads) == 1, f"{path.name}: {len(heads)} '## Going deeper' headings, expected 1"
    assert heads[0].metadata.get("jp-MarkdownHeadingCollapsed"), (
        f"{path.name}: the Going deeper heading must be stored collapsed (jp-MarkdownHeadingCollapsed)")


def test_live_widgets_are_ignored_followed_by_a_strict_cell_and_carry_their_picture(notebook):
    """A widget cell is tagged ``nbval-ignore-output``, the next cell is compared strictly, and each
    widget output carries a static ``image/png`` (for GitHub, nbviewer, HTML) beside its view."""
    path, nb = notebook
    cells = code_cells(nb)
    shown = [i for i, c in enumerate(cells) if any(WIDGET_MIME in o.get("data", {}) for o in c.outputs)]
    assert shown, f"{path.name} shows no live widget"
    for i in shown:
        assert "nbval-ignore-output" in cells[i].metadata.get("tags", []), (
            f"{path.name}: widget cell {i + 1} is not tagged nbval-ignore-output")
        assert i + 1 < len(cells) and "nbval-ignore-output" not in cells[i + 1].metadata.get(
            "tags", []), f"{path.name}: the cell after widget cell {i + 1} must be compared strictly"
        for output in cells[i].outputs:
            data = output.get("data", {})
            if WIDGET_MIME in data:
                assert "image/png" in data and not data.get("text/plain", "VBox(").startswith("VBox("), (
                    f"{path.name}: widget cell {i + 1} stores no picture")


def test_html_export_shows_every_widget_picture(notebook):
    """No widget state is stored, so ``nbconvert --to html`` shows each widget's ``image/png``. The
    export itself (seconds per notebook) runs on one notebook: the path through nbconvert is the
    same for all, and what differs, each widget's stored picture, is checked above."""
    from nbconvert import HTMLExporter

    path, nb = notebook
    assert "widgets" not in nb.metadata, (
        f"{path.name}: stored widget state; re-execute with `python3 course.py execute`")
    if not path.name.startswith("04_"):
        return
    pictures = sum("image/png" in o.get("data", {}) for c in code_cells(nb) for o in c.outputs)
    html, _ = HTMLExporter().from_notebook_node(nb)
    assert html.count('src="data:image/png;base64,') >= pictures, path.name


def test_no_in_page_links(notebook):
    """The site's strict Sphinx build cannot resolve ``](#Some-heading)`` links: name the section."""
    path, nb = notebook
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            assert "](#" not in cell.source, (
                f"{path.name} cell {i}: an in-page link ](#...); name the section in words")
