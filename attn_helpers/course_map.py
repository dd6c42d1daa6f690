"""The course's table of contents: the notebooks, their order and prerequisites, and the map figure.

``python -m attn_helpers.course_map thumbnails`` refreshes the small pictures the README shows for
each notebook (``docs/thumbnails/NN.png``), cut from each notebook's own first figure.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

__all__ = ["Lesson", "COURSE", "ROOT", "notebook_path", "draw_course_map", "first_figure_png",
           "write_thumbnails"]

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
           "one context vector forgets; attention keeps a path to every input", ("00",)),
    Lesson("02", "query_key_value", "Query, key, value", "attention is a soft dictionary lookup",
           ("00",)),
    Lesson("03", "scaling", "Why scale by sqrt(d_k)", "variance, saturation, vanishing gradients",
           ("02",)),
    Lesson("04", "multi_head", "Multi-head attention", "parallel heads learn different relations",
           ("03",)),
    Lesson("05", "masking", "Masking", "causal, padding and local masks decide who sees whom",
           ("02",)),
    Lesson("06", "cross_attention", "Cross-attention", "decoder queries read encoder keys/values",
           ("01", "02")),
    Lesson("07", "positional_encoding", "Positional encoding", "attention is order-blind until told",
           ("05",)),
    Lesson("08", "complexity", "Complexity", "O(n^2) measured, and how efficient attention escapes it",
           ("05",)),
    Lesson("09", "real_model", "A real model",
           "a pretrained Transformer runs on your attention; what its 72 heads do",
           ("04", "06", "07")),
    Lesson("10", "build_gpt", "Build a GPT",
           "your pieces become a small GPT that trains in a minute and writes text",
           ("04", "05", "07")),
)

# Where each lesson's box sits on the map: (column, row); arrows follow `requires`.
_LAYOUT = {"00": (0, 1.5), "01": (1, 0.4), "02": (1, 2.6), "03": (2, 3.6), "04": (3, 3.6),
           "05": (2, 2.0), "06": (2, 0.4), "07": (3, 2.0), "08": (3, 0.4), "09": (4, 2.0),
           "10": (4, 3.6)}


def notebook_path(lesson: Lesson, root: Path = ROOT) -> Path:
    return root / "notebooks" / lesson.filename


def draw_course_map(ax: Axes) -> None:
    """Draw the notebooks as boxes, left to right, with an arrow from each prerequisite."""
    width, height = 0.84, 0.72
    for lesson in COURSE:
        x, y = _LAYOUT[lesson.number]
        ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                    boxstyle="round,pad=0.02", facecolor="#dbe9f6",
                                    edgecolor="#3b75af", linewidth=1.5))
        ax.text(x, y + 0.17, f"{lesson.number} {lesson.title}", ha="center", va="center",
                fontsize=8.5, fontweight="bold")
        ax.text(x, y - 0.12, _wrap(lesson.idea, 30), ha="center", va="center", fontsize=6.5)
        for required in lesson.requires:
            rx, ry = _LAYOUT[required]
            ax.add_patch(FancyArrowPatch((rx + width / 2, ry), (x - width / 2, y),
                                         arrowstyle="-|>", mutation_scale=12, color="#555555",
                                         connectionstyle="arc3,rad=0.08", linewidth=1))
    ax.set_xlim(-0.55, 4.55)
    ax.set_ylim(-0.1, 4.1)
    ax.axis("off")


def _wrap(text: str, width: int) -> str:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join([*lines, line])


def first_figure_png(notebook: Path) -> bytes | None:
    """The first PNG output stored in ``notebook``, or None."""
    nb = json.loads(notebook.read_text())
    for cell in nb["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" in data:
                return base64.b64decode(data["image/png"])
    return None


def write_thumbnails(root: Path = ROOT, width: int = 260) -> list[Path]:
    """Write ``docs/thumbnails/NN.png`` (``width`` px wide) for every notebook that exists."""
    from PIL import Image

    out_dir = root / "docs" / "thumbnails"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for lesson in COURSE:
        path = notebook_path(lesson, root)
        png = first_figure_png(path) if path.exists() else None
        if png is None:
            continue
        image = Image.open(io.BytesIO(png)).convert("RGB")
        image.thumbnail((width, width))
        target = out_dir / f"{lesson.number}.png"
        image.save(target, optimize=True)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_helpers.course_map")
    parser.add_argument("command", choices=["thumbnails"])
    parser.parse_args(argv)
    for path in write_thumbnails():
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
