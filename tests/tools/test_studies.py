"""``python3 course.py studies``: a study's fingerprint covers its own source, every package module
it imports (transitively) and the torch version, and ``--check`` names the command that re-runs a
stale study."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def course(tmp_path, monkeypatch):
    """course.py pointed at a small tree: a package with three modules and one study."""
    spec = importlib.util.spec_from_file_location("course_under_test", ROOT / "course.py")
    course = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(course)
    pkg = tmp_path / "attn_helpers"
    (pkg / "lessons").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .core import f\n")
    (pkg / "core.py").write_text("def f(): return 1\n")
    (pkg / "lessons" / "__init__.py").write_text("")
    (pkg / "lessons" / "toy.py").write_text("from ..core import f\n")
    (pkg / "unused.py").write_text("x = 1\n")
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "toy.py").write_text(
        'import json\nfrom attn_helpers.lessons import toy\nRECORDS = ["rec.json"]\n'
        'if __name__ == "__main__":\n    json.dump({"a": 1}, open("rec.json", "w"))\n')
    monkeypatch.setattr(course, "ROOT", tmp_path)
    monkeypatch.setattr(course, "STUDIES", tmp_path / "studies")
    monkeypatch.setattr(course, "FINGERPRINTS", tmp_path / "studies" / "fingerprints.json")
    monkeypatch.setattr(course, "setup", lambda: None)
    monkeypatch.setattr(course, "torch_version", lambda: "2.13.0")
    return course


def test_the_fingerprint_follows_every_imported_module_and_nothing_else(course):
    study = course.STUDIES / "toy.py"
    names = {p.relative_to(course.ROOT).as_posix() for p in course.study_sources(study)}
    assert names == {"studies/toy.py", "attn_helpers/__init__.py", "attn_helpers/core.py",
                     "attn_helpers/lessons/__init__.py", "attn_helpers/lessons/toy.py"}
    before = course.fingerprint(study, "2.13.0")
    (course.ROOT / "attn_helpers" / "unused.py").write_text("x = 2\n")
    assert course.fingerprint(study, "2.13.0") == before
    (course.ROOT / "attn_helpers" / "core.py").write_text(
        '# a comment\n\ndef f():\n    """A docstring."""\n    return 1\n')
    assert course.fingerprint(study, "2.13.0") == before          # comments and docstrings
    (course.ROOT / "attn_helpers" / "core.py").write_text("def f(): return 2\n")
    assert course.fingerprint(study, "2.13.0") != before
    (course.ROOT / "attn_helpers" / "core.py").write_text('def f(): return "2"\n')
    assert course.fingerprint(study, "2.13.0") != before          # a string that is not a docstring
    assert course.fingerprint(study, "2.14.0") != course.fingerprint(study, "2.13.0")


def test_check_passes_on_a_recorded_study_and_names_the_command_when_stale(course, capsys):
    course.FINGERPRINTS.write_text(json.dumps({"toy": {
        "fingerprint": course.fingerprint(course.STUDIES / "toy.py", "2.13.0"),
        "records": {"rec.json": "0"}}}))
    (course.ROOT / "rec.json").write_text("{}")
    with pytest.raises(SystemExit, match="python3 course.py studies toy"):
        course.studies(["--check"])                         # the record is not the file it wrote
    assert "rec.json is not the file it wrote" in capsys.readouterr().out
    entry = json.loads(course.FINGERPRINTS.read_text())
    entry["toy"]["records"]["rec.json"] = course.sha256(course.ROOT / "rec.json")
    course.FINGERPRINTS.write_text(json.dumps(entry))
    course.studies(["--check"])
    assert "ok    toy" in capsys.readouterr().out
    (course.ROOT / "attn_helpers" / "lessons" / "toy.py").write_text("from ..core import f as g\n")
    with pytest.raises(SystemExit, match="python3 course.py studies toy"):
        course.studies(["--check"])
