"""Sphinx configuration of the course's static site (built by ``docs/site/build.py``).

The generator is Sphinx with MyST-NB (notebooks read as they are stored, never executed) and the
Sphinx Book Theme. Everything the pages load is bundled into the site: MathJax 3 comes from the
``sphinx-mathjax-offline`` package, the theme ships its own styles and icon fonts, and the
ipywidgets scripts (which would load from a CDN) are turned off: a widget shows the PNG its output
stores as a fallback. ``build.py`` prepares a copy of the notebooks (tags and cell metadata) and
writes ``_site_fold.json``, the headings stored collapsed in JupyterLab; the small transform below
folds those sections here too.
"""

from __future__ import annotations

import json
import warnings
from importlib.metadata import distribution
from pathlib import Path

from docutils import nodes

project = "Attention, step by step"
html_title = "Attention, step by step"

extensions = [
    "myst_nb",
    "sphinx_togglebutton",
    "sphinx_design",                # the landing page's cards
    "sphinx.ext.mathjax",
]
exclude_patterns = ["_build", "**.ipynb_checkpoints", "_site_fold.json"]

# --- notebooks: read the stored outputs, never execute ---------------------------------------
nb_execution_mode = "off"
nb_merge_streams = True
# A widget's display bundle holds the widget view and a static PNG: show the PNG, load no widget JS.
nb_mime_priority_overrides = [("*", "application/vnd.jupyter.widget-view+json", None)]
nb_ipywidgets_js = {}
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
suppress_warnings = ["mystnb.unknown_mime_type"]

# --- math: MathJax 3 from the sphinx-mathjax-offline package, copied into _static/mathjax -------
# (its files only: the package's own Sphinx hook would force a serial read)
MATHJAX = distribution("sphinx-mathjax-offline").locate_file("sphinx-mathjax-offline/static")
html_static_path = [str(MATHJAX)]
mathjax_path = "mathjax/tex-chtml.js"
# The stored notebooks are nbformat 4.4 (no cell ids); nothing is written back to them.
warnings.filterwarnings("ignore", message="Cell is missing an id field")

# --- theme -----------------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_theme_options = {
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "use_source_button": False,
    "show_prev_next": True,
    "secondary_sidebar_items": {"**": ["page-toc"], "index": []},
    "footer_content_items": [],
}
html_copy_source = False
html_show_sourcelink = False
html_show_sphinx = False
html_last_updated_fmt = None
html_permalinks = True

# Going deeper (and any other heading stored collapsed) folds into a toggle; its hint:
togglebutton_hint = "Show this section"
togglebutton_hint_hide = "Hide this section"


def _fold_collapsed_sections(app, doctree) -> None:
    """Wrap the body of each section whose heading JupyterLab stores collapsed in a ``toggle``
    container (sphinx-togglebutton folds it). A closing "Next: ..." line stays outside."""
    folds = Path(app.srcdir) / "_site_fold.json"
    if not folds.exists():
        return
    titles = json.loads(folds.read_text()).get(app.env.docname, [])
    for section in list(doctree.findall(nodes.section)):
        title = section.next_node(nodes.title)
        if title is None or " ".join(title.astext().split()) not in titles:
            continue
        paragraphs = list(section.findall(nodes.paragraph))
        keep = []
        if paragraphs and paragraphs[-1].astext().startswith("Next:"):
            keep = [paragraphs[-1]]
            paragraphs[-1].parent.remove(paragraphs[-1])
        body = section.children[1:]
        del section[1:]
        section += nodes.container("", *body, classes=["toggle"])
        section.extend(keep)


def setup(app):
    # before Sphinx collects the page's table of contents: a folded section's subsections leave
    # the "Contents" sidebar (their anchors would be hidden)
    app.connect("doctree-read", _fold_collapsed_sections, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
