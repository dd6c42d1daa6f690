"""The course's table of contents: the notebooks, their prerequisites, and the map figure."""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass
from pathlib import Path
from textwrap import fill

from matplotlib.axes import Axes
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

__all__ = ["Lesson", "COURSE", "draw_course_map", "write_thumbnails"]

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Lesson:
    number: str
    slug: str
    title: str
    idea: str
    requires: tuple[str, ...]  # direct prerequisites only (the map draws one arrow each)

    @property
    def filename(self) -> str:
        return f"{self.number}_{self.slug}.ipynb"


COURSE = (
    Lesson("00", "start_here", "Start here", "how the course works", ()),
    Lesson("01", "rnn_bottleneck", "The RNN bottleneck",
           "with one context vector, accuracy falls with length; attention keeps a path to every "
           "input", ("00",)),
    Lesson("02", "query_key_value", "Query, key, value", "attention is a soft dictionary lookup",
           ("00",)),
    Lesson("03", "scaling", "Why scale by sqrt(d_k)",
           "variance, softmax saturation and the usable learning rate", ("02",)),
    Lesson("04", "multi_head", "Multi-head attention",
           "on a toy task with two relations, two heads learn one each", ("03",)),
    Lesson("05", "masking", "Masking", "causal, padding and local masks decide who sees whom",
           ("04",)),
    Lesson("06", "cross_attention", "Cross-attention", "decoder queries read encoder keys/values",
           ("01", "05")),
    Lesson("07", "positional_encoding", "Positional encoding",
           "without positions, unmasked attention is blind to order", ("05",)),
    Lesson("08", "complexity", "Complexity",
           "quadratic cost, measured; what tiled, linear, local and ring attention save", ("05",)),
    Lesson("09", "real_model", "A real model",
           "a pretrained MiniLM (6 layers of 12 heads) runs on your attention; what its heads do",
           ("06", "07")),
    Lesson("10", "build_gpt", "Build a GPT",
           "your pieces and your training loop become a small GPT that writes text", ("09",)),
)

# Each box's (column, row), chosen so that no arrow passes through a box or runs along one: 05
# sits level with 07, so its three arrows fan out. A prerequisite in the same column sits above its
# notebook (03 over 04, 09 over 10): that arrow points down.
_LAYOUT = {"00": (0, 2.2), "01": (1, 3.9), "02": (1, 2.2), "03": (2, 2.2), "04": (2, 0.5),
           "05": (3, 2.2), "06": (4, 3.9), "07": (4, 2.2), "08": (4, 0.5), "09": (5, 3.05),
           "10": (5, 1.35)}
_COLUMN, _BOX_WIDTH, _BOX_HEIGHT = 1.25, 1.02, 0.98


def _anchors(count: int, centre: float) -> list[float]:
    """``count`` separate heights on one side of a box, around its centre."""
    step = min(0.22, 0.7 * _BOX_HEIGHT / max(count, 1))
    return [centre + step * ((count - 1) / 2 - k) for k in range(count)]


def draw_course_map(ax: Axes) -> None:
    """The notebooks as boxes, an arrow from each prerequisite, each with its own ends (for a
    13.5 x 6.5 inch figure)."""
    width, height = _BOX_WIDTH, _BOX_HEIGHT
    edges = [(required, lesson.number) for lesson in COURSE for required in lesson.requires]
    across = [e for e in edges if _LAYOUT[e[0]][0] != _LAYOUT[e[1]][0]]  # left to right
    starts, ends = {}, {}
    for number in _LAYOUT:
        outgoing = sorted((e for e in across if e[0] == number), key=lambda e: -_LAYOUT[e[1]][1])
        incoming = sorted((e for e in across if e[1] == number), key=lambda e: -_LAYOUT[e[0]][1])
        starts.update(zip(outgoing, _anchors(len(outgoing), _LAYOUT[number][1]), strict=True))
        ends.update(zip(incoming, _anchors(len(incoming), _LAYOUT[number][1]), strict=True))
    for lesson in COURSE:
        column, y = _LAYOUT[lesson.number]
        x = column * _COLUMN
        ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                    boxstyle="round,pad=0.02", facecolor="#dbe9f6",
                                    edgecolor="#3b75af", linewidth=1.5))
        title = f"{lesson.number} {lesson.title}"  # one line with sqrt(d_k) as math: it fits
        title = title.replace("sqrt(d_k)", r"$\sqrt{d_k}$") if "sqrt" in title else fill(title, 20)
        two_lines = "\n" in title                 # a wrapped title pushes the idea down
        ax.text(x, y + (0.3 if two_lines else 0.32), title, ha="center", va="center",
                fontsize=10.5, fontweight="bold", linespacing=1.0)
        ax.text(x, y - (0.16 if two_lines else 0.08), fill(lesson.idea, 24), ha="center",
                va="center", fontsize=8.5, linespacing=1.1)
    for source, target in edges:
        (x0, y0), (x1, y1) = _LAYOUT[source], _LAYOUT[target]
        if (source, target) in starts:      # from the right side to the left side
            tail = (x0 * _COLUMN + width / 2 + 0.02, starts[source, target])
            head = (x1 * _COLUMN - width / 2 - 0.02, ends[source, target])
        else:                               # same column: from the bottom down to the top
            tail, head = (x0 * _COLUMN, y0 - height / 2 - 0.02), (x1 * _COLUMN, y1 + height / 2 + 0.02)
        ax.add_patch(FancyArrowPatch(tail, head, arrowstyle="-|>", mutation_scale=13,
                                     color="#444444", shrinkA=0, shrinkB=0, linewidth=1.2))
    columns = max(column for column, _ in _LAYOUT.values())
    ax.set_xlim(-width / 2 - 0.05, columns * _COLUMN + width / 2 + 0.05)
    ax.set_ylim(0.5 - height / 2 - 0.05, 3.9 + height / 2 + 0.05)
    ax.axis("off")


def write_thumbnails(root: Path = ROOT, width: int = 260) -> list[Path]:
    """Write ``docs/thumbnails/NN.png`` (``width`` px wide), each notebook's first stored figure."""
    from PIL import Image

    (root / "docs" / "thumbnails").mkdir(parents=True, exist_ok=True)
    written = []
    for lesson in COURSE:
        path = root / "notebooks" / lesson.filename
        outputs = ([o for c in json.loads(path.read_text())["cells"] for o in c.get("outputs", [])
                    if "image/png" in o.get("data", {})] if path.exists() else [])
        if outputs:
            image = Image.open(io.BytesIO(base64.b64decode(outputs[0]["data"]["image/png"])))
            image = image.convert("RGB")
            image.thumbnail((width, width))
            written.append(root / "docs" / "thumbnails" / f"{lesson.number}.png")
            image.save(written[-1], optimize=True)
    return written


def main(argv: list[str] | None = None) -> int:
    """``python -m attn_helpers thumbnails``: refresh the README's pictures."""
    for path in write_thumbnails():
        print(path.relative_to(ROOT))
    return 0
