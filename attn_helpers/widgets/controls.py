"""What a control may be set to: ``LiveAttentionWidget.set`` refuses, with a message shown in the
widget, a value the control would reject or silently clamp, and keeps the last good picture."""

from __future__ import annotations

import ipywidgets as widgets

__all__ = ["control_problem"]


def control_problem(name: str, control, value) -> str | None:
    """Why ``value`` cannot be set on ``control`` (a message for the widget), or ``None``."""
    if isinstance(control, widgets.Checkbox | widgets.ToggleButton):
        ok = isinstance(value, bool)
        return None if ok else f"{name} must be True or False, got {value!r}"
    if hasattr(control, "options"):
        allowed = [o[1] if isinstance(o, tuple) else o for o in control.options]
        return None if value in allowed else f"{name} must be one of {allowed}, got {value!r}"
    if hasattr(control, "min") and hasattr(control, "max"):
        kind = int if isinstance(control.value, int) else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind):
            return f"{name} must be a number, got {value!r}"
        low, high = control.min, control.max
        if isinstance(control, widgets.FloatLogSlider):  # its min and max are exponents
            low, high = control.base ** low, control.base ** high
        if not low <= value <= high:
            return f"{name} must be between {low:g} and {high:g}, got {value!r}"
        return None
    if isinstance(control, widgets.Text | widgets.Textarea) and not isinstance(value, str):
        return f"{name} must be text, got {type(value).__name__}"
    return None
