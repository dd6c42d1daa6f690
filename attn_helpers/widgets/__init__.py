"""Live attention widgets: ``core``, ``blit``, ``panels`` and ``controls`` are shared; each other
module holds one notebook's compute functions and widget, named by its slug (``widgets.masking``)."""

from .blit import BlitFigure, encode_png
from .core import AttentionFrame, AttentionView, BlitView, LiveAttentionWidget
from .panels import BAR_COLOR, HIGHLIGHT_COLOR, AttentionPanel, CellPainter, EntropyBars, TextSprites

__all__ = ["BAR_COLOR", "HIGHLIGHT_COLOR", "AttentionFrame", "AttentionPanel", "AttentionView",
           "BlitFigure", "BlitView", "CellPainter", "EntropyBars", "LiveAttentionWidget",
           "TextSprites", "encode_png"]
