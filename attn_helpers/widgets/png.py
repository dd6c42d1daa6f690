"""The PNG encoder behind every widget move (see :func:`encode_png`)."""

from __future__ import annotations

import struct
import zlib

import numpy as np

__all__ = ["encode_png"]


def _png_chunk(tag: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(tag + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)


def encode_png(rgba: np.ndarray) -> bytes:
    """Encode an ``(h, w, 4)`` uint8 canvas buffer as an RGBA PNG.

    A minimal encoder (no row filters, zlib level 1): a plot with large flat areas compresses
    well anyway. Kept instead of Pillow because every slider move pays for it: on a 672 x 552
    widget canvas it took 2.1 ms of CPU against 6.6 ms for Pillow at ``compress_level=1``
    (measured with ``time.thread_time``, the PNGs within 5 % of each other in size).
    """
    if rgba.dtype != np.uint8 or rgba.ndim != 3 or rgba.shape[2] != 4:
        raise ValueError(f"rgba must be a uint8 array (h, w, 4), got {rgba.dtype} {rgba.shape}")
    height, width = rgba.shape[:2]
    rows = np.empty((height, 1 + 4 * width), dtype=np.uint8)
    rows[:, 0] = 0                                             # first byte of a row: filter 0
    rows[:, 1:] = rgba.reshape(height, -1)
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)  # 8-bit RGBA, no interlace
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(rows, 1))  # the array's buffer: no bytes copy
        + _png_chunk(b"IEND", b"")
    )
