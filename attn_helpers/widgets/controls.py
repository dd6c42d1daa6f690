"""A widget's controls outside the browser: why ``set`` refuses a value (:func:`control_problem`),
and the still of the widget for a stored notebook, its controls drawn as set (:func:`still_png`)."""

from __future__ import annotations

import io

import ipywidgets as widgets
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Circle, FancyBboxPatch
from PIL import Image

FONT, BOLD = FontProperties(size=9), FontProperties(size=10, weight="bold")
ROW, GAP, TRACK, BOX = 26, 8, 110, 13        # pixels
BLUE, GREY, EDGE = "#2196f3", "#c8c8c8", "#9e9e9e"


def control_problem(name: str, control, value) -> str | None:
    """Why ``value`` cannot be set on ``control`` (a message for the widget), or ``None``."""
    if isinstance(control, widgets.Checkbox | widgets.ToggleButton):
        return None if isinstance(value, bool) else f"{name} must be True or False, got {value!r}"
    if hasattr(control, "options"):
        allowed = [o[1] if isinstance(o, tuple) else o for o in control.options]
        return None if value in allowed else f"{name} must be one of {allowed}, got {value!r}"
    if hasattr(control, "min") and hasattr(control, "max"):
        kind = int if isinstance(control.value, int) else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind):
            return (f"{name} must be {'a whole number' if kind is int else 'a number'}, "
                    f"got {value!r}")
        low, high = control.min, control.max
        if isinstance(control, widgets.FloatLogSlider):  # its min and max are exponents
            low, high = control.base ** low, control.base ** high
        return None if low <= value <= high else (
            f"{name} must be between {low:g} and {high:g}, got {value!r}")
    if isinstance(control, widgets.Text | widgets.Textarea) and not isinstance(value, str):
        return f"{name} must be text, got {type(value).__name__}"
    return None


class _Strip:
    """Text and control glyphs placed in pixels (x right, y down) on a white strip."""

    def __init__(self, width: int, dpi: float):
        self.width, self.dpi, self.ops = width, dpi, []
        self.renderer = FigureCanvasAgg(Figure(dpi=dpi, layout="none")).get_renderer()

    def measure(self, text: str, font=FONT) -> float:
        return self.renderer.get_text_width_height_descent(text, font, ismath=False)[0]

    def fit(self, text: str, room: float) -> str:
        """``text``, cut with an ellipsis to at most ``room`` pixels."""
        while len(text) > 1 and self.measure(text) > room:
            text = text[:-2] + "…"
        return text

    def text(self, x, y, s, font=FONT, color="black"):
        self.ops.append(lambda ax: ax.text(x, y, s, fontproperties=font, color=color,
                                           va="center", ha="left"))
        return x + self.measure(s, font)

    def box(self, x, y, w, h, face="white", edge=EDGE):
        self.ops.append(lambda ax: ax.add_patch(FancyBboxPatch(
            (x, y - h / 2), w, h, boxstyle="round,pad=0,rounding_size=3", facecolor=face,
            edgecolor=edge, linewidth=1)))

    def render(self, height: int) -> np.ndarray:
        figure = Figure(figsize=(self.width / self.dpi, height / self.dpi), dpi=self.dpi,
                        layout="none")   # not the notebooks' constrained layout
        canvas = FigureCanvasAgg(figure)
        ax = figure.add_axes((0, 0, 1, 1))
        ax.set_xlim(0, self.width)
        ax.set_ylim(height, 0)
        ax.set_axis_off()
        for op in self.ops:
            op(ax)
        canvas.draw()
        return np.asarray(canvas.buffer_rgba())[:, :self.width].copy()


def _control(strip: _Strip, control, x: float, y: float, room: float) -> float:
    """Draw one control at ``(x, y)`` (its left end, its middle row) as the browser shows it;
    return its right end. ``room``: the pixels left on the row for a text box."""
    label = control.description
    if isinstance(control, widgets.Checkbox):
        strip.box(x, y, BOX, BOX, *(BLUE, BLUE) if control.value else ("white", EDGE))
        if control.value:
            strip.text(x + 1.5, y, "✓", FontProperties(size=9, weight="bold"), "white")
        return strip.text(x + BOX + 5, y, label)
    x = strip.text(x, y, label) + GAP if label else x
    if isinstance(control, widgets.ToggleButtons):
        for option in (o[0] if isinstance(o, tuple) else str(o) for o in control.options):
            w = strip.measure(option) + 16
            chosen = option == control.label
            strip.box(x, y, w, 20, *(BLUE, BLUE) if chosen else ("#eeeeee", EDGE))
            strip.text(x + 8, y, option, color="white" if chosen else "black")
            x += w + 2
        return x
    if isinstance(control, widgets.Dropdown | widgets.Text | widgets.Textarea):   # a box
        menu = isinstance(control, widgets.Dropdown)
        shown = str(control.label) if menu else strip.fit(control.value, max(room - x - 12, 40))
        w = strip.measure(shown) + (26 if menu else 12)
        strip.box(x, y, w, 20)
        strip.text(x + 6, y, shown)
        if menu:
            strip.text(x + w - 13, y, "▾")
        return x + w
    if isinstance(control, widgets.SelectionSlider):
        share, value = control.index / max(len(control.options) - 1, 1), str(control.label)
    else:
        low, high, v = control.min, control.max, control.value
        if isinstance(control, widgets.FloatLogSlider):
            v = np.log(v) / np.log(control.base)
        share = (v - low) / (high - low) if high > low else 0.0
        value = format(control.value, getattr(control, "readout_format", "") or "")
    x += 7                                              # the knob's radius
    strip.ops.append(lambda ax: ax.plot([x, x + TRACK], [y, y], color=GREY, linewidth=3,
                                        solid_capstyle="round"))
    strip.ops.append(lambda ax: ax.add_patch(Circle((x + share * TRACK, y), 6.5, facecolor="white",
                                                    edgecolor="#555555", linewidth=1.2)))
    return strip.text(x + TRACK + 7 + GAP, y, value)


def _controls_strip(title, controls, width: int, dpi: float) -> np.ndarray:
    strip, x, y = _Strip(width, dpi), GAP, ROW / 2
    if title:
        strip.text(GAP, y, strip.fit(title, width - 2 * GAP), BOLD)
        y += ROW
    for control in controls.values():
        drawn = len(strip.ops)
        end = _control(strip, control, x, y, float("inf"))
        if end > width - GAP:   # too long: on the next row, or cut to fit a row of its own
            del strip.ops[drawn:]
            x, y = (GAP, y + ROW) if x > GAP else (x, y)
            end = _control(strip, control, x, y, width - GAP)
        x = end + 3 * GAP
    return strip.render(int(y + ROW / 2 + 2))


def _readouts_strip(readouts: dict, width: int, dpi: float) -> np.ndarray:
    strip = _Strip(width, dpi)
    column = min(max((strip.measure(k) for k in readouts), default=0) + 2 * GAP, width * 0.55)
    for i, (name, value) in enumerate(readouts.items()):
        y = 8 + 16 * i + 8
        strip.text(GAP, y, strip.fit(name, column - 2 * GAP), color="#333333")
        strip.text(column, y, strip.fit(value, width - column - GAP))
    return strip.render(16 * len(readouts) + 16)


def still_png(title: str | None, controls: dict, picture: bytes, readouts: dict,
              dpi: float = 80) -> bytes:
    """One PNG: the title and controls as set above ``picture`` (a PNG), ``readouts`` under it."""
    image = np.asarray(Image.open(io.BytesIO(picture)).convert("RGBA"))
    width = image.shape[1]
    parts = [_controls_strip(title, controls, width, dpi), image]
    parts += [_readouts_strip(readouts, width, dpi)] if readouts else []
    out = io.BytesIO()
    Image.fromarray(np.concatenate(parts)).save(out, format="PNG", optimize=True)
    return out.getvalue()
