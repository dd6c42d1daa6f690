"""Where no kernel runs (GitHub, nbviewer, exported HTML) a widget still shows its picture: the
display bundle carries ``image/png`` and ``text/plain`` beside the widget view."""

from __future__ import annotations

import base64
import io
import re

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient
from nbconvert import HTMLExporter
from PIL import Image

from attn_helpers.widgets.start_here import warmup_widget

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def decode_png(text: str) -> np.ndarray:
    image = Image.open(io.BytesIO(base64.b64decode(text)))
    image.load()
    assert image.format == "PNG"
    return np.asarray(image.convert("RGBA"))


def test_bundle_has_the_view_the_current_picture_and_text():
    widget = warmup_widget()
    bundle = widget._repr_mimebundle_()
    assert {WIDGET_VIEW, "image/png", "text/plain"} <= set(bundle)
    assert bundle[WIDGET_VIEW]["model_id"] == widget.ui.model_id
    first = decode_png(bundle["image/png"])
    figure = widget.view.figure
    assert first.shape[:2] == tuple(round(x) for x in figure.get_size_inches()[::-1] * figure.dpi)
    assert "VBox" not in bundle["text/plain"] and "temperature" in bundle["text/plain"]
    widget.set(temperature=0.1)  # the bundle shows the picture on show now
    second = decode_png(widget._repr_mimebundle_()["image/png"])
    assert second.shape == first.shape and (second != first).any()
    assert base64.b64decode(widget._repr_mimebundle_()["image/png"]) == widget.image.value


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
    picture = decode_png(images[0])
    assert picture.shape[0] > 200 and picture.shape[1] > 400
    assert "VBox(children" not in body
