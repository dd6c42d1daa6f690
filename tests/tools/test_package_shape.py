"""The package's shape (COURSE_DESIGN.md, "The helper package"): every notebook has its modules,
imports run one way (no circles), private names stay in their module, nothing is loaded by name,
and the tools are imported by nothing."""

from __future__ import annotations

import ast
from pathlib import Path

from attn_helpers.course_map import COURSE

PACKAGE = Path(__file__).resolve().parents[2] / "attn_helpers"
MODULES = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
           for p in sorted(PACKAGE.rglob("*.py"))}
TOOLS = ("attn_helpers.__main__", "attn_helpers.bench", "attn_helpers.labserver")


def imports(module: str) -> list[tuple[str, list[str]]]:
    """``(target module, imported names)`` for every import statement of ``module``."""
    path, found = MODULES[module], []
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found.append((target, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
    return found


def edges(module: str) -> set[str]:
    """The package's modules that ``module`` imports (not an ``__init__``: it only re-exports)."""
    out = set()
    for target, names in imports(module):
        for candidate in (target, *(f"{target}.{n}" for n in names)):
            if candidate in MODULES and candidate != module and MODULES[candidate].name != "__init__.py":
                out.add(candidate)
    return out


def test_every_notebook_has_its_lesson_widget_and_exercises():
    for lesson in COURSE:
        for tier in ("lessons", "widgets", "exercises"):
            assert (PACKAGE / tier / f"{lesson.slug}.py").exists(), (tier, lesson.slug)


def test_no_import_circles():
    graph = {m: edges(m) for m in MODULES}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            assert m != start, f"{start} imports itself through {sorted(seen)}"
            todo += [] if m in seen else graph[m]
            seen.add(m)


def test_private_names_stay_in_their_module():
    private = [f"{m}: from {t} import {n}" for m in MODULES for t, names in imports(m)
               if t.startswith("attn_helpers") for n in names
               if n.startswith("_") and not n.startswith("__")]
    assert len(private) <= 5, "\n".join(private)


def test_nothing_is_loaded_by_name_and_nothing_imports_the_tools():
    for module in MODULES:
        if module.startswith(TOOLS):
            continue
        for target, _ in imports(module):
            assert not target.startswith(TOOLS), f"{module} imports the tool {target}"
        assert "import_module(" not in MODULES[module].read_text(), f"{module} uses import_module"
