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


def _register_double():
    @workflow.exercise("start_here.test_double", "double a tensor",
                       hints=("think", "y = 2 x", "return x * 2"))
    def check_double(fn):
        return check_function(fn, reference, [{"x": torch.ones(3)}], what="double")

    return check_double


def _unregister_double():
    workflow.EXERCISES.pop("start_here.test_double", None)
    workflow._RESULTS.pop("start_here.test_double", None)


def _state():
    return workflow.progress("start_here", show=False)["start_here"]["start_here.test_double"]


def test_a_reference_solution_never_counts_as_the_learners_pass():
    check_double = _register_double()
    try:
        result = check_double(lambda x: x + x, solution=True)
        assert result and "does not count as your pass" in result.message
        assert _state() is None
        assert not workflow.progress_file().exists()
        with pytest.raises(AssertionError, match="reference solution of start_here.test_double fails"):
            check_double(lambda x: x, solution=True)
        with pytest.raises(TypeError, match="solution must be True or False"):
            check_double(lambda x: x + x, solution="yes")
    finally:
        _unregister_double()


def test_a_pass_is_kept_across_kernels_in_the_progress_file_and_can_be_reset(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_COURSE_PROGRESS_DIR", str(tmp_path / "p"))
    check_double = _register_double()
    try:
        assert not check_double(lambda x: x)                       # a failure is not written
        assert not workflow.progress_file().exists()
        assert check_double(lambda x: x + x)
        assert workflow.progress_file() == tmp_path / "p" / "progress.json"
        workflow._RESULTS.clear()                                    # a new kernel, another notebook
        assert _state() is True
        workflow.progress_file().write_text("not json")              # a damaged file reads as empty
        assert _state() is None
        assert check_double(lambda x: x + x)
        assert workflow.reset_progress() == tmp_path / "p" / "progress.json"
        assert not workflow.progress_file().exists()
        assert _state() is None
    finally:
        _unregister_double()


def test_progress_of_one_notebook_and_a_bad_slug(capsys):
    table = workflow.progress("masking")
    assert list(table) == ["masking"] and all(v is None for v in table["masking"].values())
    out = capsys.readouterr().out
    assert out.startswith("05 masking: 0 of ") and "01 rnn" not in out
    with pytest.raises(ValueError, match="slug must be one of"):
        workflow.progress("no_such_notebook")


def test_the_progress_file_lives_in_the_user_data_directory_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTN_COURSE_PROGRESS_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setattr(workflow.sys, "platform", "linux")
    assert workflow.progress_file() == tmp_path / "attention-step-by-step" / "progress.json"
    repo = __import__("pathlib").Path(__file__).resolve().parents[2]
    assert repo not in workflow.progress_file().parents


def test_the_progress_command_prints_and_resets(tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, ATTN_COURSE_PROGRESS_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "attn_helpers", "progress"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert str(tmp_path / "progress.json") in out and "00 start_here: 0 of" in out
    (tmp_path / "progress.json").write_text('{"passed": {"masking.window_mask": "2026-01-01"}}')
    out = subprocess.run([sys.executable, "-m", "attn_helpers", "progress"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert "05 masking: 1 of" in out
    out = subprocess.run([sys.executable, "-m", "attn_helpers", "progress", "--reset"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert "progress reset" in out and not (tmp_path / "progress.json").exists()


def test_the_latest_verdict_wins_a_failure_after_a_saved_pass_removes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTN_COURSE_PROGRESS_DIR", str(tmp_path / "p"))
    check_double = _register_double()

    def stub(x):
        raise NotImplementedError

    try:
        assert check_double(lambda x: x + x)
        workflow._RESULTS.clear()                                    # a new kernel: the saved pass
        assert _state() is True
        assert not check_double(stub)                                # Run All on the stub
        assert _state() is False
        workflow._RESULTS.clear()                                    # and the file says so too
        assert _state() is None and "start_here.test_double" not in workflow._read_passes()
        assert check_double(lambda x: x + x)
        assert check_double(lambda x: x + x, solution=True)          # never touches the record
        assert not check_double(lambda x: x)
        assert check_double(lambda x: x + x, solution=True)
        assert _state() is False
    finally:
        _unregister_double()


def test_a_list_of_outputs_counts_as_the_tuple_the_reference_returns():
    """Review 7: returning [dW_Q, dW_K] was refused as "1 value(s); expected 2"."""
    from attn_helpers.exercises.core import check_function

    def reference(x):
        return x * 2, x + 1

    cases = [{"x": torch.arange(3.0)}]
    assert check_function(lambda x: [x * 2, x + 1], reference, cases)
    assert not check_function(lambda x: [x * 2, x + 2], reference, cases)
    one = check_function(lambda x: [x * 2], lambda x: x * 2, cases)
    assert not one            # a list where one tensor is expected is still not that tensor


def test_every_notebook_registers_its_exercises_in_its_order_with_three_hints():
    from attn_helpers.course_map import COURSE

    by_notebook = {lesson.slug: [k for k in exercises.EXERCISES if k.startswith(lesson.slug + ".")]
                   for lesson in COURSE}
    assert by_notebook["masking"] == ["masking.window_mask", "masking.rolling_cache_step"]
    assert by_notebook["build_gpt"] == [f"build_gpt.{k}" for k in
                                        ("attention", "block", "model", "train_step", "generate")]
    assert sum(map(len, by_notebook.values())) == len(exercises.EXERCISES) == 28
    assert all(len(ex.hints) == 3 for ex in exercises.EXERCISES.values())
