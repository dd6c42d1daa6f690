"""Live attention widgets: sliders in, a redrawn heatmap and entropy view out.

``core`` holds the machinery every notebook reuses (frames, the blitted views and
:class:`LiveAttentionWidget`); each other module holds one notebook's pure compute function and
widget factory, named by the notebook's slug (``widgets.masking`` for ``05_masking.ipynb``).
"""

from .core import (
    BAR_COLOR,
    HIGHLIGHT_COLOR,
    AttentionFrame,
    AttentionPanel,
    AttentionView,
    BlitFigure,
    LiveAttentionWidget,
    encode_png,
)

__all__ = [
    "BAR_COLOR",
    "HIGHLIGHT_COLOR",
    "AttentionFrame",
    "AttentionPanel",
    "AttentionView",
    "BlitFigure",
    "LiveAttentionWidget",
    "encode_png",
]
