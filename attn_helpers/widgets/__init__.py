"""Live attention widgets: sliders in, a redrawn heatmap and entropy view out.

``core`` holds the machinery every notebook reuses (frames, the blitted view base and
:class:`LiveAttentionWidget`), ``panels`` the heatmap and entropy panels the views share; each
other module holds one notebook's pure compute function and widget factory, named by the
notebook's slug (``widgets.masking`` for ``05_masking.ipynb``).
"""

from .core import (
    BAR_COLOR,
    HIGHLIGHT_COLOR,
    AttentionFrame,
    AttentionPanel,
    AttentionView,
    BlitFigure,
    BlitView,
    EntropyBars,
    LiveAttentionWidget,
    encode_png,
)
from .panels import CellPainter, TextSprites

__all__ = [
    "BAR_COLOR",
    "HIGHLIGHT_COLOR",
    "AttentionFrame",
    "AttentionPanel",
    "AttentionView",
    "BlitFigure",
    "BlitView",
    "CellPainter",
    "EntropyBars",
    "LiveAttentionWidget",
    "TextSprites",
    "encode_png",
]
