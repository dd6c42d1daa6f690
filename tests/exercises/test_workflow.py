"""The exercise workflow (``exercises.workflow``): registration, stubs, hints on demand, progress."""

from __future__ import annotations

import pytest
import torch

from attn_helpers import exercises
from attn_helpers.exercises import workflow
from attn_helpers.exercises.core import check_function


def reference(x):
    return x * 2


def test_a_stub_is_reported_as_not_implemented_and_nothing_more():
    def stub(x):
        raise NotImplementedError

    result = check_function(stub, reference, [{"x": torch.ones(3)}], what="double")
    assert not result and result.message == "double is not implemented yet."
    result = check_function(lambda x: None, reference, [{"x": torch.ones(3)}], what="double")
    assert not result and "not implemented yet" in result.message and "Hint" not in result.message


def test_registered_checker_records_progress_and_gives_hints(capsys):
    @workflow.exercise("start_here.test_double", "double a tensor",
                       hints=("think", "y = 2 x", "return x * 2"))
    def check_double(fn):
        return check_function(fn, reference, [{"x": torch.ones(3)}], what="double")

    try:
        assert workflow.progress(show=False)["start_here"]["start_here.test_double"] is None
        assert not check_double(lambda x: x)
        assert workflow.progress(show=False)["start_here"]["start_here.test_double"] is False
        assert check_double(lambda x: x + x)
        table = workflow.progress()
        assert table["start_here"]["start_here.test_double"] is True
        assert "double a tensor" in capsys.readouterr().out
        for level, text in ((1, "think"), (2, "y = 2 x"), (3, "return x * 2")):
            exercises.hint("start_here.test_double", level)
            out = capsys.readouterr().out
            assert f"Hint {level} of 3" in out and text in out
    finally:
        workflow.EXERCISES.pop("start_here.test_double", None)
        workflow._RESULTS.pop("start_here.test_double", None)


def test_bad_keys_and_levels_are_refused():
    with pytest.raises(ValueError, match="level must be 1, 2 or 3"):
        exercises.hint("start_here.anything", 4)
    with pytest.raises(TypeError, match="key must be a string"):
        exercises.hint(3)
    with pytest.raises(ValueError, match="no exercise 'start_here.nothing'"):
        exercises.hint("start_here.nothing")
    with pytest.raises(ValueError, match="slug of the course"):
        workflow.exercise("no_such_notebook.x", "x", hints=("a", "b", "c"))
    with pytest.raises(ValueError, match="three non-empty hints"):
        workflow.exercise("masking.x", "x", hints=("a", "b"))
