#!/usr/bin/env python3
"""Build the course's static site from the stored notebooks, without executing them.

    python docs/site/build.py [--out site]

(``python3 course.py site`` runs this with the course's environment.) The generator is Sphinx
with MyST-NB and the Sphinx Book Theme, configured in ``docs/site/conf.py``. This script only
prepares its input, in a temporary folder (``notebooks/`` is never written):

- a copy of every notebook, in the course's order (``attn_helpers/course_map.py``), where
  - a reference-solution cell (tag ``solution``) gets the tag ``hide-input`` (folded, with its own
    "show" line), and
  - a cell whose output is a live widget gets a caption under the widget's stored picture saying
    that it is live in JupyterLab;
- ``_site_fold.json``: the headings stored collapsed in JupyterLab (``jp-MarkdownHeadingCollapsed``,
  e.g. "Going deeper"), which ``conf.py`` folds;
- ``index.md``, the landing page: the course map (each notebook with its one idea, its
  prerequisites and its thumbnail from ``docs/thumbnails/``).

The site is self-contained: it opens from the file system and loads nothing from the network.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = Path(__file__).resolve().parent
NOTEBOOKS = ROOT / "notebooks"
THUMBNAILS = ROOT / "docs" / "thumbnails"
COURSE_MAP = ROOT / "attn_helpers" / "course_map.py"

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_CAPTION = ("*Live in JupyterLab:* this is the picture the notebook stores; run the notebook "
                  "(`python3 course.py lab`) and the controls redraw it as you move them.")
SOLUTION_SHOW, SOLUTION_HIDE = "Show the reference solution", "Hide the reference solution"


def course() -> list[dict]:
    """``COURSE`` from ``attn_helpers/course_map.py``, read by parsing the file (importing the
    package would import torch): one dict per lesson with number, slug, title, idea, requires."""
    fields = ("number", "slug", "title", "idea", "requires")
    for node in ast.walk(ast.parse(COURSE_MAP.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COURSE"
                                                for t in node.targets):
            return [dict(zip(fields, (ast.literal_eval(arg) for arg in call.args), strict=True))
                    for call in node.value.elts]
    raise SystemExit(f"build.py: no COURSE in {COURSE_MAP}")


def heading(text: str) -> str:
    """The first Markdown heading's text, or ''."""
    match = re.search(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M)
    return " ".join(match.group(1).split()) if match else ""


def prepare(notebook: dict) -> tuple[dict, list[str]]:
    """The notebook as the site shows it, and the headings it stores collapsed."""
    notebook["metadata"].pop("widgets", None)       # no widget state: no widget scripts either
    folded = []
    for cell in notebook["cells"]:
        meta = cell.setdefault("metadata", {})
        source = "".join(cell.get("source", ""))
        if cell["cell_type"] == "markdown" and meta.get("jp-MarkdownHeadingCollapsed"):
            folded.append(re.sub(r"[*_`$]", "", heading(source)))
        if cell["cell_type"] != "code":
            continue
        tags = meta.setdefault("tags", [])
        mystnb = meta.setdefault("mystnb", {})
        if "solution" in tags:
            tags.append("hide-input")
            mystnb.update(code_prompt_show=SOLUTION_SHOW, code_prompt_hide=SOLUTION_HIDE)
        if any(WIDGET_MIME in out.get("data", {}) for out in cell.get("outputs", [])):
            mystnb["figure"] = {"caption": WIDGET_CAPTION, "classes": "widget-picture"}
            # the widget's stored picture is its fallback in the same display bundle
            if not all("image/png" in out["data"] for out in cell["outputs"]
                       if WIDGET_MIME in out.get("data", {})):
                raise SystemExit("build.py: a widget output without a stored PNG fallback")
    return notebook, folded


def landing_page(lessons: list[dict], titles: dict[str, str]) -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    intro = readme.split("\n\n")[1].strip() if "\n\n" in readme else ""
    cards = []
    for lesson in lessons:
        number, page = lesson["number"], f"{lesson['number']}_{lesson['slug']}"
        picture = (f":img-top: thumbnails/{number}.png\n:img-alt: notebook {number}'s first figure\n"
                   if (THUMBNAILS / f"{number}.png").exists() else "")
        after = ("after " + ", ".join(lesson["requires"])) if lesson["requires"] else "start here"
        cards.append(f""":::{{grid-item-card}} {number} · {titles[number]}
{picture}:link: {page}
:link-type: doc
:footer: {after}

{lesson['idea']}
:::
""")
    toctree = "\n".join(f"{lesson['number']}_{lesson['slug']}" for lesson in lessons)
    return f"""# Attention, step by step

{intro}

These pages show the notebooks as they are stored, outputs included; each widget shows its
stored picture. To run the code and move the sliders, clone the course and run
`python3 course.py lab` (see the README).

## The course map

Read the notebooks in order; each card gives the one idea you leave with and the notebooks it
builds on.

::::{{grid}} 1 2 3 3
:gutter: 3

{chr(10).join(cards)}
::::

```{{toctree}}
:hidden:
:maxdepth: 1

{toctree}
```
"""


def build(out: Path, quiet: bool = True, strict: bool = False) -> float:
    started = time.monotonic()
    lessons = course()
    out = out.resolve()
    if out.exists() and any(out.iterdir()) and not (out / ".buildinfo").exists():
        raise SystemExit(f"build.py: {out} exists and is not a site built here; not replacing it")
    with tempfile.TemporaryDirectory(prefix="attn-site-") as scratch:
        src = Path(scratch) / "src"
        src.mkdir()
        folds, titles = {}, {}
        for lesson in lessons:
            stem = f"{lesson['number']}_{lesson['slug']}"
            notebook = json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text(encoding="utf-8"))
            notebook, folds[stem] = prepare(notebook)
            first = "".join(notebook["cells"][0]["source"]) if notebook["cells"] else ""
            titles[lesson["number"]] = (re.sub(r"^\d+\s*·\s*", "", heading(first))
                                        or lesson["title"])
            (src / f"{stem}.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
        (src / "_site_fold.json").write_text(json.dumps(folds), encoding="utf-8")
        shutil.copytree(THUMBNAILS, src / "thumbnails")
        (src / "index.md").write_text(landing_page(lessons, titles), encoding="utf-8")
        # Sphinx builds inside the scratch folder (MyST-NB writes its jupyter_execute/ beside
        # the output folder), then the finished site replaces ``out``.
        html = Path(scratch) / "html"
        command = [sys.executable, "-m", "sphinx", "-b", "html", "-j", "auto", "-c", str(CONF_DIR),
                   "-d", str(Path(scratch) / "doctrees"), *(["-q"] if quiet else []),
                   *(["-W", "--keep-going"] if strict else []),
                   str(src), str(html)]
        result = subprocess.run(command, cwd=ROOT)
        if result.returncode != 0:
            raise SystemExit(f"build.py: Sphinx failed (exit {result.returncode})")
        shutil.rmtree(html / "_sources", ignore_errors=True)     # empty: no sources are copied
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(html, out)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "site",
                        help="the folder to build into (default: site/ in the repository)")
    parser.add_argument("--verbose", action="store_true", help="Sphinx's full output")
    parser.add_argument("--strict", action="store_true",
                        help="fail on any Sphinx warning (a broken link, ...), as the tests do")
    args = parser.parse_args(argv)
    seconds = build(args.out, quiet=not args.verbose, strict=args.strict)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"site built in {seconds:.0f} s: {args.out.resolve() / 'index.html'} "
          f"({size / 2**20:.1f} MB); open it in a browser, or publish the folder as it is")


if __name__ == "__main__":
    main()
