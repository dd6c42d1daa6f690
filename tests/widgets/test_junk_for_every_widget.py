"""Every notebook's widget, driven with junk through ``set(...)``: each bad value gets a message
in the widget and a ValueError (or TypeError), both naming the control; nothing moves, and the
last good picture stays (issue 17)."""

from __future__ import annotations

import base64
import io

import ipywidgets as widgets
import pytest
from PIL import Image

from attn_helpers.bench.widget import NOTEBOOK_WIDGETS

JUNK = [None, "x", -10**9, 10**9, float("nan"), [1, 2], True]


@pytest.fixture(scope="module", params=sorted(NOTEBOOK_WIDGETS))
def widget(request):
    return request.param, NOTEBOOK_WIDGETS[request.param]()


def _acceptable(control, value) -> bool:
    """Junk that is in fact a legal value of this control (e.g. True for a toggle)."""
    if isinstance(control, widgets.Checkbox | widgets.ToggleButton):
        return isinstance(value, bool)
    if isinstance(control, widgets.Text | widgets.Textarea):
        return isinstance(value, str)
    if hasattr(control, "options"):
        return value in [o[1] if isinstance(o, tuple) else o for o in control.options]
    return False


def test_junk_is_refused_with_a_message_and_the_picture_kept(widget):
    slug, w = widget
    for name, control in w.controls.items():
        for junk in JUNK:
            if _acceptable(control, junk):
                continue
            picture, values = w.image.value, dict(w.values)
            with pytest.raises((TypeError, ValueError), match=name):
                w.set(**{name: junk})
            assert w.error and name in w.error, (slug, name, junk, w.error)
            assert w.image.value == picture and w.values == values, (slug, name, junk)
    first = next(iter(w.controls))
    w.set(**{first: w.controls[first].value})       # a good value clears the message
    assert w.error is None, (slug, w.error)


def test_unknown_control_is_a_clear_error(widget):
    _, w = widget
    with pytest.raises(ValueError, match="unknown control"):
        w.set(no_such_control=1)


def test_the_stored_still_shows_the_controls_above_the_picture(widget):
    """What the stored notebook shows where no kernel runs (issue 33, 00): every control's value
    in the text, and a still taller than the picture (the controls drawn above it)."""
    slug, w = widget
    bundle = w._repr_mimebundle_()
    still = Image.open(io.BytesIO(base64.b64decode(bundle["image/png"])))
    picture = Image.open(io.BytesIO(w.image.value))
    assert still.width == picture.width and still.height >= picture.height + 40, slug
    for name, control in w.controls.items():
        assert f"{control.description or name} = " in bundle["text/plain"], (slug, name)
