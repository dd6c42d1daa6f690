"""Every notebook follows the course template, and every link in the course resolves.

Notebooks are discovered by glob, so a notebook added later is checked without editing this file;
it must also be listed in ``attn_helpers.course_map.COURSE`` (the map and the README use it).
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from attn_helpers.course_map import COURSE

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def markdown_cells(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "markdown"]


def headings(nb) -> list[str]:
    return [line.lstrip("#").strip() for text in markdown_cells(nb) for line in text.splitlines()
            if line.startswith("#")]


def relative_links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z]+:", t) and not t.startswith("#")]


def existing_lessons():
    return [lesson for lesson in COURSE if (ROOT / "notebooks" / lesson.filename).exists()]


@pytest.fixture(params=NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def notebook(request):
    return request.param, nbformat.read(request.param, as_version=4)


def test_every_notebook_is_on_the_course_map():
    listed = {lesson.filename for lesson in COURSE}
    unlisted = [p.name for p in NOTEBOOKS if p.name not in listed]
    assert not unlisted, f"add these to attn_helpers.course_map.COURSE: {unlisted}"


def test_title_goals_and_prerequisites_open_the_notebook(notebook):
    path, nb = notebook
    first = nb.cells[0]
    number = path.name[:2]
    assert first.cell_type == "markdown", f"{path.name}: the first cell must be the title cell"
    assert first.source.startswith(f"# {number} · "), f"{path.name}: title must read '# {number} · ...'"
    lowered = first.source.lower()
    assert "learn" in lowered or "goals" in lowered, f"{path.name}: no learning goals in the first cell"
    assert "prerequisite" in lowered, f"{path.name}: no prerequisites in the first cell"


def test_has_check_yourself_and_key_takeaways(notebook):
    path, nb = notebook
    titles = [h.lower() for h in headings(nb)]
    assert any("check yourself" in h for h in titles), f"{path.name}: no 'Check yourself' section"
    assert any("key takeaways" in h for h in titles), f"{path.name}: no 'Key takeaways' section"


def test_has_a_live_widget(notebook):
    path, nb = notebook
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert any(WIDGET_MIME in o.get("data", {}) for o in outputs), f"{path.name}: no live widget"


def test_ends_with_a_link_to_the_next_notebook(notebook):
    path, nb = notebook
    lessons = existing_lessons()
    names = [lesson.filename for lesson in lessons]
    if path.name not in names:
        pytest.fail(f"{path.name} is not on the course map")
    position = names.index(path.name)
    expected = names[position + 1] if position + 1 < len(names) else names[0]
    last = markdown_cells(nb)[-1]
    assert expected in relative_links(last), (
        f"{path.name}: its last cell should link to the next notebook, {expected}")


def test_links_between_notebooks_resolve(notebook):
    path, nb = notebook
    for text in markdown_cells(nb):
        for target in relative_links(text):
            resolved = (path.parent / target.split("#")[0]).resolve()
            assert resolved.exists(), f"{path.name}: broken link {target}"


def test_readme_links_every_notebook_and_its_picture_and_all_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    links = relative_links(readme)
    for target in links:
        assert (ROOT / target.split("#")[0]).exists(), f"README.md: broken link {target}"
    for path in NOTEBOOKS:
        assert f"notebooks/{path.name}" in links, f"README.md does not link {path.name}"
        thumbnail = f"docs/thumbnails/{path.name[:2]}.png"
        assert thumbnail in readme, f"README.md does not show {thumbnail}"
