"""Where no kernel runs (GitHub, nbviewer, exported HTML, the static site) a widget still shows
itself: the display bundle carries beside the widget view an ``image/png`` still (title, controls
as set, picture, readouts) and ``text/plain`` naming each control's value."""

from __future__ import annotations

import base64
import re

import nbformat
import numpy as np
import pytest
from _reference import decode_png
from nbclient import NotebookClient
from nbconvert import HTMLExporter

from attn_helpers.widgets.start_here import warmup_widget

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def test_bundle_has_the_view_and_a_still_with_the_controls_picture_and_readouts():
    widget = warmup_widget()
    bundle = widget._repr_mimebundle_()
    assert {WIDGET_VIEW, "image/png", "text/plain"} <= set(bundle)
    assert bundle[WIDGET_VIEW]["model_id"] == widget.ui.model_id
    still, picture = decode_png(base64.b64decode(bundle["image/png"])), decode_png(widget.image.value)
    assert still.shape[1] == picture.shape[1]
    top = next(t for t in range(still.shape[0] - picture.shape[0] + 1)   # the picture, as drawn
               if np.array_equal(still[t:t + picture.shape[0]], picture))
    assert top >= 40 and still.shape[0] - top - picture.shape[0] >= 32  # controls; 2 readouts
    assert "temperature = 1.0, causal mask = False" in bundle["text/plain"]
    assert "VBox" not in bundle["text/plain"]
    widget.set(temperature=0.1, causal=True)   # the still shows the controls as they are now
    moved = decode_png(base64.b64decode(widget._repr_mimebundle_()["image/png"]))
    assert moved.shape == still.shape and (moved[:top] != still[:top]).any()
    assert "temperature = 0.1, causal mask = True" in widget._repr_mimebundle_()["text/plain"]


@pytest.mark.slow
def test_exported_html_shows_the_widget_picture(tmp_path):
    """Execute a one-widget notebook in a real kernel, export it to HTML without widget state
    (as ``jupyter nbconvert --to html`` does for a stored notebook) and find the picture."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(
        "from attn_helpers.widgets.start_here import warmup_widget\nwarmup_widget()")]
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    (output,) = notebook.cells[0].outputs
    assert {WIDGET_VIEW, "image/png", "text/plain"} <= set(output["data"])
    notebook.metadata.pop("widgets", None)  # a stored notebook without saved widget state
    body, _ = HTMLExporter().from_notebook_node(notebook)
    images = re.findall(r'<img[^>]*src="data:image/png;base64,([^"]+)"', body)
    assert len(images) == 1
    picture = decode_png(base64.b64decode(images[0]))
    assert picture.shape[0] > 200 and picture.shape[1] > 400
    assert "VBox(children" not in body


def test_the_still_warns_nothing_under_the_notebooks_settings(recwarn):
    """The notebooks' ``ah.setup()`` turns on constrained layout; the still must not warn."""
    import attn_helpers as ah

    ah.setup()
    warmup_widget()._repr_mimebundle_()
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]
