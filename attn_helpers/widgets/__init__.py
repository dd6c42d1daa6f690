"""Live attention widgets. ``core`` holds what every notebook reuses (frames, the blitted view,
:class:`LiveAttentionWidget`), ``panels`` the heatmap and entropy panels the views share, and each
other module one notebook's pure compute functions and widget factory, named by its slug
(``widgets.masking`` for ``05_masking.ipynb``)."""

from .blit import BlitFigure, encode_png
from .core import AttentionFrame, AttentionView, BlitView, LiveAttentionWidget
from .panels import BAR_COLOR, HIGHLIGHT_COLOR, AttentionPanel, CellPainter, EntropyBars, TextSprites

__all__ = ["BAR_COLOR", "HIGHLIGHT_COLOR", "AttentionFrame", "AttentionPanel", "AttentionView",
           "BlitFigure", "BlitView", "CellPainter", "EntropyBars", "LiveAttentionWidget",
           "TextSprites", "encode_png"]
