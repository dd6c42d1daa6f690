"""The README's exercise table lists every registered exercise once, and no skill twice
(issue 24: each skill is asked for once in the course)."""

from __future__ import annotations

import re
from pathlib import Path

from attn_helpers.exercises import EXERCISES

README = Path(__file__).resolve().parents[2] / "README.md"
ROW = re.compile(r"^\|\s*(\d\d)\s*\|\s*`([a-z_]+\.[a-z_]+)`\s*\|([^|]+)\|([^|]+)\|\s*$")


def table_rows() -> list[tuple[str, str, str, str]]:
    text = README.read_text()
    section = text.split("## The exercises", 1)
    assert len(section) == 2, "README.md needs a '## The exercises' section with the table"
    body = section[1].split("\n## ", 1)[0]
    return [tuple(part.strip() for part in m.groups())
            for m in map(ROW.match, body.splitlines()) if m]


def test_the_table_lists_every_registered_exercise_exactly_once():
    keys = [row[1] for row in table_rows()]
    assert len(keys) == len(set(keys)), f"listed twice: {sorted(k for k in keys if keys.count(k) > 1)}"
    assert set(keys) == set(EXERCISES), (f"missing from README: {sorted(set(EXERCISES) - set(keys))}; "
                                         f"not registered: {sorted(set(keys) - set(EXERCISES))}")


def test_each_row_names_its_notebook_and_no_skill_is_asked_twice():
    from attn_helpers.course_map import COURSE

    number = {lesson.slug: lesson.number for lesson in COURSE}
    rows = table_rows()
    for nb, key, _, _ in rows:
        assert number[key.split(".")[0]] == nb, f"{key} is listed under notebook {nb}"
    skills = [row[3].lower() for row in rows]
    assert len(skills) == len(set(skills)), (
        f"a skill asked twice: {sorted({s for s in skills if skills.count(s) > 1})}")
