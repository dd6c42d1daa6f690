"""Live attention widgets: ``core``, ``blit``, ``panels`` and ``controls`` are shared; each other
module holds one notebook's compute functions and widget, named by its slug (``widgets.masking``)."""

from .core import AttentionFrame, AttentionView, LiveAttentionWidget, encode_png

__all__ = ["AttentionFrame", "AttentionView", "LiveAttentionWidget", "encode_png"]
