"""Every notebook follows the template and is on the course map; every link in the course resolves."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import NOTEBOOKS

from attn_helpers.course_map import COURSE

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(text: str) -> list[str]:
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z]+:", t) and not t.startswith("#")]


def test_every_notebook_is_on_the_course_map_and_in_00s_table_with_the_same_idea():
    listed = {lesson.filename for lesson in COURSE}
    assert NOTEBOOKS and not [p.name for p in NOTEBOOKS if p.name not in listed]
    table = (ROOT / "notebooks" / COURSE[0].filename).read_text()
    for lesson in COURSE[1:]:
        assert f"[{lesson.number} · {lesson.title}]({lesson.filename}) | {lesson.idea} |" in table


def test_the_template_title_goals_prerequisites_sections_and_link_to_the_next(notebook):
    path, nb = notebook
    markdown = [c.source for c in nb.cells if c.cell_type == "markdown"]
    assert nb.cells[0].cell_type == "markdown" and markdown[0].startswith(f"# {path.name[:2]} · "), (
        f"{path.name}: the first cell is the title, '# {path.name[:2]} · ...'")
    first = markdown[0].lower()
    assert ("learn" in first or "goals" in first) and "prerequisite" in first, (
        f"{path.name}: the first cell states the learning goals and prerequisites")
    titles = [line.lower() for text in markdown for line in text.splitlines() if line.startswith("#")]
    for section in ("check yourself", "key takeaways"):
        assert any(section in t for t in titles), f"{path.name}: no '{section}' section"
    names = [lesson.filename for lesson in COURSE if (ROOT / "notebooks" / lesson.filename).exists()]
    following = names[(names.index(path.name) + 1) % len(names)]
    assert following in relative_links(markdown[-1]), f"{path.name}: the last cell links {following}"


def test_links_between_notebooks_resolve(notebook):
    path, nb = notebook
    for text in (c.source for c in nb.cells if c.cell_type == "markdown"):
        for target in relative_links(text):
            assert (path.parent / target.split("#")[0]).exists(), f"{path.name}: broken link {target}"


def test_readme_links_every_notebook_and_its_picture_and_all_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    links = relative_links(readme)
    for target in links:
        assert (ROOT / target.split("#")[0]).exists(), f"README.md: broken link {target}"
    for path in NOTEBOOKS:
        assert f"notebooks/{path.name}" in links, f"README.md does not link {path.name}"
        assert f"docs/thumbnails/{path.name[:2]}.png" in readme, f"README.md lacks {path.name[:2]}.png"
