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


def test_every_notebook_is_on_the_course_map_and_linked_from_00():
    listed = {lesson.filename for lesson in COURSE}
    assert NOTEBOOKS and not [p.name for p in NOTEBOOKS if p.name not in listed]
    start_here = (ROOT / "notebooks" / COURSE[0].filename).read_text()
    for lesson in COURSE[1:]:
        assert f"]({lesson.filename})" in start_here, f"00 does not link {lesson.filename}"


# Earlier notebooks a Prerequisites paragraph links without requiring them: 02 names 01 as the
# other way in ("shows *why*; this one, *how*"). Links to later notebooks are forward pointers.
OPTIONAL_MENTIONS = {("02", "01")}


def ancestors(number: str) -> set[str]:
    requires = {lesson.number: lesson.requires for lesson in COURSE}
    found, todo = set(), list(requires[number])
    while todo:
        if (n := todo.pop()) not in found:
            found.add(n)
            todo.extend(requires[n])
    return found


def test_every_earlier_notebook_a_prerequisites_paragraph_links_is_an_ancestor_on_the_map(notebook):
    path, nb = notebook
    number = path.name[:2]
    first = next(c.source for c in nb.cells if c.cell_type == "markdown")
    start = first.lower().find("**prerequisite")
    assert start >= 0, f"{path.name}: no Prerequisites paragraph in the first cell"
    paragraph = first[start:].split("\n\n")[0]
    linked = {t[:2] for t in relative_links(paragraph) if re.match(r"^\d\d_", t)}
    missing = sorted(n for n in linked if n < number and (number, n) not in OPTIONAL_MENTIONS
                     and n not in ancestors(number))
    assert not missing, (f"{path.name} names {missing} as prerequisites, but the course map "
                         f"(course_map.COURSE) does not put them before it")


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
