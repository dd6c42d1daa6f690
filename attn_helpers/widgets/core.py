"""Sliders in, a redrawn heatmap and entropy view out: a pure compute function turns control
values into a frame (:class:`AttentionFrame`), a view (:class:`BlitView`) blits it into a PNG, and
:class:`LiveAttentionWidget` shows that PNG in an ``ipywidgets.Image`` under the controls."""

from __future__ import annotations

import asyncio
import base64
import html
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import ipywidgets as widgets
import torch
from matplotlib.figure import Figure

from ..entropy import attention_entropy
from ..training import single_thread
from .blit import BlitFigure, encode_png
from .controls import control_problem, still_png
from .panels import BAR_COLOR, HIGHLIGHT_COLOR, AttentionPanel, EntropyBars

__all__ = ["AttentionFrame", "BlitFigure", "BlitView", "AttentionPanel", "AttentionView",
           "EntropyBars", "LiveAttentionWidget", "encode_png", "BAR_COLOR", "HIGHLIGHT_COLOR"]


@dataclass
class AttentionFrame:
    """``(n_q, n_k)`` ``weights`` in 0..1 with their row and column labels, an optional bool
    ``mask`` (False cells grey, a lower entropy ceiling), an optional ``highlight_row`` and
    ``readouts`` (name -> value shown under the figure). Raises ValueError on mismatched shapes."""

    weights: torch.Tensor
    query_labels: tuple | list
    key_labels: tuple | list
    mask: torch.Tensor | None = None
    highlight_row: int | None = None
    readouts: dict = field(default_factory=dict)

    def __post_init__(self):
        w = torch.as_tensor(self.weights)
        if w.dim() != 2:
            raise ValueError(f"weights must be 2-D (n_q, n_k), got shape {tuple(w.shape)}")
        n_q, n_k = w.shape
        if len(self.query_labels) != n_q or len(self.key_labels) != n_k:
            raise ValueError(f"got {len(self.query_labels)} query labels and {len(self.key_labels)}"
                             f" key labels for weights of shape (n_q, n_k) = {(n_q, n_k)}")
        if self.mask is not None and tuple(torch.as_tensor(self.mask).shape) != (n_q, n_k):
            raise ValueError(f"mask must have the weights' shape {(n_q, n_k)}, got "
                             f"{tuple(self.mask.shape)}")

    @property
    def entropy(self) -> torch.Tensor:
        """``(n_q,)`` entropy of each query row in nats."""
        return attention_entropy(torch.as_tensor(self.weights, dtype=torch.float64))

    @property
    def ceiling(self) -> torch.Tensor:
        """``(n_q,)`` ``ln`` of each row's number of visible keys: its largest entropy."""
        n_q, n_k = torch.as_tensor(self.weights).shape
        visible = torch.full((n_q,), n_k) if self.mask is None else torch.as_tensor(self.mask).sum(-1)
        return visible.double().clamp_min(1.0).log()


class BlitView:
    """Base of every view: a subclass's :meth:`draw` puts a frame into the animated artists of
    its :class:`BlitFigure`; ``update(frame)`` returns the PNG."""

    def __init__(self, figsize: tuple[float, float], dpi: int = 80):
        self.blit = BlitFigure(figsize, dpi)

    @property
    def figure(self) -> Figure:
        return self.blit.figure

    def update(self, frame) -> bytes:
        self.draw(frame)
        return self.blit.render()


class AttentionView(BlitView):
    """One live attention heatmap with its entropy view."""

    def __init__(self, figsize: tuple[float, float] = (8.0, 4.6), *,
                 title: str = "attention weights", max_shape: tuple[int, int] | None = None):
        super().__init__(figsize)
        grid = self.figure.add_gridspec(1, 1, left=0.01, right=0.99, bottom=0.01, top=0.99)
        self.panel = AttentionPanel(self.blit, grid[0], title=title, max_shape=max_shape)

    def draw(self, frame: AttentionFrame) -> None:
        self.panel.set_frame(frame)


#: Moves within this many seconds of the last redraw (a drag) are drawn this much later, once for
#: all; a key press comes a picture's round trip (25 ms or more) after it, so is drawn at once.
COALESCE_S = 0.010


def _format_readout(value) -> str:
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _running_loop():
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class LiveAttentionWidget:
    """Controls, a pure ``compute(**control_values) -> frame`` (a dataclass with ``readouts``) and
    a ``view`` with ``update(frame) -> PNG`` (default :class:`AttentionView`), as one ipywidgets
    box. :attr:`frame`, :attr:`readouts` and :attr:`error` (also shown in red) follow each change.
    Under a running event loop, a drag's moves coalesce (:data:`COALESCE_S`); elsewhere and in
    :meth:`set`, every change draws at once."""

    def __init__(self, compute: Callable, controls: Mapping[str, widgets.ValueWidget], view=None,
                 *, title: str | None = None):
        self.compute, self.controls, self.title = compute, dict(controls), title
        self.view = view or AttentionView()
        self.image = widgets.Image(format="png", layout=widgets.Layout(
            width="auto", max_width="100%", height="auto", align_self="flex-start"))
        self.readout_html, self.error_html = widgets.HTML(), widgets.HTML()
        self._frame, self._error, self.renders = None, None, 0
        self._holding = self._scheduled = False
        self._drawn_at = float("-inf")  # the event loop's time after the last redraw
        for control in self.controls.values():
            control.observe(self._on_change, names="value")
        header = [widgets.HTML(f"<b>{html.escape(title)}</b>")] if title else []
        row = widgets.HBox(list(self.controls.values()), layout=widgets.Layout(flex_flow="row wrap"))
        self.ui = widgets.VBox([*header, row, self.image, self.readout_html, self.error_html])
        self.refresh()

    @property
    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    @property
    def frame(self):
        """The frame on show (a move still waiting is drawn first)."""
        self._flush()
        return self._frame

    @property
    def error(self) -> str | None:
        self._flush()
        return self._error

    @property
    def readouts(self) -> dict:
        """The readouts of the frame on show, as text."""
        frame = self.frame
        return {} if frame is None else {k: _format_readout(v) for k, v in frame.readouts.items()}

    def _on_change(self, _change) -> None:
        if self._holding:
            return
        loop = _running_loop()
        if loop is None or (not self._scheduled and loop.time() - self._drawn_at > COALESCE_S):
            self._draw()                    # a lone move: at once (a timer costs a frame here)
        elif not self._scheduled:
            self._scheduled = True
            loop.call_later(COALESCE_S, self._flush)

    def _flush(self) -> None:
        if self._scheduled:
            self._draw()

    def _draw(self) -> None:
        self.refresh()
        if loop := _running_loop():
            self._drawn_at = loop.time()

    def _show_error(self, message: str) -> None:
        self._error = message
        self.error_html.value = (
            f"<pre style='color:#b00020;white-space:pre-wrap'>{html.escape(message)}</pre>")

    def refresh(self) -> None:
        """Recompute the frame from the controls and redraw; errors are shown, not swallowed."""
        self._scheduled = False
        try:
            with single_thread():  # tiny tensors: threads only add waiting, and results vary
                frame = self.compute(**self.values)
                png = self.view.update(frame)
        except Exception as exc:  # shown to the learner inside the widget
            self._show_error(f"{type(exc).__name__}: {exc}")
            return
        self._frame, self._error, self.error_html.value = frame, None, ""
        self.image.value = png
        self.renders += 1
        rows = "".join(f"<tr><td style='padding-right:1em'>{html.escape(k)}</td>"
                       f"<td><code>{html.escape(v)}</code></td></tr>"
                       for k, v in self.readouts.items())
        self.readout_html.value = f"<table class='attn-readouts'>{rows}</table>"

    def set(self, **values) -> dict:
        """Move several controls with one redraw; return the readouts. A value the control would
        reject or clamp is refused: a message in the widget, the picture kept, and a ValueError
        naming the control (a call from code must not pass silently)."""
        if unknown := set(values) - set(self.controls):
            raise ValueError(f"unknown control(s) {sorted(unknown)}; known: {sorted(self.controls)}")
        for name, value in values.items():
            if problem := control_problem(name, self.controls[name], value):
                self._show_error(problem)
                raise ValueError(problem)
        self._holding = True
        try:
            for name, value in values.items():
                self.controls[name].value = value
        finally:
            self._holding = False
        self.refresh()
        return self.readouts

    def _repr_mimebundle_(self, **kwargs):
        """The widget view, plus, where no kernel runs, a still of the whole widget as
        ``image/png`` and its controls' values as ``text/plain``."""
        bundle = self.ui._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        dpi = self.view.figure.dpi if hasattr(self.view, "figure") else 80
        still = still_png(self.title, self.controls, self.image.value, self.readouts, dpi)
        data["image/png"] = base64.b64encode(still).decode("ascii")
        values = ", ".join(f"{c.description or name} = {c.value!r}"
                           for name, c in self.controls.items())
        data["text/plain"] = (f"{self.title or 'Live widget'} (controls: {', '.join(self.controls)};"
                              f" set to {values}; a still picture here: run the notebook to move "
                              "them)")
        return bundle
