"""The package's shape (COURSE_DESIGN.md, "The helper package"): every notebook has its stem,
no module is over 350 lines, and the tools are imported by nothing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from attn_helpers.course_map import COURSE

PACKAGE = Path(__file__).resolve().parents[2] / "attn_helpers"
MODULES = sorted(PACKAGE.rglob("*.py"))
TOOLS = {"attn_helpers.__main__", "attn_helpers.train", "attn_helpers.bench",
         "attn_helpers.labserver"}


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(PACKAGE)) for p in MODULES])
def test_no_module_over_350_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= 350, f"{path.relative_to(PACKAGE)} has {lines} lines; split it by concern"


def test_every_notebook_has_its_lesson_widget_and_exercises():
    for lesson in COURSE:
        for tier in ("lessons", "widgets", "exercises"):
            assert (PACKAGE / tier / f"{lesson.slug}.py").exists(), (tier, lesson.slug)


def test_nothing_imports_the_tools():
    for path in MODULES:
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if any(module == t or module.startswith(t + ".") for t in TOOLS):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                base = module.rsplit(".", node.level)[0] if node.level else ""
                target = f"{base}.{node.module}" if node.level else node.module
                assert not any(target == t or target.startswith(t + ".") for t in TOOLS), (
                    f"{module} imports the tool {target}")
