"""Live attention widgets: sliders in, a redrawn heatmap and entropy view out.

``core`` holds the machinery every notebook reuses (frames, the blitted views and
:class:`LiveAttentionWidget`); each other module holds one notebook's pure compute function and
widget factory.
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
from .lookup import (
    CURVE_TEMPERATURES,
    DEMO_KEYS,
    LookupFrame,
    LookupView,
    lookup_2d_frame,
    lookup_2d_widget,
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
    "CURVE_TEMPERATURES",
    "DEMO_KEYS",
    "LookupFrame",
    "LookupView",
    "lookup_2d_frame",
    "lookup_2d_widget",
]
