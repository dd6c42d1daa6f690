"""Honest progress in every stored notebook: a reference solution never defines a learner's name
nor counts as their pass, and the stored Run All (stubs unsolved) reports no exercise passed."""

from __future__ import annotations

import ast
import re

import pytest

from attn_helpers.exercises import EXERCISES


def _slug(path) -> str:
    return path.stem.split("_", 1)[1]


def _is_solution(cell) -> bool:
    """Tagged ``solution``, stored collapsed, or opening with '# Reference solution'."""
    meta = cell.get("metadata", {})
    return ("solution" in meta.get("tags", []) or bool(meta.get("jupyter", {}).get("source_hidden"))
            or cell.source.lstrip().lower().startswith("# reference solution"))


def _tree(cell) -> ast.Module:
    # IPython magics and shell escapes are not Python: blank them before parsing.
    source = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                       for line in cell.source.splitlines())
    return ast.parse(source)


def _defined_names(tree: ast.Module) -> list[str]:
    names = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            names += [n.id for n in ast.walk(node)
                      if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names += [(a.asname or a.name).split(".")[0] for a in node.names]
    return names


def _text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    return output.get("data", {}).get("text/plain", "")


def test_a_reference_solution_never_stands_for_the_learners_function(notebook):
    """A solution cell is tagged ``solution``, stored collapsed, and defines only ``*_solution``."""
    path, nb = notebook
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and _is_solution(cell):
            where = f"{path.name} cell {index}"
            learner_names = [n for n in _defined_names(_tree(cell)) if not n.endswith("_solution")
                             and not n.startswith("_")]
            assert not learner_names, f"{where}: a solution cell defines {learner_names}"
            assert cell.metadata.get("jupyter", {}).get("source_hidden") and "solution" in (
                cell.metadata.get("tags", [])), f"{where}: a solution cell is tagged and collapsed"


def test_run_all_with_the_stubs_unsolved_reports_no_exercise_passed(notebook):
    path, nb = notebook
    slug = _slug(path)
    keys = [k for k, ex in EXERCISES.items() if ex.slug == slug]
    if not keys:
        pytest.skip(f"{path.name} has no registered exercises")
    progress_cells = [c for c in nb.cells if c.cell_type == "code"
                      and re.search(r"progress\(\s*(slug\s*=\s*)?['\"]" + slug, c.source)]
    assert progress_cells, f"{path.name}: no cell shows exercises.progress(slug={slug!r})"
    shown = "".join(_text(o) for c in progress_cells for o in c.outputs)
    assert re.search(rf"\b0 of {len(keys)} passed", shown), (
        f"{path.name}: the stored progress should read '0 of {len(keys)} passed', got {shown[:300]!r}")
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or _is_solution(cell):
            continue
        for output in cell.outputs:
            text = _text(output)
            assert not re.search(r"^Passed:", text, flags=re.M), (
                f"{path.name} cell {index}: a stored output says an exercise passed: {text[:200]!r}")
            for done, total in re.findall(r"\b(\d+) of (\d+) passed", text):
                assert done == "0", f"{path.name} cell {index}: stored progress says {done} of {total}"


def _stubs(nb) -> list[int]:
    """The cells with a stub (raises NotImplementedError) and a checker call, not solutions."""
    return [i for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and not _is_solution(c) and "raise NotImplementedError" in c.source
            and re.search(r"\bcheck_\w+\(", c.source)]


def test_every_exercise_follows_the_template(notebook):
    """Each exercise: "Exercise N" (in order) in markdown, the stub with its checker call, a "Stuck?"
    cell, the hidden ``<name>_solution``, a cell using the learner's function; one progress cell
    (``exercises.progress(slug=...)``) ends them."""
    path, nb = notebook
    if not any(ex.slug == _slug(path) for ex in EXERCISES.values()):
        pytest.skip("no exercises")
    stubs = _stubs(nb)
    assert stubs, "no cell holds a stub (raise NotImplementedError) together with its checker call"
    progress = [i for i, c in enumerate(nb.cells)
                if c.cell_type == "code" and "exercises.progress(slug=" in c.source]
    problems = [] if len(progress) == 1 else [f"{len(progress)} progress cells, expected 1"]
    ends = [*stubs[1:], progress[-1] if progress else len(nb.cells)]
    for number, (i, end) in enumerate(zip(stubs, ends, strict=True), start=1):
        name = re.search(r"^(?:def|class) (\w+)", nb.cells[i].source, re.M).group(1)
        start = stubs[number - 2] + 1 if number > 1 else 0
        heading = "\n".join(c.source for c in nb.cells[start:i] if c.cell_type == "markdown")
        if f"Exercise {number}" not in heading:
            problems.append(f"cell {i} ({name}): its task is not headed 'Exercise {number}'")
        after = nb.cells[i + 1:end]
        if len(after) < 3:
            problems.append(f"cell {i} ({name}): expected Stuck?, solution and follow-up cells")
            continue
        if not (after[0].cell_type == "markdown" and after[0].source.startswith("Stuck?")):
            problems.append(f"cell {i + 1} ({name}): a 'Stuck?' cell must follow the stub")
        if not (_is_solution(after[1]) and f"{name}_solution" in after[1].source):
            problems.append(f"cell {i + 2} ({name}): the solution cell must define {name}_solution")
        if not any(c.cell_type == "code" and not _is_solution(c)
                   and re.search(rf"\b{re.escape(name)}\b(?!_solution)", c.source) for c in after[2:]):
            problems.append(f"exercise {number} ({name}): no follow-up cell uses the learner's "
                            f"function before the next exercise")
    assert not problems, "\n".join(problems)
